package auditweb_test

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
)

// fakeAudit is an in-memory audit stream with the store's semantics:
// Append redacts and chains like store.Audit, ids are "<ms>-<n>", Range
// and RevRange page exclusively around an id, Verify walks the chain.
type fakeAudit struct {
	mu      sync.Mutex // guards entries and pending
	entries []approval.Entry
	pending []*approval.Request
	// failRead, when set, is returned by every read.
	failRead error
}

var (
	_ auditweb.Entries = (*fakeAudit)(nil)
	_ auditweb.Pending = (*fakeAudit)(nil)
)

// Append adds r stamped at.
func (f *fakeAudit) Append(at time.Time, r approval.Record) approval.Entry {
	f.mu.Lock()
	defer f.mu.Unlock()
	e := approval.Entry{Event: r.Event, RequestID: r.RequestID, RunID: r.RunID, Actor: r.Actor, Tool: r.Tool,
		Data: approval.Redact(r.Data, r.Secret), Time: at.UTC()}
	e.Seq = int64(len(f.entries) + 1)
	if n := len(f.entries); n > 0 {
		e.PrevHash = f.entries[n-1].Hash
	}
	e.Hash = approval.ChainHash(e.PrevHash, e)
	ms := at.UnixMilli()
	if n := len(f.entries); n > 0 {
		if last, _ := splitID(f.entries[n-1].ID); last >= ms {
			ms = last // ids never go backwards, as in Redis
		}
	}
	e.ID = fmt.Sprintf("%d-%d", ms, e.Seq)
	f.entries = append(f.entries, e)
	return e
}

// Tamper replaces the data of entry i without rehashing.
func (f *fakeAudit) Tamper(i int, data string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.entries[i].Data = []byte(data)
}

func (f *fakeAudit) SetPending(rs ...*approval.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.pending = rs
}

func splitID(id string) (int64, int64) {
	a, b, _ := strings.Cut(id, "-")
	ms, _ := strconv.ParseInt(a, 10, 64)
	seq, _ := strconv.ParseUint(b, 10, 64)
	return ms, int64(seq)
}

func idLess(a, b string) bool {
	am, as := splitID(a)
	bm, bs := splitID(b)
	return am < bm || (am == bm && as < bs)
}

func (f *fakeAudit) Range(_ context.Context, afterID string, count int64) ([]approval.Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRead != nil {
		return nil, f.failRead
	}
	i := 0
	if afterID != "" && afterID != "-" {
		i = sort.Search(len(f.entries), func(i int) bool { return idLess(afterID, f.entries[i].ID) })
	}
	j := min(len(f.entries), i+int(count))
	return append([]approval.Entry(nil), f.entries[i:j]...), nil
}

func (f *fakeAudit) RevRange(_ context.Context, beforeID string, count int64) ([]approval.Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRead != nil {
		return nil, f.failRead
	}
	j := len(f.entries)
	if beforeID != "" && beforeID != "+" {
		j = sort.Search(len(f.entries), func(i int) bool { return !idLess(f.entries[i].ID, beforeID) })
	}
	var out []approval.Entry
	for i := j - 1; i >= 0 && int64(len(out)) < count; i-- {
		out = append(out, f.entries[i])
	}
	return out, nil
}

func (f *fakeAudit) Verify(_ context.Context) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRead != nil {
		return 0, f.failRead
	}
	var v approval.ChainVerifier
	for _, e := range f.entries {
		if err := v.Next(e); err != nil {
			return v.Checked() - 1, err
		}
	}
	return v.Checked(), nil
}

func (f *fakeAudit) Pending(_ context.Context) ([]*approval.Request, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRead != nil {
		return nil, f.failRead
	}
	return f.pending, nil
}

// Users, tools and requests of the fixture history.
const (
	alice = "U0ALICE01"
	bob   = "U0BOB0001"
	carol = "U0CAROL01"
	dave  = "U0DAVE001" // the requester

	hostileArg = `<script>alert(1)</script><img src=x onerror=alert(1)>`
)

var people = map[string]string{alice: "alice", bob: "bob", carol: "carol", dave: "dave"}

