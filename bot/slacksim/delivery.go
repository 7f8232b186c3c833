package slacksim

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Envelope kinds, as Socket Mode names them.
const (
	kindEvents      = "events_api"
	kindInteractive = "interactive"
	kindSlash       = "slash_commands"
)

// maxRetries is how often Slack retries an unacknowledged event.
const maxRetries = 3

// retryAfter is how long an event may stay unacknowledged before
// RetryUnacked redelivers it.
const retryAfter = 3 * time.Second

// verificationToken is the legacy token field carried in payloads.
const verificationToken = "simverificationtoken"

// Envelope is one delivery to the app (one per attempt), for inspection.
type Envelope struct {
	ID           string
	Type         string // "events_api", "interactive" or "slash_commands"
	EventID      string // events only
	RetryAttempt int
	Acked        bool
	// Payload is the JSON delivered: the event_callback for events, the
	// interaction payload, or the slash command fields.
	Payload json.RawMessage
	// AckPayload is what the app answered with, if anything.
	AckPayload json.RawMessage
}

// delivery is one logical event or interaction, delivered one or more
// times. Guarded by Workspace.mu.
type delivery struct {
	kind     string
	eventID  string
	payload  []byte
	attempts int // retries so far; 0 for the first delivery
	sentAt   time.Time
	acked    bool
	ack      json.RawMessage
	done     chan struct{} // closed on the first ack
	envIDs   []string
	onAck    func(json.RawMessage) // run without the lock after the first ack
	// acceptsResponse is Socket Mode's accepts_response_payload: true for
	// view submissions and slash commands, whose ack may carry an answer.
	acceptsResponse bool
	// failure is why the last HTTP attempt was not acked, used as
	// X-Slack-Retry-Reason ("http_error", "http_timeout", ...).
	failure string
}

// deliver records and sends a payload to the app. accepts marks payloads
// whose ack may carry an answer (view submissions). It returns nil once the
// workspace is closed.
func (w *Workspace) deliver(kind, eventID string, payload []byte, accepts bool, onAck func(json.RawMessage)) *delivery {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	d := &delivery{kind: kind, eventID: eventID, payload: payload, done: make(chan struct{}), onAck: onAck}
	d.acceptsResponse = kind == kindSlash || accepts
	if eventID != "" {
		w.events[eventID] = d
	}
	envID, attempt := w.attemptLocked(d)
	w.mu.Unlock()
	w.send(d, envID, attempt, "")
	return d
}

// attemptLocked registers a new envelope ID for d.
func (w *Workspace) attemptLocked(d *delivery) (string, int) {
	w.seq++
	envID := fmt.Sprintf("%08x-sim-%04x-%012d", w.seq, w.seq%0xffff, w.seq)
	d.envIDs = append(d.envIDs, envID)
	d.sentAt = w.now()
	w.deliveries[envID] = d
	w.bumpLocked()
	return envID, d.attempts
}

// send hands one attempt to the transport.
func (w *Workspace) send(d *delivery, envID string, attempt int, reason string) {
	if w.opts.Delivery == HTTP {
		w.mu.Lock()
		closed := w.closed
		if !closed {
			w.wg.Add(1)
		}
		w.mu.Unlock()
		if closed {
			return
		}
		go func() { // exits when the POST completes or times out
			defer w.wg.Done()
			w.postHTTP(d, envID, attempt, reason)
		}()
		return
	}
	env := map[string]any{
		"envelope_id":              envID,
		"type":                     d.kind,
		"payload":                  json.RawMessage(d.payload),
		"accepts_response_payload": d.acceptsResponse,
	}
	if attempt > 0 {
		env["retry_attempt"] = attempt
		env["retry_reason"] = reason
	}
	msg, _ := json.Marshal(env)
	w.hub.send(msg)
}

