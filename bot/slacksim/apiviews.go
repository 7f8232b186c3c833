package slacksim

import (
	"encoding/json"
	"fmt"
	"time"
)

// parseViewLocked decodes and validates the view parameter.
func (w *Workspace) parseViewLocked(raw string) (map[string]any, result) {
	var def map[string]any
	if raw == "" {
		return nil, fail("invalid_arguments", "[ERROR] missing required field: view")
	}
	if err := json.Unmarshal([]byte(raw), &def); err != nil || def == nil {
		return nil, fail("invalid_arguments", "[ERROR] view must be a JSON object")
	}
	if msgs := validateView(def); len(msgs) > 0 {
		return nil, fail("invalid_arguments", msgs...)
	}
	blocks, _ := def["blocks"].([]any)
	ensureIDs(blocks, func(prefix string) string { return w.newIDLocked(prefix) })
	return def, nil
}

// useTriggerLocked consumes a trigger_id, answering Slack's error if it is
// unknown, already used or older than 3 seconds.
func (w *Workspace) useTriggerLocked(id string) (string, result) {
	t, found := w.triggers[id]
	switch {
	case id == "" || !found:
		return "", fail("invalid_trigger_id")
	case t.used:
		return "", fail("exchanged_trigger_id")
	case w.now().Sub(t.issued) > triggerTTL:
		return "", fail("expired_trigger_id")
	}
	t.used = true
	return t.user, nil
}

// triggerTTL is how long a trigger_id may be exchanged after issue.
const triggerTTL = 3 * time.Second

// newTriggerLocked issues a trigger_id for user.
func (w *Workspace) newTriggerLocked(user string) string {
	w.seq++
	id := fmt.Sprintf("%d.%s.%012x", w.seq, TeamID, uint64(w.seq)*0x9E3779B97F4A7C15>>16)
	w.triggers[id] = &trigger{user: user, issued: w.now()}
	return id
}

func viewsOpen(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	if def["type"] != "modal" {
		return fail("invalid_arguments", "[ERROR] views.open requires a modal [json-pointer:/view/type]"), nil
	}
	user, errRes := w.useTriggerLocked(p["trigger_id"])
	if errRes != nil {
		return errRes, nil
	}
	if len(w.stacks[user]) > 0 { // a new modal replaces whatever was open
		delete(w.stacks, user)
	}
	v := w.newViewLocked(user, def)
	v.rootID = v.id
	w.stacks[user] = []string{v.id}
	return ok(result{"view": v.json(initialValues(v.blocks()))}), nil
}

func viewsPush(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	user, errRes := w.useTriggerLocked(p["trigger_id"])
	if errRes != nil {
		return errRes, nil
	}
	stack := w.stacks[user]
	if len(stack) == 0 {
		return fail("not_found", "[ERROR] no modal is open to push onto"), nil
	}
	if len(stack) >= 3 {
		return fail("push_limit_reached"), nil
	}
	v := w.newViewLocked(user, def)
	v.rootID = stack[0]
	v.prevID = stack[len(stack)-1]
	w.stacks[user] = append(stack, v.id)
	return ok(result{"view": v.json(initialValues(v.blocks()))}), nil
}

func viewsUpdate(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	v := w.findViewLocked(p["view_id"], p["external_id"])
	if v == nil || !w.isOpenLocked(v) {
		return fail("not_found"), nil
	}
	if h := p["hash"]; h != "" && h != v.hash {
		return fail("hash_conflict"), nil
	}
	if t, _ := def["type"].(string); t != v.kind {
		return fail("invalid_arguments", "[ERROR] view type cannot change [json-pointer:/view/type]"), nil
	}
	w.replaceViewLocked(v, def)
	return ok(result{"view": v.json(initialValues(v.blocks()))}), nil
}

func (w *Workspace) replaceViewLocked(v *viewState, def map[string]any) {
	v.def = def
	if ext, _ := def["external_id"].(string); ext != "" {
		v.externalID = ext
	}
	v.hash = w.newHashLocked()
	v.errors = nil
}

func viewsPublish(w *Workspace, p params, _ string) (result, func()) {
	def, errRes := w.parseViewLocked(p["view"])
	if errRes != nil {
		return errRes, nil
	}
	if def["type"] != "home" {
		return fail("invalid_arguments", "[ERROR] views.publish requires a home view [json-pointer:/view/type]"), nil
	}
	user := p["user_id"]
	if _, found := w.users[user]; !found {
		return fail("user_not_found"), nil
	}
	if id, found := w.homes[user]; found {
		v := w.views[id]
		if h := p["hash"]; h != "" && h != v.hash {
			return fail("hash_conflict"), nil
		}
		w.replaceViewLocked(v, def)
		return ok(result{"view": v.json(nil)}), nil
	}
	v := w.newViewLocked(user, def)
	v.rootID = v.id
	w.homes[user] = v.id
	return ok(result{"view": v.json(nil)}), nil
}
