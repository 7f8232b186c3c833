// Package approvaltest holds the doubles of the ports the approval domain
// declares, for domain tests where Redis is not the point, in the spirit
// of benbjohnson/wtf's mock package: the request records (approval.Records)
// and the audit stream (approval.Auditor) are the real store.Store and
// store.Audit on an embedded Redis (miniredis, which runs the store's Lua),
// so a test of the lifecycle runs the one state machine production runs —
// there is no copy of a transition here to keep in step; the card writer
// (approval.Cards) and the directory (approval.Directory) are small
// in-memory fakes of Slack.
package approvaltest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// Records is the store (store.Store) on the embedded Redis, with the
// looks under it that the domain's tests need (Claimant, Woken) and a
// simulated loss (Forget). Every method of the store is the store's own:
// a change to a transition, or a new one, needs no edit here.
type Records struct {
	*store.Store
}

// NewRecords returns empty records on the clock now (time.Now when nil):
// the store's clock, which stamps what the store stamps (Created, a
// cancel, a decision without a time, a claim, a grant's expiry). Each
// call has a key prefix of its own on the process's embedded Redis.
func NewRecords(now func() time.Time) *Records {
	return &Records{Store: store.New(embedded(), store.Options{Prefix: unique("approvaltest"), Now: now})}
}

// Forget drops request id and everything kept about it, as Redis losing
// its data (a restart without persistence) does: from then on it is
// approval.ErrNotFound to every method (store.ForgetRequest).
func (s *Records) Forget(id string) {
	if err := store.ForgetRequest(context.Background(), s.Store, id); err != nil {
		panic(fmt.Sprintf("approvaltest: %v", err))
	}
}

// Claimant returns who claimed request id's execution ("" when nobody,
// or when there is no such request).
func (s *Records) Claimant(id string) string {
	owner, _, err := s.Store.Claimant(context.Background(), id)
	if err != nil {
		return ""
	}
	return owner
}

// Woken returns the wake-ups pushed for request id, oldest first, as the
// store's wake list holds them (store.WakeUps): nobody waits here, so
// none is taken.
func (s *Records) Woken(id string) []approval.Status {
	st, err := store.WakeUps(context.Background(), s.Store, id)
	if err != nil {
		panic(fmt.Sprintf("approvaltest: %v", err))
	}
	return st
}

// The process's embedded Redis, started on first use and shared by every
// Records and Auditor (each on keys of its own): one server instead of
// one per test, none left running per test. It lives until the test
// binary exits.
var (
	embedOnce   sync.Once
	embedClient store.Client
)

// embedded returns the client of the process's embedded Redis. A Redis
// that cannot start leaves no test to run: it panics, saying why.
func embedded() store.Client {
	embedOnce.Do(func() {
		e, err := store.StartEmbedded()
		if err != nil {
			panic(fmt.Sprintf("approvaltest: %v", err))
		}
		embedClient = e.Client()
	})
	return embedClient
}

// unique returns name with a random suffix: a key prefix or stream no
// other Records or Auditor of the process uses.
func unique(name string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return name + ":" + hex.EncodeToString(b[:])
}
