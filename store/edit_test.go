package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"sync"
	"testing"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// recAudit records what the lifecycle audits.
type recAudit struct {
	mu   sync.Mutex // guards recs
	recs []approval.Record
}

func (a *recAudit) Append(_ context.Context, r approval.Record) (approval.Entry, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.recs = append(a.recs, r)
	return approval.Entry{Seq: int64(len(a.recs)), Event: r.Event}, nil
}

func (a *recAudit) all() []approval.Record {
	a.mu.Lock()
	defer a.mu.Unlock()
	return slices.Clone(a.recs)
}

// refundPolicy: refunds over $500 need two approvals, over $2,000 are
// refused, as in the demo.
var refundPolicy = approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
	"refund": {Name: "refund", Review: approval.ReviewAlways, Quorum: 1,
		Decisions:  []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
		QuorumWhen: []approval.QuorumRule{{When: "args.amount > 500", Quorum: 2, Reason: "refunds over $500"}},
		Deny:       []approval.DenyRule{{When: "args.amount > 2000", Reason: "refunds over $2,000 go through finance"}}},
}}

// editLifecycle is a lifecycle over f's store that judges with
// refundPolicy.
func editLifecycle(t *testing.T, f fixture) (*approval.Lifecycle, *recAudit) {
	t.Helper()
	gate, err := approval.NewGate(refundPolicy)
	if err != nil {
		t.Fatal(err)
	}
	audit := &recAudit{}
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(f.s, audit), Gate: gate, Now: f.clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	return life, audit
}

func mustLoad(t *testing.T, f fixture, id string) *approval.Request {
	t.Helper()
	r, err := f.s.Request(context.Background(), id)
	if err != nil {
		t.Fatalf("Request(%s) = %v", id, err)
	}
	return r
}

func edit(r *approval.Request, by, args string) approval.Decision {
	d := decision(r, approval.VerdictEdit, by)
	d.Args = json.RawMessage(args)
	return d
}

// TestDecideEditRaisesQuorum (issue 27, point 2): an edit is judged as a
// new proposal. A $60 refund (one approval) edited to $1,200 needs two:
// the request's quorum is raised to 2, the edit counts as the editor's one
// approval, and the request stays pending until a second approver
// approves the edited arguments. The audit's approval_counted entry
// records the new quorum and the rule that raised it.
func TestDecideEditRaisesQuorum(t *testing.T) {
	f := mustStore(t, store.Options{})
	life, audit := editLifecycle(t, f)
	ctx := context.Background()
	r := f.mustCreate(t, func(r *approval.Request) { r.Args = json.RawMessage(`{"amount":60}`) })

	after, err := life.Decide(ctx, r, edit(r, "U_BOB", `{"amount":1200}`), approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide(edit to 1200) = %v", err)
	}
	if after.Status != approval.StatusPending || after.Quorum != 2 || len(after.Approvals) != 1 {
		t.Fatalf("after the edit: status %s, quorum %d, %d approvals; want pending, 2, 1", after.Status, after.Quorum, len(after.Approvals))
	}
	if got := mustLoad(t, f, r.ID); got.Quorum != 2 || string(got.Args) != `{"amount":1200}` {
		t.Fatalf("stored request: quorum %d, args %s; want 2 and the edited args", got.Quorum, got.Args)
	}
	recs := audit.all()
	if len(recs) != 1 || recs[0].Event != approval.EventApprovalVote {
		t.Fatalf("audit = %+v, want one approval_counted entry", recs)
	}
	data := recs[0].Data.(approval.DecidedEvent)
	if data.Quorum != 2 || data.Approvals != 1 || !slices.ContainsFunc(data.Signals, func(s approval.Signal) bool { return s.Code == approval.SignalQuorumRule }) {
		t.Errorf("approval_counted data = %+v, want quorum 2, 1 approval and the quorum rule's signal", data)
	}

	// The editor cannot supply the second approval.
	if _, err := life.Decide(ctx, after, decision(after, approval.VerdictApprove, "U_BOB"), approval.DecideOptions{}); !errors.Is(err, approval.ErrAlreadyVoted) {
		t.Fatalf("editor's own approve = %v, want ErrAlreadyVoted", err)
	}
	final, err := life.Decide(ctx, after, decision(after, approval.VerdictApprove, "U_CAROL"), approval.DecideOptions{})
	if err != nil {
		t.Fatalf("second approver's approve = %v", err)
	}
	if final.Status != approval.StatusApproved || string(final.Args) != `{"amount":1200}` || len(final.Approvals) != 2 {
		t.Fatalf("after the second approval: status %s, args %s, %d approvals; want approved, the edited args, 2", final.Status, final.Args, len(final.Approvals))
	}
}

// TestDecideEditNeverLowersQuorum: an edit into a call that needs fewer
// approvals than the request asks for leaves the quorum as it was.
func TestDecideEditNeverLowersQuorum(t *testing.T) {
	f := mustStore(t, store.Options{})
	life, _ := editLifecycle(t, f)
	r := f.mustCreate(t, func(r *approval.Request) { r.Args, r.Quorum = json.RawMessage(`{"amount":900}`), 3 })
	after, err := life.Decide(context.Background(), r, edit(r, "U_BOB", `{"amount":60}`), approval.DecideOptions{})
	if err != nil {
		t.Fatalf("Decide(edit to 60) = %v", err)
	}
	if after.Status != approval.StatusPending || after.Quorum != 3 {
		t.Fatalf("after the edit: status %s, quorum %d; want pending, 3", after.Status, after.Quorum)
	}
}

// TestDecideEditRefused: an edit into a deny rule, or into arguments that
// are not a JSON object, is refused and records nothing: the request, its
// votes and the audit are as before.
func TestDecideEditRefused(t *testing.T) {
	for _, tt := range []struct {
		name, args string
		want       error
	}{
		{"deny rule", `{"amount":2500}`, approval.ErrDenied},
		{"not an object", `[1,2]`, approval.ErrInvalidArgs},
	} {
		t.Run(tt.name, func(t *testing.T) {
			f := mustStore(t, store.Options{})
			life, audit := editLifecycle(t, f)
			r := f.mustCreate(t, func(r *approval.Request) { r.Args = json.RawMessage(`{"amount":60}`) })
			_, err := life.Decide(context.Background(), r, edit(r, "U_BOB", tt.args), approval.DecideOptions{})
			if !errors.Is(err, tt.want) {
				t.Fatalf("Decide(edit to %s) = %v, want %v", tt.args, err, tt.want)
			}
			if de, ok := errors.AsType[*approval.DenialError](err); tt.want == approval.ErrDenied && (!ok || de.Denial.Reason != "refunds over $2,000 go through finance") {
				t.Errorf("Decide(edit to %s) = %v, want a *DenialError with the rule's reason", tt.args, err)
			}
			got := mustLoad(t, f, r.ID)
			if got.Status != approval.StatusPending || string(got.Args) != `{"amount":60}` || len(got.Approvals) != 0 || got.OriginalArgs != nil {
				t.Errorf("stored after a refused edit: %s %s, %d approvals; want it unchanged", got.Status, got.Args, len(got.Approvals))
			}
			if recs := audit.all(); len(recs) != 0 {
				t.Errorf("audit after a refused edit = %+v, want nothing", recs)
			}
		})
	}
}
