package slacksim

import (
	"encoding/json"
	"fmt"
	"maps"
)

// viewState is a stored modal or home view. Guarded by Workspace.mu.
type viewState struct {
	id         string
	user       string
	kind       string // "modal" or "home"
	hash       string
	rootID     string
	prevID     string
	externalID string
	def        map[string]any    // the view object as the app sent it
	errors     map[string]string // field errors from the last response_action
}

// text returns the text of a text object field of the definition.
func (v *viewState) text(field string) string {
	obj, _ := v.def[field].(map[string]any)
	s, _ := obj["text"].(string)
	return s
}

func (v *viewState) str(field string) string {
	s, _ := v.def[field].(string)
	return s
}

func (v *viewState) blocks() []any {
	b, _ := v.def["blocks"].([]any)
	return b
}

func (v *viewState) export() View {
	blocks, _ := json.Marshal(v.blocks())
	notify, _ := v.def["notify_on_close"].(bool)
	return View{
		ID:              v.id,
		User:            v.user,
		Type:            v.kind,
		CallbackID:      v.str("callback_id"),
		ExternalID:      v.externalID,
		PrivateMetadata: v.str("private_metadata"),
		Title:           v.text("title"),
		Submit:          v.text("submit"),
		Close:           v.text("close"),
		Hash:            v.hash,
		RootViewID:      v.rootID,
		PreviousViewID:  v.prevID,
		NotifyOnClose:   notify,
		Blocks:          blocks,
		Errors:          maps.Clone(v.errors),
	}
}

// json renders the view as Slack returns it from views.* and in payloads,
// with state.values filled from values (block_id -> action_id -> value).
func (v *viewState) json(values map[string]map[string]any) map[string]any {
	out := map[string]any{}
	maps.Copy(out, v.def)
	if values == nil {
		values = map[string]map[string]any{}
	}
	if _, ok := out["blocks"]; !ok {
		out["blocks"] = []any{}
	}
	out["id"] = v.id
	out["team_id"] = TeamID
	out["type"] = v.kind
	out["hash"] = v.hash
	out["app_id"] = AppID
	out["bot_id"] = BotID
	out["app_installed_team_id"] = TeamID
	out["external_id"] = v.externalID
	out["root_view_id"] = nilIfEmpty(v.rootID)
	out["previous_view_id"] = nilIfEmpty(v.prevID)
	for _, k := range []string{"private_metadata", "callback_id"} {
		if _, ok := out[k]; !ok {
			out[k] = ""
		}
	}
	out["state"] = map[string]any{"values": values}
	return out
}

