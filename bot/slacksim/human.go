package slacksim

import (
	"encoding/json"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// responseTarget is where a response_url posts: the message (or
// ephemeral) an interaction came from, or the channel of a slash command.
type responseTarget struct {
	channel   string
	messageTS string
	user      string
	ephemeral bool
	created   time.Time
	uses      int
}

// response_url limits, as Slack documents them.
const (
	responseURLUses = 5
	responseURLLife = 30 * time.Minute
)

func (w *Workspace) userRefLocked(id string) map[string]any {
	u := w.users[id]
	return map[string]any{"id": id, "username": u.Name, "name": u.Name, "team_id": w.teamOfLocked(id)}
}

// teamOfLocked is the user's own team: TeamID unless they are another
// organisation's member.
func (w *Workspace) teamOfLocked(user string) string {
	if u, ok := w.users[user]; ok && u.TeamID != "" {
		return u.TeamID
	}
	return TeamID
}

// teamRefLocked is the "team" of a payload a user's action causes: their
// own team (an external member's payloads carry their organisation).
func (w *Workspace) teamRefLocked(user string) map[string]any {
	team := w.teamOfLocked(user)
	domain := "countersign-sim"
	if team != TeamID {
		domain = strings.ToLower(team)
	}
	return map[string]any{"id": team, "domain": domain}
}

// baseLocked is the base URL for links in payloads.
func (w *Workspace) baseLocked() string {
	if w.baseURL != "" {
		return w.baseURL
	}
	return "http://slacksim.invalid"
}

func (w *Workspace) newResponseURLLocked(t responseTarget) string {
	id := w.newIDLocked("R")
	t.created = w.now()
	w.responses[id] = t
	return w.baseLocked() + "/response/" + id
}

// PostMessage posts text as user into a channel (ID, or name without "#"),
// or into the thread under threadTS, and delivers the events Slack would:
// app_mention when the text contains <@BotUserID> in a channel the bot is
// in, message (channel_type "im") for a DM with the bot, and message events
// for other subscriptions. Write "<@"+BotUserID+">" to mention the bot.
func (w *Workspace) PostMessage(user, channelRef, text, threadTS string) (string, error) {
	w.mu.Lock()
	if _, ok := w.users[user]; !ok {
		w.mu.Unlock()
		return "", fmt.Errorf("post as %s: user: %w", user, ErrNotFound)
	}
	c := w.resolveChannelLocked(channelRef)
	if c == nil {
		w.mu.Unlock()
		return "", fmt.Errorf("post to %s: %w", channelRef, ErrNotFound)
	}
	if !c.isMember(user) {
		w.mu.Unlock()
		return "", fmt.Errorf("post to %s as %s: %w", channelRef, user, ErrNotInChannel)
	}
	if threadTS != "" {
		parent := w.findMessageLocked(c.ID, threadTS)
		if parent == nil || parent.VisibleTo != "" {
			w.mu.Unlock()
			return "", fmt.Errorf("post in thread %s: %w", threadTS, ErrNotFound)
		}
		if parent.ThreadTS != "" {
			threadTS = parent.ThreadTS
		}
	}
	m := w.storeMessageLocked(c, user, text, threadTS, nil, nil)
	after := w.messageEventsLocked(c, m)
	w.bumpLocked()
	w.mu.Unlock()
	if after != nil {
		after()
	}
	return m.TS, nil
}

// findActionElement returns the block_id and element with actionID in a
// blocks array (actions elements, section accessories, input elements).
func findActionElement(blocks []any, actionID string) (string, map[string]any) {
	for _, b := range blocks {
		block, _ := b.(map[string]any)
		blockID, _ := block["block_id"].(string)
		var els []any
		if e, ok := block["elements"].([]any); ok && block["type"] == "actions" {
			els = e
		}
		if acc, ok := block["accessory"].(map[string]any); ok {
			els = append(els, acc)
		}
		if el, ok := block["element"].(map[string]any); ok {
			els = append(els, el)
		}
		for _, e := range els {
			em, _ := e.(map[string]any)
			if em["action_id"] == actionID {
				return blockID, em
			}
		}
	}
	return "", nil
}

// actionBlock is what findMessageAction reads of a message's block: its
// id and the elements a person can press, nothing of its text.
type actionBlock struct {
	Type      string           `json:"type"`
	BlockID   string           `json:"block_id"`
	Elements  []map[string]any `json:"elements"`
	Accessory map[string]any   `json:"accessory"`
	Element   map[string]any   `json:"element"`
}

// findMessageAction is findActionElement on a message's blocks as posted.
// It decodes only the parts that can be pressed: a click decoded the whole
// card before, a twentieth of the click benchmark's CPU spent by the fake
// rather than by the app.
func findMessageAction(raw json.RawMessage, actionID string) (string, map[string]any) {
	var blocks []actionBlock
	_ = json.Unmarshal(raw, &blocks) // what decoded is searched, as Slack renders what it can
	for _, b := range blocks {
		var els []map[string]any
		if b.Type == "actions" {
			els = b.Elements
		}
		for _, e := range append(els, b.Accessory, b.Element) {
			if e != nil && e["action_id"] == actionID {
				return b.BlockID, e
			}
		}
	}
	return "", nil
}

// actionJSONLocked renders one entry of a block_actions payload's actions.
func (w *Workspace) actionJSONLocked(blockID string, el map[string]any, value string) map[string]any {
	typ, _ := el["type"].(string)
	a := map[string]any{
		"action_id": el["action_id"],
		"block_id":  blockID,
		"type":      typ,
		"action_ts": w.nextTSLocked(),
	}
	switch typ {
	case "button":
		a["text"] = el["text"]
		if v, ok := el["value"]; ok {
			a["value"] = v
		}
		if s, ok := el["style"]; ok {
			a["style"] = s
		}
	case "static_select", "overflow", "radio_buttons":
		if opt := findOption(el, value); opt != nil {
			a["selected_option"] = opt
		}
	default:
		a["value"] = value
	}
	return a
}

// Click presses the button (or other element) with actionID in a message
// (or in an ephemeral message shown to user) and delivers a block_actions
// payload with a fresh trigger_id. It reports ErrNotFound when there is no
// such message or element and ErrNotInChannel when user cannot see it (a
// private channel or DM they are not in; anyone sees a public channel).
func (w *Workspace) Click(user, channelRef, messageTS, actionID string) error {
	return w.Choose(user, channelRef, messageTS, actionID, "")
}

// Choose is Click for elements that carry a choice: for a static_select or
// overflow, value picks the option by value.
func (w *Workspace) Choose(user, channelRef, messageTS, actionID, value string) error {
	w.mu.Lock()
	b, err := w.clickLocked(user, channelRef, messageTS, actionID, value)
	w.mu.Unlock()
	if err != nil {
		return err
	}
	return w.deliverClick(b)
}

// ClickTogether is several users pressing the same element of the same
// message at once: every click is made on the message as it is now, before
// any of them is delivered, as when two people have the same card open.
// (Clicks made one after the other may find the element already gone:
// the app may redraw the message in between.)
func (w *Workspace) ClickTogether(users []string, channelRef, messageTS, actionID string) error {
	w.mu.Lock()
	payloads := make([][]byte, 0, len(users))
	for _, u := range users {
		b, err := w.clickLocked(u, channelRef, messageTS, actionID, "")
		if err != nil {
			w.mu.Unlock()
			return err
		}
		payloads = append(payloads, b)
	}
	w.mu.Unlock()
	for _, b := range payloads {
		if err := w.deliverClick(b); err != nil {
			return err
		}
	}
	return nil
}

// deliverClick delivers a block_actions payload made by clickLocked.
func (w *Workspace) deliverClick(b []byte) error {
	if w.deliver(kindInteractive, "", b, false, nil) == nil {
		return ErrClosed
	}
	return nil
}

// clickLocked is the block_actions payload of user pressing actionID (with
// value) in a message. w.mu is held.
func (w *Workspace) clickLocked(user, channelRef, messageTS, actionID, value string) ([]byte, error) {
	if _, ok := w.users[user]; !ok {
		return nil, fmt.Errorf("click as %s: %w", user, ErrNotFound)
	}
	c := w.resolveChannelLocked(channelRef)
	if c == nil {
		return nil, fmt.Errorf("click in %s: %w", channelRef, ErrNotFound)
	}
	m := w.findMessageLocked(c.ID, messageTS)
	if m == nil || (m.VisibleTo != "" && m.VisibleTo != user) {
		return nil, fmt.Errorf("click message %s: %w", messageTS, ErrNotFound)
	}
	if !c.isMember(user) && (c.IsPrivate || c.IsIM) {
		// A public channel is open to everyone in the workspace, member
		// or not (Slack's preview of a channel one has not joined).
		return nil, fmt.Errorf("click in %s as %s: %w", channelRef, user, ErrNotInChannel)
	}
	blockID, el := findMessageAction(m.Blocks, actionID)
	if el == nil {
		return nil, fmt.Errorf("click %s: %w", actionID, ErrNotFound)
	}
	ephemeral := m.VisibleTo != ""
	container := map[string]any{"type": "message", "message_ts": m.TS, "channel_id": c.ID, "is_ephemeral": ephemeral}
	if m.ThreadTS != "" {
		container["thread_ts"] = m.ThreadTS
	}
	chName := c.Name
	if c.IsIM {
		chName = "directmessage"
	}
	payload := map[string]any{
		"type":                  "block_actions",
		"user":                  w.userRefLocked(user),
		"api_app_id":            AppID,
		"token":                 verificationToken,
		"container":             container,
		"trigger_id":            w.newTriggerLocked(user),
		"team":                  w.teamRefLocked(user),
		"is_enterprise_install": false,
		"channel":               map[string]any{"id": c.ID, "name": chName},
		"state":                 map[string]any{"values": map[string]any{}},
		"response_url":          w.newResponseURLLocked(responseTarget{channel: c.ID, messageTS: m.TS, user: user, ephemeral: ephemeral}),
		"actions":               []any{w.actionJSONLocked(blockID, el, value)},
	}
	if !ephemeral {
		payload["message"] = w.messageJSONLocked(m)
	}
	b, _ := json.Marshal(payload)
	w.bumpLocked()
	return b, nil
}

// ClickView presses the element with actionID in a view (an open modal of
// user or their App Home) and delivers a block_actions payload with
// container type "view".
func (w *Workspace) ClickView(user, viewID, actionID string) error {
	w.mu.Lock()
	v, ok := w.views[viewID]
	if !ok || v.user != user || !w.isOpenLocked(v) {
		w.mu.Unlock()
		return fmt.Errorf("click in view %s: %w", viewID, ErrNotFound)
	}
	blockID, el := findActionElement(v.blocks(), actionID)
	if el == nil {
		w.mu.Unlock()
		return fmt.Errorf("click %s: %w", actionID, ErrNotFound)
	}
	payload := map[string]any{
		"type":                  "block_actions",
		"user":                  w.userRefLocked(user),
		"api_app_id":            AppID,
		"token":                 verificationToken,
		"container":             map[string]any{"type": "view", "view_id": v.id},
		"trigger_id":            w.newTriggerLocked(user),
		"team":                  w.teamRefLocked(user),
		"is_enterprise_install": false,
		"view":                  v.json(initialValues(v.blocks())),
		"actions":               []any{w.actionJSONLocked(blockID, el, "")},
	}
	b, _ := json.Marshal(payload)
	w.bumpLocked()
	w.mu.Unlock()
	if w.deliver(kindInteractive, "", b, false, nil) == nil {
		return ErrClosed
	}
	return nil
}

// requiredMessage is what Slack's client shows under an empty required input.
const requiredMessage = "Please complete this required field."

// SubmitView submits user's open modal viewID with values keyed
// block_id → action_id. A value may be a string (plain_text_input,
// number_input, email_text_input, url_text_input; for static_select the
// option's value), a []string of option values (checkboxes), or a map
// already in Slack's state shape. Inputs not given keep their initial
// value. Like Slack's client, an empty required input is refused locally
// with an "errors" result and nothing is delivered. Otherwise a
// view_submission is delivered and SubmitView waits (up to
// Options.AckTimeout) for the app's answer and applies it: errors are
// shown on the view, update/push/clear change the stack, and an empty
// answer closes the view.
func (w *Workspace) SubmitView(user, viewID string, values map[string]map[string]any) (ViewSubmitResult, error) {
	w.mu.Lock()
	v, ok := w.views[viewID]
	if !ok || v.user != user || v.kind != "modal" || !w.isOpenLocked(v) {
		w.mu.Unlock()
		return ViewSubmitResult{}, fmt.Errorf("submit view %s: %w", viewID, ErrNotFound)
	}
	state := initialValues(v.blocks())
	els := inputElements(v.blocks())
	for blockID, acts := range values {
		for actionID, given := range acts {
			if els[blockID][actionID] == nil {
				w.mu.Unlock()
				return ViewSubmitResult{}, fmt.Errorf("submit view %s: no input %s/%s: %w", viewID, blockID, actionID, ErrNotFound)
			}
			if state[blockID] == nil {
				state[blockID] = map[string]any{}
			}
			state[blockID][actionID] = typedValue(els[blockID][actionID], given)
		}
	}
	if missing := clientErrors(v.blocks(), state); len(missing) > 0 {
		v.errors = missing
		w.bumpLocked()
		w.mu.Unlock()
		return ViewSubmitResult{ResponseAction: "errors", Errors: missing}, nil
	}
	payload := map[string]any{
		"type":                  "view_submission",
		"team":                  w.teamRefLocked(user),
		"user":                  w.userRefLocked(user),
		"api_app_id":            AppID,
		"token":                 verificationToken,
		"trigger_id":            w.newTriggerLocked(user),
		"view":                  v.json(state),
		"response_urls":         []any{},
		"is_enterprise_install": false,
	}
	b, _ := json.Marshal(payload)
	w.mu.Unlock()

	ack, err := w.waitAck(w.deliver(kindInteractive, "", b, true, nil))
	if err != nil {
		return ViewSubmitResult{}, fmt.Errorf("submit view %s: %w", viewID, err)
	}
	return w.applyViewResponse(v, ack)
}

// clientErrors returns block_id → message for what Slack's client refuses
// before anything is sent: required inputs left empty, numbers that are not
// numbers or out of range, and malformed email addresses.
func clientErrors(blocks []any, state map[string]map[string]any) map[string]string {
	out := map[string]string{}
	for _, b := range blocks {
		block, _ := b.(map[string]any)
		if block["type"] != "input" {
			continue
		}
		el, _ := block["element"].(map[string]any)
		blockID, _ := block["block_id"].(string)
		actionID, _ := el["action_id"].(string)
		val := state[blockID][actionID]
		vm, _ := val.(map[string]any)
		empty := true
		switch {
		case vm == nil:
		case vm["value"] != nil && vm["value"] != "":
			empty = false
		case vm["selected_option"] != nil:
			empty = false
		default:
			if sel, ok := vm["selected_options"].([]any); ok && len(sel) > 0 {
				empty = false
			}
		}
		if empty {
			if block["optional"] != true {
				out[blockID] = requiredMessage
			}
			continue
		}
		s, _ := vm["value"].(string)
		switch el["type"] {
		case "number_input":
			if msg := checkNumber(el, s); msg != "" {
				out[blockID] = msg
			}
		case "email_text_input":
			if at := strings.Index(s, "@"); at < 1 || at == len(s)-1 || strings.ContainsAny(s, " \t") {
				out[blockID] = "Please enter a valid email address."
			}
		}
	}
	return out
}

// checkNumber validates a number_input value as Slack's client does.
func checkNumber(el map[string]any, s string) string {
	n, err := strconv.ParseFloat(s, 64)
	decimal, _ := el["is_decimal_allowed"].(bool)
	if err != nil || (!decimal && n != math.Trunc(n)) {
		if decimal {
			return "Please enter a number."
		}
		return "Please enter a whole number."
	}
	if lo, ok := el["min_value"].(string); ok {
		if minV, err := strconv.ParseFloat(lo, 64); err == nil && n < minV {
			return "Please enter a number greater than or equal to " + lo + "."
		}
	}
	if hi, ok := el["max_value"].(string); ok {
		if maxV, err := strconv.ParseFloat(hi, 64); err == nil && n > maxV {
			return "Please enter a number less than or equal to " + hi + "."
		}
	}
	return ""
}

// applyViewResponse applies the app's answer to a view_submission.
func (w *Workspace) applyViewResponse(v *viewState, ack json.RawMessage) (ViewSubmitResult, error) {
	var resp struct {
		ResponseAction string            `json:"response_action"`
		Errors         map[string]string `json:"errors"`
		View           json.RawMessage   `json:"view"`
	}
	if len(ack) > 0 {
		if err := json.Unmarshal(ack, &resp); err != nil {
			return ViewSubmitResult{}, fmt.Errorf("submit view %s: app answered invalid JSON: %w", v.id, err)
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	defer w.bumpLocked()
	res := ViewSubmitResult{ResponseAction: resp.ResponseAction}
	switch resp.ResponseAction {
	case "errors":
		inputs := inputElements(v.blocks())
		for blockID := range resp.Errors {
			if _, isInput := inputs[blockID]; !isInput {
				// Slack's client shows a generic failure in this case.
				return res, fmt.Errorf("submit view %s: response_action errors names %q, which is not an input block", v.id, blockID)
			}
		}
		v.errors = resp.Errors
		res.Errors = resp.Errors
	case "update", "push":
		def, errRes := w.parseViewLocked(string(resp.View))
		if errRes != nil {
			return res, fmt.Errorf("submit view %s: app answered %s with an invalid view: %v", v.id, resp.ResponseAction, errRes)
		}
		if resp.ResponseAction == "update" {
			w.replaceViewLocked(v, def)
			break
		}
		stack := w.stacks[v.user]
		if len(stack) >= 3 {
			return res, fmt.Errorf("submit view %s: push_limit_reached", v.id)
		}
		nv := w.newViewLocked(v.user, def)
		nv.rootID, nv.prevID = stack[0], stack[len(stack)-1]
		w.stacks[v.user] = append(stack, nv.id)
	case "clear":
		delete(w.stacks, v.user)
		res.Closed = true
	case "":
		w.closeFromLocked(v.user, v.id)
		res.Closed = true
	default:
		return res, fmt.Errorf("submit view %s: unknown response_action %q", v.id, resp.ResponseAction)
	}
	return res, nil
}

// CloseView closes user's modal viewID (and any view pushed above it), as
// the Cancel button does, and delivers view_closed if the view asked for
// notify_on_close.
func (w *Workspace) CloseView(user, viewID string) error {
	w.mu.Lock()
	v, ok := w.views[viewID]
	if !ok || v.user != user || !w.isOpenLocked(v) || v.kind != "modal" {
		w.mu.Unlock()
		return fmt.Errorf("close view %s: %w", viewID, ErrNotFound)
	}
	w.closeFromLocked(user, viewID)
	w.bumpLocked()
	notify, _ := v.def["notify_on_close"].(bool)
	if !notify {
		w.mu.Unlock()
		return nil
	}
	payload := map[string]any{
		"type":       "view_closed",
		"team":       w.teamRefLocked(user),
		"user":       w.userRefLocked(user),
		"api_app_id": AppID,
		"token":      verificationToken,
		"view":       v.json(initialValues(v.blocks())),
		"is_cleared": false,
	}
	b, _ := json.Marshal(payload)
	w.mu.Unlock()
	w.deliver(kindInteractive, "", b, false, nil)
	return nil
}

// SlashCommand runs command (for example "/countersign") with text as user
// in a channel. An immediate response from the app (the ack payload, or the
// HTTP response body) is shown to user as an ephemeral message, or posted
// by the bot when its response_type is "in_channel".
func (w *Workspace) SlashCommand(user, channelRef, command, text string) error {
	w.mu.Lock()
	u, ok := w.users[user]
	if !ok {
		w.mu.Unlock()
		return fmt.Errorf("slash command as %s: %w", user, ErrNotFound)
	}
	c := w.resolveChannelLocked(channelRef)
	if c == nil {
		w.mu.Unlock()
		return fmt.Errorf("slash command in %s: %w", channelRef, ErrNotFound)
	}
	target := responseTarget{channel: c.ID, user: user}
	payload := map[string]any{
		"token":                 verificationToken,
		"team_id":               w.teamOfLocked(user),
		"team_domain":           w.teamRefLocked(user)["domain"],
		"channel_id":            c.ID,
		"channel_name":          c.Name,
		"user_id":               user,
		"user_name":             u.Name,
		"command":               command,
		"text":                  text,
		"api_app_id":            AppID,
		"is_enterprise_install": "false",
		"response_url":          w.newResponseURLLocked(target),
		"trigger_id":            w.newTriggerLocked(user),
	}
	b, _ := json.Marshal(payload)
	w.mu.Unlock()
	d := w.deliver(kindSlash, "", b, true, func(ack json.RawMessage) {
		if len(ack) > 0 {
			_ = w.respond(target, ack)
		}
	})
	if d == nil {
		return ErrClosed
	}
	return nil
}

// OpenHome delivers app_home_opened for user's Home tab, carrying the
// published view if there is one.
func (w *Workspace) OpenHome(user string) {
	w.mu.Lock()
	if w.closed || !w.subscribed("app_home_opened") {
		w.mu.Unlock()
		return
	}
	ev := map[string]any{
		"type":     "app_home_opened",
		"user":     user,
		"channel":  w.dmLocked(user),
		"tab":      "home",
		"event_ts": w.nextTSLocked(),
	}
	if id, ok := w.homes[user]; ok {
		ev["view"] = w.views[id].json(nil)
	}
	b, id := w.eventCallbackLocked(ev)
	w.mu.Unlock()
	w.deliver(kindEvents, id, b, false, nil)
}

// serveResponseURL answers POSTs to a response_url.
func (w *Workspace) serveResponseURL(rw http.ResponseWriter, r *http.Request) {
	id := strings.TrimPrefix(r.URL.Path, "/response/")
	w.mu.Lock()
	t, ok := w.responses[id]
	var refused string
	switch {
	case !ok:
	case t.uses >= responseURLUses:
		refused = "used_url"
	case w.now().Sub(t.created) > responseURLLife:
		refused = "expired_url"
	default:
		t.uses++
		w.responses[id] = t
	}
	w.mu.Unlock()
	if !ok {
		http.Error(rw, "unknown response_url", http.StatusNotFound)
		return
	}
	if refused != "" {
		http.Error(rw, refused, http.StatusNotFound)
		return
	}
	var body json.RawMessage
	if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
		writeJSON(rw, http.StatusOK, fail("invalid_payload"))
		return
	}
	if err := w.respond(t, body); err != nil {
		writeJSON(rw, http.StatusOK, fail(err.Error()))
		return
	}
	writeJSON(rw, http.StatusOK, result{"ok": true})
}

// respond applies a response_url (or slash command) message.
func (w *Workspace) respond(t responseTarget, body json.RawMessage) error {
	var msg struct {
		Text            string          `json:"text"`
		Blocks          json.RawMessage `json:"blocks"`
		ResponseType    string          `json:"response_type"`
		ReplaceOriginal bool            `json:"replace_original"`
		DeleteOriginal  bool            `json:"delete_original"`
		ThreadTS        string          `json:"thread_ts"`
	}
	if err := json.Unmarshal(body, &msg); err != nil {
		return fmt.Errorf("invalid_payload")
	}
	logged := map[string]string{"text": msg.Text}
	if len(msg.Blocks) > 0 && string(msg.Blocks) != "null" {
		logged["blocks"] = string(msg.Blocks)
	}
	var after func()
	w.mu.Lock()
	w.calls.add(Call{Method: "response_url", Params: logged, At: w.now()})
	defer func() {
		w.bumpLocked()
		w.mu.Unlock()
		if after != nil {
			after()
		}
	}()
	c := w.channels[t.channel]
	if c == nil {
		return fmt.Errorf("channel_not_found")
	}
	_, blocks, errRes := w.parseBlocksLocked(logged["blocks"])
	if errRes != nil {
		return fmt.Errorf("invalid_blocks")
	}
	orig := w.findMessageLocked(t.channel, t.messageTS)
	switch {
	case msg.DeleteOriginal && orig != nil:
		c.remove(orig)
	case msg.ReplaceOriginal && orig != nil:
		orig.Text = msg.Text
		orig.Blocks = blocks
	case msg.ResponseType == "in_channel":
		m := w.storeMessageLocked(c, BotUserID, msg.Text, msg.ThreadTS, blocks, nil)
		after = w.messageEventsLocked(c, m)
	default:
		c.add(&Message{
			Channel: c.ID, TS: w.nextTSLocked(), ThreadTS: msg.ThreadTS, User: BotUserID, BotID: BotID,
			Text: msg.Text, Blocks: blocks, VisibleTo: t.user,
		}, true)
	}
	return nil
}

func deleteMessage(list []*Message, m *Message) []*Message {
	for i, x := range list {
		if x == m {
			return append(list[:i], list[i+1:]...)
		}
	}
	return list
}