// ackEnvelope records the app's acknowledgement of an envelope.
func (w *Workspace) ackEnvelope(envID string, payload json.RawMessage) {
	w.mu.Lock()
	d, found := w.deliveries[envID]
	if !found || d.acked {
		w.mu.Unlock()
		return
	}
	d.acked = true
	if len(payload) > 0 && string(payload) != "null" {
		d.ack = payload
	}
	close(d.done)
	onAck, ack := d.onAck, d.ack
	w.bumpLocked()
	w.mu.Unlock()
	if onAck != nil {
		onAck(ack)
	}
}

// retryReasonLocked is the retry reason Slack would give for d.
func (w *Workspace) retryReasonLocked(d *delivery) string {
	if w.opts.Delivery == HTTP {
		if d.failure != "" {
			return d.failure
		}
		return "http_timeout"
	}
	return "timeout"
}

// failDelivery records why an HTTP attempt was not acked.
func (w *Workspace) failDelivery(d *delivery, reason string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	d.failure = reason
	w.bumpLocked()
}

// waitAck waits in real time (Options.AckTimeout) for d to be acked.
func (w *Workspace) waitAck(d *delivery) (json.RawMessage, error) {
	if d == nil {
		return nil, ErrClosed
	}
	t := time.NewTimer(w.opts.AckTimeout)
	defer t.Stop()
	select {
	case <-d.done:
		w.mu.Lock()
		defer w.mu.Unlock()
		return d.ack, nil
	case <-t.C:
		return nil, ErrNoAck
	}
}

// RetryUnacked redelivers every event that has gone unacknowledged for 3
// seconds or more by the injected clock, as Slack does, up to 3 retries,
// with retry_attempt (Socket Mode) or X-Slack-Retry-Num (HTTP) set. It
// returns how many events it redelivered. Call it after advancing the
// clock.
func (w *Workspace) RetryUnacked() int {
	type resend struct {
		d       *delivery
		envID   string
		attempt int
		reason  string
	}
	var todo []resend
	w.mu.Lock()
	now := w.now()
	seen := map[*delivery]bool{}
	for _, d := range w.deliveries {
		if seen[d] || d.acked || d.kind != kindEvents || d.attempts >= maxRetries || now.Sub(d.sentAt) < retryAfter {
			continue
		}
		seen[d] = true
		d.attempts++
		envID, attempt := w.attemptLocked(d)
		todo = append(todo, resend{d, envID, attempt, w.retryReasonLocked(d)})
	}
	w.mu.Unlock()
	for _, r := range todo {
		w.send(r.d, r.envID, r.attempt, r.reason)
	}
	return len(todo)
}

// RedeliverEvent delivers an event again, whether or not it was acked, as
// Slack's retries do: same event_id, retry_attempt / X-Slack-Retry-Num one
// higher. It reports ErrNotFound for an unknown event ID.
func (w *Workspace) RedeliverEvent(eventID string) error {
	w.mu.Lock()
	d, found := w.events[eventID]
	if !found {
		w.mu.Unlock()
		return fmt.Errorf("redeliver %s: %w", eventID, ErrNotFound)
	}
	d.attempts++
	envID, attempt := w.attemptLocked(d)
	reason := w.retryReasonLocked(d)
	w.mu.Unlock()
	w.send(d, envID, attempt, reason)
	return nil
}

