package approvaltest

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
)

// Auditor is an in-memory audit stream (approval.Auditor): each record is
// redacted and chained as the store's stream does it (approval.Redact,
// approval.ChainHash), and kept. It is safe for concurrent use.
type Auditor struct {
	now func() time.Time

	mu      sync.Mutex // guards entries
	entries []approval.Entry
}

var _ approval.Auditor = (*Auditor)(nil)

// NewAuditor returns an empty stream on the clock now (time.Now when nil).
func NewAuditor(now func() time.Time) *Auditor {
	if now == nil {
		now = time.Now
	}
	return &Auditor{now: now}
}

// Append adds r to the stream and returns the entry as kept. A record
// without an event is refused, as the store refuses it.
func (a *Auditor) Append(_ context.Context, r approval.Record) (approval.Entry, error) {
	if r.Event == "" {
		return approval.Entry{}, errors.New("audit append: record has no event")
	}
	e := approval.Entry{Event: r.Event, RequestID: r.RequestID, RunID: r.RunID, Actor: r.Actor, Tool: r.Tool,
		Data: approval.BoundData(approval.Redact(r.Data, r.Secret)), TraceID: r.TraceID, Time: a.now().Round(0).UTC()}
	a.mu.Lock()
	defer a.mu.Unlock()
	e.Seq = int64(len(a.entries)) + 1
	if n := len(a.entries); n > 0 {
		e.PrevHash = a.entries[n-1].Hash
	}
	e.Hash = approval.ChainHash(e.PrevHash, e)
	a.entries = append(a.entries, e)
	return e, nil
}

// Entries returns every entry so far, oldest first.
func (a *Auditor) Entries() []approval.Entry {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.entries)
}

// Events returns the events of the entries about request id, oldest first.
func (a *Auditor) Events(id string) []approval.Event {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []approval.Event
	for _, e := range a.entries {
		if e.RequestID == id {
			out = append(out, e.Event)
		}
	}
	return out
}