func nilIfEmpty(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// newViewLocked stores a new view for user from the app's definition.
func (w *Workspace) newViewLocked(user string, def map[string]any) *viewState {
	kind, _ := def["type"].(string)
	ext, _ := def["external_id"].(string)
	v := &viewState{
		id:         w.newIDLocked("V"),
		user:       user,
		kind:       kind,
		externalID: ext,
		def:        def,
	}
	v.hash = w.newHashLocked()
	w.views[v.id] = v
	return v
}

func (w *Workspace) newHashLocked() string {
	w.seq++
	return fmt.Sprintf("%d.%08x", w.now().Unix(), w.seq*2654435761%(1<<32))
}

// findViewLocked returns a view by ID or external ID.
func (w *Workspace) findViewLocked(viewID, externalID string) *viewState {
	if viewID != "" {
		return w.views[viewID]
	}
	for _, v := range w.views {
		if externalID != "" && v.externalID == externalID {
			return v
		}
	}
	return nil
}

// isOpenLocked reports whether a modal is on its user's stack (or is a
// published home).
func (w *Workspace) isOpenLocked(v *viewState) bool {
	if v.kind == "home" {
		return w.homes[v.user] == v.id
	}
	for _, id := range w.stacks[v.user] {
		if id == v.id {
			return true
		}
	}
	return false
}

// closeFromLocked pops the stack of user from view id upwards (inclusive).
// It returns the closed views, top first.
func (w *Workspace) closeFromLocked(user, id string) []*viewState {
	stack := w.stacks[user]
	for i, sid := range stack {
		if sid == id {
			var closed []*viewState
			for j := len(stack) - 1; j >= i; j-- {
				closed = append(closed, w.views[stack[j]])
			}
			w.stacks[user] = stack[:i]
			if len(w.stacks[user]) == 0 {
				delete(w.stacks, user)
			}
			return closed
		}
	}
	return nil
}

// initialValues returns state values taken from the initial values of the
// view's input elements.
func initialValues(blocks []any) map[string]map[string]any {
	values := map[string]map[string]any{}
	for _, b := range blocks {
		block, _ := b.(map[string]any)
		if block["type"] != "input" {
			continue
		}
		el, _ := block["element"].(map[string]any)
		blockID, _ := block["block_id"].(string)
		actionID, _ := el["action_id"].(string)
		if blockID == "" || actionID == "" {
			continue
		}
		typ, _ := el["type"].(string)
		val := map[string]any{"type": typ}
		switch typ {
		case "static_select", "radio_buttons", "external_select":
			val["selected_option"] = el["initial_option"]
		case "checkboxes", "multi_static_select":
			opts := el["initial_options"]
			if opts == nil {
				opts = []any{}
			}
			val["selected_options"] = opts
		default:
			val["value"] = el["initial_value"]
		}
		if values[blockID] == nil {
			values[blockID] = map[string]any{}
		}
		values[blockID][actionID] = val
	}
	return values
}

// typedValue converts a value given by a test or the UI into Slack's
// state.values shape for element el. A map is taken as already shaped.
func typedValue(el map[string]any, given any) map[string]any {
	if m, ok := given.(map[string]any); ok {
		return m
	}
	typ, _ := el["type"].(string)
	val := map[string]any{"type": typ}
	switch typ {
	case "static_select", "radio_buttons":
		s := fmt.Sprint(given)
		val["selected_option"] = nil
		if opt := findOption(el, s); opt != nil {
			val["selected_option"] = opt
		}
	case "checkboxes", "multi_static_select":
		var picked []string
		switch g := given.(type) {
		case []string:
			picked = g
		case []any:
			for _, x := range g {
				picked = append(picked, fmt.Sprint(x))
			}
		case string:
			if g != "" {
				picked = []string{g}
			}
		}
		sel := []any{}
		for _, p := range picked {
			if opt := findOption(el, p); opt != nil {
				sel = append(sel, opt)
			}
		}
		val["selected_options"] = sel
	default: // plain_text_input, number_input, email_text_input, url_text_input
		if given == nil {
			val["value"] = nil
		} else {
			val["value"] = fmt.Sprint(given)
		}
	}
	return val
}

// findOption returns the option of a select/checkbox element whose value
// (or text) is s.
func findOption(el map[string]any, s string) map[string]any {
	var all []any
	if opts, ok := el["options"].([]any); ok {
		all = append(all, opts...)
	}
	if groups, ok := el["option_groups"].([]any); ok {
		for _, g := range groups {
			gm, _ := g.(map[string]any)
			if opts, ok := gm["options"].([]any); ok {
				all = append(all, opts...)
			}
		}
	}
	for _, o := range all {
		om, _ := o.(map[string]any)
		if om["value"] == s {
			return om
		}
	}
	for _, o := range all {
		om, _ := o.(map[string]any)
		if t, _ := om["text"].(map[string]any); t != nil && t["text"] == s {
			return om
		}
	}
	return nil
}

// inputElements returns block_id -> action_id -> element for the view's
// input blocks.
func inputElements(blocks []any) map[string]map[string]map[string]any {
	out := map[string]map[string]map[string]any{}
	for _, b := range blocks {
		block, _ := b.(map[string]any)
		if block["type"] != "input" {
			continue
		}
		el, _ := block["element"].(map[string]any)
		blockID, _ := block["block_id"].(string)
		actionID, _ := el["action_id"].(string)
		if out[blockID] == nil {
			out[blockID] = map[string]map[string]any{}
		}
		out[blockID][actionID] = el
	}
	return out
}

// ensureIDs gives input blocks and their elements generated IDs when the
// app left them out, as Slack does.
func ensureIDs(blocks []any, gen func(string) string) {
	for _, b := range blocks {
		block, _ := b.(map[string]any)
		if block == nil {
			continue
		}
		if s, _ := block["block_id"].(string); s == "" {
			block["block_id"] = gen("b")
		}
		if el, _ := block["element"].(map[string]any); el != nil {
			if s, _ := el["action_id"].(string); s == "" {
				el["action_id"] = gen("a")
			}
		}
		if acc, _ := block["accessory"].(map[string]any); acc != nil {
			if s, _ := acc["action_id"].(string); s == "" {
				acc["action_id"] = gen("a")
			}
		}
		if els, _ := block["elements"].([]any); els != nil && block["type"] == "actions" {
			for _, e := range els {
				if em, _ := e.(map[string]any); em != nil {
					if s, _ := em["action_id"].(string); s == "" {
						em["action_id"] = gen("a")
					}
				}
			}
		}
	}
}
