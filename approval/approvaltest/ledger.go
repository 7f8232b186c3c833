package approvaltest

import (
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// Ledger is the lifecycle's record over the doubles: the store's own
// (store.Ledger), so every transition writes its entry and wake-up as in
// production.
type Ledger = store.Ledger

// NewLedger returns the ledger of rec and audit: with an *Auditor of this
// package, entries ride with transitions on the embedded Redis as they
// do on a single Redis node; any other auditor gets them one at a time.
func NewLedger(rec *Records, audit approval.Auditor) *Ledger {
	if a, ok := audit.(*Auditor); ok {
		return store.NewLedger(rec.Store, a.Audit)
	}
	return store.NewLedger(rec.Store, audit)
}