// Envelopes returns every delivery attempt so far, oldest first.
func (w *Workspace) Envelopes() []Envelope {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Envelope
	for id, d := range w.deliveries {
		attempt := 0
		for i, e := range d.envIDs {
			if e == id {
				attempt = i
			}
		}
		out = append(out, Envelope{
			ID:           id,
			Type:         d.kind,
			EventID:      d.eventID,
			RetryAttempt: attempt,
			Acked:        d.acked,
			Payload:      append(json.RawMessage(nil), d.payload...),
			AckPayload:   append(json.RawMessage(nil), d.ack...),
		})
	}
	// IDs start with a zero-padded hex sequence number, so they sort in
	// delivery order.
	slices.SortFunc(out, func(a, b Envelope) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Events returns the inner events delivered so far (first attempts only),
// oldest first, decoded as generic JSON objects.
func (w *Workspace) Events() []map[string]any {
	var out []map[string]any
	for _, e := range w.Envelopes() {
		if e.Type != kindEvents || e.RetryAttempt > 0 {
			continue
		}
		var outer struct {
			Event map[string]any `json:"event"`
		}
		if json.Unmarshal(e.Payload, &outer) == nil {
			out = append(out, outer.Event)
		}
	}
	return out
}

// eventCallbackLocked wraps an inner event in Slack's event_callback
// envelope and returns it with its fresh event ID.
func (w *Workspace) eventCallbackLocked(event map[string]any) ([]byte, string) {
	id := w.newIDLocked("Ev0SIM")
	outer := map[string]any{
		"token":      verificationToken,
		"team_id":    TeamID,
		"api_app_id": AppID,
		"event":      event,
		"type":       "event_callback",
		"event_id":   id,
		"event_time": w.now().Unix(),
		"authorizations": []any{map[string]any{
			"enterprise_id": nil, "team_id": TeamID, "user_id": BotUserID,
			"is_bot": true, "is_enterprise_install": false,
		}},
		"is_ext_shared_channel": false,
		"event_context":         "4-sim-" + id,
	}
	b, _ := json.Marshal(outer)
	return b, id
}

type pendingEvent struct {
	payload []byte
	id      string
}

// messageEventsLocked builds the events a new message causes and returns a
// func that delivers them (to run without the lock).
func (w *Workspace) messageEventsLocked(c *channel, m *Message) func() {
	var evs []pendingEvent
	add := func(ev map[string]any) {
		b, id := w.eventCallbackLocked(ev)
		evs = append(evs, pendingEvent{b, id})
	}
	botIn := c.isMember(BotUserID)
	base := func(typ string) map[string]any {
		ev := w.messageJSONLocked(m)
		delete(ev, "reply_users")
		ev["type"] = typ
		ev["channel"] = c.ID
		ev["event_ts"] = m.TS
		return ev
	}
	switch {
	case c.IsIM && botIn && w.subscribed("message.im"):
		ev := base("message")
		ev["channel_type"] = "im"
		add(ev)
	case c.IsPrivate && !c.IsIM && botIn && w.subscribed("message.groups"):
		ev := base("message")
		ev["channel_type"] = "group"
		add(ev)
	case !c.IsPrivate && !c.IsIM && botIn && w.subscribed("message.channels"):
		ev := base("message")
		ev["channel_type"] = "channel"
		add(ev)
	}
	if !c.IsIM && botIn && m.User != BotUserID && strings.Contains(m.Text, "<@"+BotUserID+">") && w.subscribed("app_mention") {
		ev := base("app_mention")
		delete(ev, "bot_profile")
		add(ev)
	}
	if len(evs) == 0 {
		return nil
	}
	return func() {
		for _, e := range evs {
			w.deliver(kindEvents, e.id, e.payload, false, nil)
		}
	}
}

// messageChangedLocked builds the message_changed event Slack sends to
// message subscriptions when a message is edited, and returns a func that
// delivers it (nil when the app is not subscribed).
func (w *Workspace) messageChangedLocked(c *channel, m *Message, previous map[string]any) func() {
	sub := "message.channels"
	channelType := "channel"
	switch {
	case c.IsIM:
		sub, channelType = "message.im", "im"
	case c.IsPrivate:
		sub, channelType = "message.groups", "group"
	}
	if !c.isMember(BotUserID) || !w.subscribed(sub) {
		return nil
	}
	ts := w.nextTSLocked()
	current := w.messageJSONLocked(m)
	current["edited"] = map[string]any{"user": m.User, "ts": ts}
	b, id := w.eventCallbackLocked(map[string]any{
		"type":             "message",
		"subtype":          "message_changed",
		"hidden":           true,
		"channel":          c.ID,
		"channel_type":     channelType,
		"ts":               ts,
		"event_ts":         ts,
		"message":          current,
		"previous_message": previous,
	})
	return func() { w.deliver(kindEvents, id, b, false, nil) }
}