// history writes a small history: approve, edit, reject (with a hostile
// argument and a secret), expire, a quorum vote, an auto-approved call,
// and one request still pending. It returns the time of its first entry.
func history(f *fakeAudit, base time.Time) {
	at := func(d time.Duration, r approval.Record) { f.Append(base.Add(d), r) }
	req := func(d time.Duration, id, tool string, args map[string]any, secret ...string) {
		at(d, approval.Record{Event: approval.EventRequested, RequestID: id, RunID: "run_1", Actor: dave, Tool: tool, Secret: secret,
			Data: map[string]any{"args": args, "digest": "d_" + id, "requester": dave,
				"preview":   approval.Preview{Summary: "Refund order 1234", Facts: []approval.Fact{{Label: "Order total", Value: "$64.00"}}},
				"signals":   []approval.Signal{{Code: "sensitive_capability", Text: "capability spend_money is sensitive"}},
				"decisions": []string{"approve", "edit", "reject"}, "quorum": 1,
				"deadline": base.Add(d + time.Hour).Format(time.RFC3339), "reason": "customer asked"}})
	}
	dec := func(d time.Duration, id, tool, actor, verdict string, ms int, reason string) {
		at(d, approval.Record{Event: approval.EventDecided, RequestID: id, RunID: "run_1", Actor: actor, Tool: tool,
			Data: map[string]any{"verdict": verdict, "digest": "d_" + id, "decision_ms": ms, "reason": reason}})
	}
	at(0, approval.Record{Event: approval.EventRunStarted, RunID: "run_1", Actor: dave, Data: map[string]any{"text": "refund order 1234"}})
	at(time.Second, approval.Record{Event: approval.EventAutoApproved, RequestID: "req_auto", RunID: "run_1", Tool: "lookup_order"})
	req(2*time.Second, "req_approve", "refund", map[string]any{"order": "1234", "amount": 64})
	at(3*time.Second, approval.Record{Event: approval.EventCardPosted, RequestID: "req_approve", RunID: "run_1", Tool: "refund",
		Data: map[string]any{"channel": "C0APPROVALS", "ts": "1700000000.000100"}})
	dec(6*time.Second, "req_approve", "refund", alice, "approve", 4000, "")
	at(7*time.Second, approval.Record{Event: approval.EventExecuted, RequestID: "req_approve", RunID: "run_1", Tool: "refund",
		Data: map[string]any{"result": "refunded $64.00", "duration_ms": 200}})
	req(10*time.Second, "req_edit", "refund", map[string]any{"order": "1234", "amount": 64})
	at(70*time.Second, approval.Record{Event: approval.EventDecided, RequestID: "req_edit", RunID: "run_1", Actor: bob, Tool: "refund",
		Data: map[string]any{"verdict": "edit", "digest": "d50", "decision_ms": 60000, "reason": "partial refund only",
			"args": map[string]any{"order": "1234", "amount": 50}, "original_args": map[string]any{"order": "1234", "amount": 64}}})
	req(100*time.Second, "req_reject", "send_email", map[string]any{"to": "someone@example.com", "body": hostileArg, "password": "hunter2"}, "password")
	dec(103*time.Second, "req_reject", "send_email", carol, "reject", 3000, hostileArg)
	req(300*time.Second, "req_quorum", "deploy", map[string]any{"service": "api"})
	at(320*time.Second, approval.Record{Event: approval.EventApprovalVote, RequestID: "req_quorum", RunID: "run_1", Actor: bob, Tool: "deploy",
		Data: map[string]any{"verdict": "approve", "decision_ms": 20000}})
	dec(330*time.Second, "req_quorum", "deploy", alice, "approve", 30000, "")
	req(400*time.Second, "req_expire", "send_email", map[string]any{"to": "other@example.com"})
	at(400*time.Second+time.Hour, approval.Record{Event: approval.EventExpired, RequestID: "req_expire", RunID: "run_1", Actor: "system", Tool: "send_email",
		Data: map[string]any{"reason": "deadline passed"}})
}

// peopleNames names the people of the fixture.
type peopleNames struct{}

func (peopleNames) Name(_ context.Context, id string) string { return people[id] }

// newView returns the view over f with token "t0ken" and user ops/secret.
func newView(tb testing.TB, f *fakeAudit, now time.Time, configure func(*auditweb.Options)) *auditweb.Handler {
	tb.Helper()
	opts := auditweb.Options{Entries: f, Pending: f, Token: "t0ken", User: "ops", Password: "s3cret",
		SlackURL: "https://acme.slack.com", Names: peopleNames{},
		Now: func() time.Time { return now }}
	if configure != nil {
		configure(&opts)
	}
	h, err := auditweb.New(opts)
	if err != nil {
		tb.Fatalf("auditweb.New: %v", err)
	}
	return h
}
