package api_test

import (
	"crypto/sha256"
	"fmt"
	"runtime"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
)

// TestCallsWaitOnlyForTheirOwnID: while one call's creation holds its
// request id, another call goes on at once, even one whose id a lock per
// stripe of ids (as before) put on the same stripe; the same id waits
// until the first is done; nothing stays locked after.
func TestCallsWaitOnlyForTheirOwnID(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	s := h.server
	stripe := func(id string) byte { sum := sha256.Sum256([]byte(id)); return sum[0] % 64 }
	first := "req_first"
	other := ""
	for i := 0; other == ""; i++ {
		if id := fmt.Sprint("req_other", i); stripe(id) == stripe(first) {
			other = id
		}
	}

	unlock := api.LockID(s, first)
	done := make(chan struct{})
	go func() {
		api.LockID(s, other)()
		close(done)
	}()
	select {
	case <-done:
	case <-time.After(10 * time.Second): // a bound on failure, not a wait for success
		t.Fatalf("a call with another id (%s) waited for %s's lock", other, first)
	}

	acquired := make(chan struct{})
	go func() {
		defer api.LockID(s, first)()
		close(acquired)
	}()
	for _, n := api.LockedIDs(s, first); n < 2; _, n = api.LockedIDs(s, first) {
		runtime.Gosched() // until the second holder of first waits on it
	}
	select {
	case <-acquired:
		t.Fatal("the same id was locked twice at once")
	default:
	}
	unlock()
	<-acquired
	for ids, _ := api.LockedIDs(s, first); ids != 0; ids, _ = api.LockedIDs(s, first) {
		runtime.Gosched() // until the second holder has unlocked
	}
}
