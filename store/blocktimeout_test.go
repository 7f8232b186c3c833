package store_test

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// warnings is a slog handler that keeps the messages it sees.
type warnings struct {
	mu   sync.Mutex // guards msgs
	msgs []string
}

func (h *warnings) Enabled(context.Context, slog.Level) bool { return true }
func (h *warnings) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	defer h.mu.Unlock()
	msg := r.Message
	r.Attrs(func(a slog.Attr) bool { msg += " " + a.String(); return true })
	h.msgs = append(h.msgs, msg)
	return nil
}
func (h *warnings) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *warnings) WithGroup(string) slog.Handler      { return h }

func (h *warnings) all() []string {
	h.mu.Lock()
	defer h.mu.Unlock()
	return append([]string(nil), h.msgs...)
}

// TestBlockTimeoutAboveReadTimeout: a BlockTimeout longer than the client's
// ReadTimeout must not make the hub's BLPOP time out on the client side (a
// broken round, a dropped connection and a wake-up that waits for the next
// full recheck). go-redis gives its typed blocking commands the block time
// plus a margin; a fractional timeout sent raw got only ReadTimeout.
func TestBlockTimeoutAboveReadTimeout(t *testing.T) {
	t.Parallel() // slow and independent (its own keys): overlaps with the rest of the package
	rdb, prefix := storetest.NewWith(t, func(o *redis.UniversalOptions) { o.ReadTimeout = time.Second })
	logs := &warnings{}
	rounds := make(chan int, 100)
	regs := newRegistrations()
	f := mustStoreOn(t, rdb, prefix, store.Options{BlockTimeout: 1500 * time.Millisecond, Logger: slog.New(logs)})
	store.SetHubHooks(f.s, store.HubHooks{
		Registered: regs.hook,
		Round:      func(_, keys int) { rounds <- keys },
	})
	r := f.mustCreate(t, nil)
	ctx := context.Background()
	ch := goWait(ctx, f.s, r.ID)
	regs.await(t, r.ID, 1)
	// Two rounds with the key: the first BLPOP ended (timed out) and the
	// hub blocks again.
	for n := 0; n < 2; {
		select {
		case k := <-rounds:
			if k > 0 {
				n++
			}
		case <-time.After(30 * time.Second):
			t.Fatal("the hub did not start a second round")
		}
	}
	for _, m := range logs.all() {
		if strings.Contains(m, "BLPOP") {
			t.Errorf("hub logged %q; want BLPOP rounds that time out on the server", m)
		}
	}
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
		t.Fatalf("Decide = %v", err)
	}
	res := receive(t, ch, 10*time.Second)
	if res.err != nil || res.r.Status != approval.StatusApproved {
		t.Fatalf("Wait = %+v, %v; want approved", res.r, res.err)
	}
}
