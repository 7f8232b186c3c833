package auditreport

// This file: Slack user and channel ids shown as the names people know,
// in the text the commands print (the audit view shows the same names).

import (
	"bytes"
	"context"
	"encoding/json"
	"regexp"
	"strings"

	"github.com/countersign/countersign/approval"
)

// Names turns a Slack id into the name people read: a user's name, a
// channel's "#name"; *bot.Names provides it (users.info,
// conversations.info, cached). Name returns "" when it has no name for id
// (an unknown id, Slack not reachable): the id is shown instead.
type Names interface {
	Name(ctx context.Context, id string) string
}

// slackID is the shape of a Slack user id (U…, W… on Enterprise Grid)
// or conversation id (C… public, G… private, D… a DM): a capital letter,
// then capitals and digits, at least one a digit (CANCELLED is a word).
var slackID = regexp.MustCompile(`^[UWCGD][A-Z0-9]{6,}$`)

func isSlackID(s string) bool { return slackID.MatchString(s) && strings.ContainsAny(s, "0123456789") }

// Named is log as people read it: every Slack user and channel id in its
// entries — the actor and any id among the event's data (requester,
// approver, approvers, the channel a card was posted to…) — replaced by
// its name where n knows one. Only for text output: the entries are no
// longer the ones the chain hashed, and JSON output keeps ids for scripts.
func Named(log Log, n Names) Log {
	return &namedLog{Log: log, n: n, memo: map[string]string{}}
}

type namedLog struct {
	Log
	n    Names
	memo map[string]string // id → what is shown; one goroutine reads a command's entries
}

func (l *namedLog) Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error) {
	es, err := l.Log.Range(ctx, afterID, count)
	return l.all(ctx, es), err
}

func (l *namedLog) RevRange(ctx context.Context, beforeID string, count int64) ([]approval.Entry, error) {
	es, err := l.Log.RevRange(ctx, beforeID, count)
	return l.all(ctx, es), err
}

func (l *namedLog) Follow(ctx context.Context, afterID string, fn func(approval.Entry) error) error {
	return l.Log.Follow(ctx, afterID, func(e approval.Entry) error { return fn(l.entry(ctx, e)) })
}

func (l *namedLog) all(ctx context.Context, es []approval.Entry) []approval.Entry {
	for i := range es {
		es[i] = l.entry(ctx, es[i])
	}
	return es
}

// entry is e with its user ids named.
func (l *namedLog) entry(ctx context.Context, e approval.Entry) approval.Entry {
	e.Actor = l.name(ctx, e.Actor)
	if len(e.Data) == 0 {
		return e
	}
	dec := json.NewDecoder(bytes.NewReader(e.Data))
	dec.UseNumber() // numbers stay as written
	var v any
	if dec.Decode(&v) != nil {
		return e
	}
	if b, err := json.Marshal(l.walk(ctx, v)); err == nil {
		e.Data = b
	}
	return e
}

func (l *namedLog) walk(ctx context.Context, v any) any {
	switch x := v.(type) {
	case string:
		return l.name(ctx, x)
	case []any:
		for i := range x {
			x[i] = l.walk(ctx, x[i])
		}
	case map[string]any:
		for k := range x {
			x[k] = l.walk(ctx, x[k])
		}
	}
	return v
}

// name is what people call s when s is a Slack user or channel id with a
// known name, else s unchanged.
func (l *namedLog) name(ctx context.Context, s string) string {
	if !isSlackID(s) {
		return s
	}
	if shown, ok := l.memo[s]; ok {
		return shown
	}
	shown := s
	if n := l.n.Name(ctx, s); n != "" {
		shown = n
	}
	l.memo[s] = shown
	return shown
}
