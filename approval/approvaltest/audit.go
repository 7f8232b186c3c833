package approvaltest

import (
	"context"
	"fmt"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// Auditor is the audit stream (store.Audit) on the embedded Redis: each
// record redacted, cut and chained by the store, with readers of the
// stream for the tests (Entries, Events). A lifecycle writes to it
// through a Ledger (NewLedger), which lets its entries ride with the
// store's transitions as production does.
type Auditor struct {
	*store.Audit
}

var _ approval.Auditor = (*Auditor)(nil)

// NewAuditor returns an empty stream on the clock now (time.Now when nil),
// which stamps each entry's time. Each call has a stream of its own.
func NewAuditor(now func() time.Time) *Auditor {
	return &Auditor{Audit: store.NewAudit(embedded(), store.AuditOptions{Stream: unique("approvaltest") + ":{audit}", Now: now})}
}

// Entries returns every entry so far, oldest first.
func (a *Auditor) Entries() []approval.Entry {
	var out []approval.Entry
	after := ""
	for {
		page, err := a.Range(context.Background(), after, 1000)
		if err != nil {
			panic(fmt.Sprintf("approvaltest: %v", err))
		}
		out = append(out, page...)
		if len(page) < 1000 {
			return out
		}
		after = page[len(page)-1].ID
	}
}

// Events returns the events of the entries about request id, oldest first.
func (a *Auditor) Events(id string) []approval.Event {
	var out []approval.Event
	for _, e := range a.Entries() {
		if e.RequestID == id {
			out = append(out, e.Event)
		}
	}
	return out
}
