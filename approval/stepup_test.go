package approval_test

import (
	"context"
	"encoding/json"
	"errors"
	"slices"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// stepUpFixture is a lifecycle whose refund tool asks a passkey for refunds
// above $500, over in-memory records, audit and step-up links.
type stepUpFixture struct {
	lifeFixture
	ups *countingStepUps
}

// countingStepUps counts the calls made to the step-up store, so a test can
// show a vote that needs no step-up never reaches it.
type countingStepUps struct {
	*approvaltest.StepUps
	calls int
}

func (c *countingStepUps) SteppedUp(ctx context.Context, user string) (time.Time, error) {
	c.calls++
	return c.StepUps.SteppedUp(ctx, user)
}

func (c *countingStepUps) StepUpLink(ctx context.Context, key string) (approval.StepUpLink, error) {
	c.calls++
	return c.StepUps.StepUpLink(ctx, key)
}

func mustStepUpLifecycle(tb testing.TB, fresh time.Duration) stepUpFixture {
	tb.Helper()
	clock := clocktest.New(clocktest.Opts{})
	f := lifeFixture{rec: approvaltest.NewRecords(clock.Now), audit: approvaltest.NewAuditor(clock.Now), clock: clock}
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {Risk: approval.RiskHigh, Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject},
			Preauthorize: time.Hour,
			StepUp:       &approval.StepUp{When: "args.amount > 500", Methods: []approval.StepUpMethod{approval.StepUpPasskey}, Fresh: fresh}},
	}})
	if err != nil {
		tb.Fatalf("NewGate: %v", err)
	}
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: approvaltest.NewLedger(f.rec, f.audit), Gate: gate, Now: clock.Now})
	if err != nil {
		tb.Fatalf("NewLifecycle: %v", err)
	}
	ups := &countingStepUps{StepUps: approvaltest.NewStepUps(clock.Now)}
	life.SetStepUps(ups)
	f.life = life
	return stepUpFixture{lifeFixture: f, ups: ups}
}

func (f stepUpFixture) refund(tb testing.TB, amount string) *approval.Request {
	return f.create(tb, func(r *approval.Request) {
		r.Args = json.RawMessage(`{"order_id":"1234","amount":` + amount + `}`)
		r.Preauthorize = time.Hour // Approve + allow offered
	})
}

func vote(r *approval.Request, v approval.Verdict, who string, at time.Time) approval.Decision {
	return approval.Decision{RequestID: r.ID, Verdict: v, Approver: who, At: at, Digest: r.Digest}
}

func TestStepUpFor(t *testing.T) {
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"refund": {StepUp: &approval.StepUp{When: "args.amount > 500", Reason: "refund above $500"}},
		"delete": {Risk: approval.RiskHigh, StepUp: &approval.StepUp{Risk: approval.RiskHigh, Methods: []approval.StepUpMethod{approval.StepUpPasskey, approval.StepUpOIDC}}},
		"lookup": {Risk: approval.RiskLow, StepUp: &approval.StepUp{Risk: approval.RiskHigh}},
		"plain":  {},
	}})
	if err != nil {
		t.Fatalf("NewGate: %v", err)
	}
	for _, c := range []struct {
		name, tool, args string
		want             string // the need in words, "" for none
	}{
		{"below the rule", "refund", `{"amount":64}`, ""},
		{"above the rule", "refund", `{"amount":900}`, "your vote needs a passkey confirmation (refund above $500)"},
		{"rule cannot be evaluated: fail closed", "refund", `{"order":1}`, "your vote needs a passkey confirmation (refund above $500)"},
		{"by risk", "delete", `{}`, "your vote needs a passkey or a single sign-on confirmation"},
		{"risk below the rule's", "lookup", `{}`, ""},
		{"no rule", "plain", `{}`, ""},
		{"unknown tool", "nope", `{}`, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			n := gate.StepUpFor(&approval.Request{Tool: c.tool}, json.RawMessage(c.args))
			got := ""
			if n != nil {
				got = n.Words()
			}
			if got != c.want {
				t.Errorf("StepUpFor(%s, %s) = %q, want %q", c.tool, c.args, got, c.want)
			}
		})
	}
}

func TestStepUpPolicyRefused(t *testing.T) {
	for _, c := range []struct {
		name string
		s    approval.StepUp
	}{
		{"bad method", approval.StepUp{Methods: []approval.StepUpMethod{"sms"}}},
		{"bad rule", approval.StepUp{When: "args.amount >"}},
		{"fresh too long", approval.StepUp{Fresh: 48 * time.Hour}},
		{"bad risk", approval.StepUp{Risk: "extreme"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{"t": {StepUp: &c.s}}})
			if err == nil {
				t.Fatalf("NewGate(step_up %+v) = nil error, want a refusal", c.s)
			}
		})
	}
}

// A vote that needs a step-up counts nothing without a proof; a
// rejection needs none; a request that needs none never reads the step-up
// store.
func TestDecideNeedsStepUp(t *testing.T) {
	ctx := context.Background()
	f := mustStepUpLifecycle(t, 0)

	small := f.refund(t, "64")
	if _, err := f.life.Decide(ctx, small, vote(small, approval.VerdictApprove, "U0BOB", f.clock.Now()), approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide(approve $64) = %v, want nil", err)
	}
	if f.ups.calls != 0 {
		t.Errorf("a vote that needs no step-up made %d step-up store calls, want 0", f.ups.calls)
	}

	big := f.refund(t, "900")
	if n := f.life.NeedsStepUp(big, approval.VerdictApprove); n == nil {
		t.Fatalf("NeedsStepUp($900 refund) = nil, want a passkey")
	}
	for _, c := range []struct {
		name  string
		d     approval.Decision
		allow bool
	}{
		{"approve", vote(big, approval.VerdictApprove, "U0BOB", f.clock.Now()), false},
		{"approve and allow", vote(big, approval.VerdictApprove, "U0BOB", f.clock.Now()), true},
		{"edit", func() approval.Decision {
			d := vote(big, approval.VerdictEdit, "U0BOB", f.clock.Now())
			d.Args = json.RawMessage(`{"order_id":"1234","amount":800}`)
			return d
		}(), false},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := f.life.Decide(ctx, big, c.d, approval.DecideOptions{Allow: c.allow})
			if !errors.Is(err, approval.ErrStepUpRequired) {
				t.Fatalf("Decide(%s) = %v, want ErrStepUpRequired", c.name, err)
			}
			got, _ := f.rec.Request(ctx, big.ID)
			if got.Status != approval.StatusPending || len(got.Approvals) != 0 {
				t.Errorf("after a refused %s: status %s, %d approvals, want pending with none", c.name, got.Status, len(got.Approvals))
			}
		})
	}
	if _, err := f.life.Decide(ctx, big, vote(big, approval.VerdictReject, "U0BOB", f.clock.Now()), approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide(reject) = %v, want nil: a rejection needs no step-up", err)
	}
}

// The walk of a confirmed vote: the click gets a link, the page takes it
// and decides with the proof; the link is then gone.
func TestDecideSteppedUp(t *testing.T) {
	ctx := context.Background()
	f := mustStepUpLifecycle(t, 0)
	r := f.refund(t, "900")
	d := vote(r, approval.VerdictApprove, "U0BOB", f.clock.Now())
	token, err := f.life.OfferStepUp(ctx, r, d, false)
	if err != nil {
		t.Fatalf("OfferStepUp = %v", err)
	}
	link, shown, err := f.life.StepUpLink(ctx, token)
	if err != nil || shown == nil || shown.ID != r.ID || link.User != "U0BOB" {
		t.Fatalf("StepUpLink = %+v, %v, %v; want the link of U0BOB's vote on %s", link, shown, err, r.ID)
	}
	if got := approval.StepUpChallenge(link); len(got) != 32 {
		t.Errorf("StepUpChallenge: %d bytes, want 32", len(got))
	}
	taken, err := f.life.TakeStepUpLink(ctx, token)
	if err != nil {
		t.Fatalf("TakeStepUpLink = %v", err)
	}
	after, err := f.life.DecideSteppedUp(ctx, taken, approval.StepUpPasskey, "cred-1")
	if err != nil {
		t.Fatalf("DecideSteppedUp = %v", err)
	}
	if after.Status != approval.StatusApproved || after.Decision == nil || after.Decision.StepUp == nil || after.Decision.StepUp.Credential != "cred-1" {
		t.Fatalf("after DecideSteppedUp: %s, decision %+v; want approved with the passkey's proof", after.Status, after.Decision)
	}
	evs := f.audit.Events(r.ID)
	for _, want := range []approval.Event{approval.EventStepUpOffered, approval.EventDecided, approval.EventStepUpVerified} {
		if !slices.Contains(evs, want) {
			t.Errorf("audit of %s = %v, want %s in it", r.ID, evs, want)
		}
	}
	if _, err := f.life.TakeStepUpLink(ctx, token); !errors.Is(err, approval.ErrStepUpLinkGone) {
		t.Errorf("TakeStepUpLink(used) = %v, want ErrStepUpLinkGone", err)
	}
}

// Each way a confirmation can fail counts nothing and is audited.
func TestStepUpFailsClosed(t *testing.T) {
	ctx := context.Background()
	f := mustStepUpLifecycle(t, 0)

	t.Run("expired link", func(t *testing.T) {
		r := f.refund(t, "900")
		token, err := f.life.OfferStepUp(ctx, r, vote(r, approval.VerdictApprove, "U0BOB", f.clock.Now()), false)
		if err != nil {
			t.Fatal(err)
		}
		f.clock.Advance(approval.StepUpLinkTTL + time.Second)
		if _, _, err := f.life.StepUpLink(ctx, token); !errors.Is(err, approval.ErrStepUpLinkGone) {
			t.Errorf("StepUpLink(expired) = %v, want ErrStepUpLinkGone", err)
		}
		if _, err := f.life.TakeStepUpLink(ctx, token); !errors.Is(err, approval.ErrStepUpLinkGone) {
			t.Errorf("TakeStepUpLink(expired) = %v, want ErrStepUpLinkGone", err)
		}
	})
	t.Run("digest changed since the click", func(t *testing.T) {
		r := f.create(t, func(r *approval.Request) {
			r.Args = json.RawMessage(`{"order_id":"1234","amount":900}`)
			r.Quorum = 2
		})
		token, err := f.life.OfferStepUp(ctx, r, vote(r, approval.VerdictApprove, "U0BOB", f.clock.Now()), false)
		if err != nil {
			t.Fatal(err)
		}
		// Carol's edit lands (recorded as the store would) after Bob's click.
		if _, err := f.rec.RecordDecision(ctx, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictEdit, Approver: "U0CAROL",
			At: f.clock.Now(), Digest: r.Digest, Args: json.RawMessage(`{"order_id":"1234","amount":700}`), Quorum: 2}); err != nil {
			t.Fatalf("RecordDecision(edit) = %v", err)
		}
		link, err := f.life.TakeStepUpLink(ctx, token)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := f.life.DecideSteppedUp(ctx, link, approval.StepUpPasskey, "cred-1"); !errors.Is(err, approval.ErrStaleArgs) {
			t.Fatalf("DecideSteppedUp(after an edit) = %v, want ErrStaleArgs", err)
		}
		got, _ := f.rec.Request(ctx, r.ID)
		if len(got.Approvals) != 1 {
			t.Errorf("approvals after the stale confirmation: %d, want 1 (Carol's edit only)", len(got.Approvals))
		}
		if evs := f.audit.Events(r.ID); !slices.Contains(evs, approval.EventStepUpRefused) {
			t.Errorf("audit of %s = %v, want step_up_refused", r.ID, evs)
		}
	})
	t.Run("proof of another vote", func(t *testing.T) {
		r := f.refund(t, "900")
		other := f.refund(t, "901")
		if _, err := f.life.Decide(ctx, r, vote(r, approval.VerdictApprove, "U0BOB", f.clock.Now()), approval.DecideOptions{Allow: true}); !errors.Is(err, approval.ErrStepUpRequired) {
			t.Fatalf("Decide(approve and allow, no proof) = %v, want ErrStepUpRequired", err)
		}
		for name, mod := range map[string]func(p *approval.StepUpProof){
			"another request":  func(p *approval.StepUpProof) { p.RequestID = other.ID },
			"another approver": func(p *approval.StepUpProof) { p.Approver = "U0MALLORY" },
			"another digest":   func(p *approval.StepUpProof) { p.Digest = other.Digest },
			"without allow":    func(p *approval.StepUpProof) { p.Allow = false },
			"stale":            func(p *approval.StepUpProof) { p.At = p.At.Add(-2 * approval.StepUpProofMaxAge) },
			"another method":   func(p *approval.StepUpProof) { p.Method = approval.StepUpOIDC },
		} {
			d := vote(r, approval.VerdictApprove, "U0BOB", f.clock.Now())
			d.StepUp = &approval.StepUpProof{Method: approval.StepUpPasskey, Credential: "c", At: f.clock.Now(), RequestID: r.ID,
				Digest: r.Digest, Verdict: approval.VerdictApprove, Approver: "U0BOB", Allow: true}
			mod(d.StepUp)
			if _, err := f.life.Decide(ctx, r, d, approval.DecideOptions{Allow: true}); !errors.Is(err, approval.ErrStepUpInvalid) {
				t.Errorf("Decide(proof of %s) = %v, want ErrStepUpInvalid", name, err)
			}
		}
		if got, _ := f.rec.Request(ctx, r.ID); got.Status != approval.StatusPending {
			t.Errorf("status after forged proofs: %s, want pending", got.Status)
		}
	})
}

// An edit is confirmed for the edited arguments; under fresh one
// confirmation covers the approver's next votes until it ends.
func TestStepUpEditAndFresh(t *testing.T) {
	ctx := context.Background()
	f := mustStepUpLifecycle(t, 10*time.Minute)
	r := f.refund(t, "900")
	d := vote(r, approval.VerdictEdit, "U0BOB", f.clock.Now())
	d.Args = json.RawMessage(`{"order_id":"1234","amount":850}`)
	token, err := f.life.OfferStepUp(ctx, r, d, false)
	if err != nil {
		t.Fatal(err)
	}
	link, err := f.life.TakeStepUpLink(ctx, token)
	if err != nil {
		t.Fatal(err)
	}
	after, err := f.life.DecideSteppedUp(ctx, link, approval.StepUpPasskey, "cred-1")
	if err != nil {
		t.Fatalf("DecideSteppedUp(edit) = %v", err)
	}
	if string(after.Args) != `{"order_id":"1234","amount":850}` && after.Status != approval.StatusApproved {
		t.Errorf("after the edit: %s %s, want approved with amount 850", after.Status, after.Args)
	}

	next := f.refund(t, "990")
	f.clock.Advance(9 * time.Minute)
	if _, err := f.life.Decide(ctx, next, vote(next, approval.VerdictApprove, "U0BOB", f.clock.Now()), approval.DecideOptions{}); err != nil {
		t.Fatalf("Decide within fresh = %v, want nil", err)
	}
	late := f.refund(t, "990")
	if _, err := f.life.Decide(ctx, late, vote(late, approval.VerdictApprove, "U0CAROL", f.clock.Now()), approval.DecideOptions{}); !errors.Is(err, approval.ErrStepUpRequired) {
		t.Errorf("Decide by another approver within Bob's fresh window = %v, want ErrStepUpRequired", err)
	}
	f.clock.Advance(2 * time.Minute)
	if _, err := f.life.Decide(ctx, late, vote(late, approval.VerdictApprove, "U0BOB", f.clock.Now()), approval.DecideOptions{}); !errors.Is(err, approval.ErrStepUpRequired) {
		t.Errorf("Decide after fresh ended = %v, want ErrStepUpRequired", err)
	}
}

func TestOfferEnrollmentFourEyes(t *testing.T) {
	ctx := context.Background()
	f := mustStepUpLifecycle(t, 0)
	if _, err := f.life.OfferEnrollment(ctx, "U0BOB", "U0BOB"); !errors.Is(err, approval.ErrSelfApproval) {
		t.Errorf("OfferEnrollment(self-vouched) = %v, want ErrSelfApproval", err)
	}
	token, err := f.life.OfferEnrollment(ctx, "U0BOB", "U0ADMIN")
	if err != nil {
		t.Fatalf("OfferEnrollment = %v", err)
	}
	link, err := f.life.TakeStepUpLink(ctx, token)
	if err != nil || link.Purpose != approval.PurposeEnroll || link.User != "U0BOB" || link.VouchedBy != "U0ADMIN" {
		t.Fatalf("TakeStepUpLink(enroll) = %+v, %v", link, err)
	}
	if _, err := f.life.DecideSteppedUp(ctx, link, approval.StepUpPasskey, "c"); !errors.Is(err, approval.ErrStepUpInvalid) {
		t.Errorf("DecideSteppedUp(an enrollment link) = %v, want ErrStepUpInvalid", err)
	}
}

// TestVouchIsJudgedByThePolicy (issue 51, point 3): who may vouch for a
// colleague's passkey is the domain's judgement, over the policy's passkey
// admins — listed users, a usergroup, or (without any) the approvals
// channel's members — and never the person enrolling; an enrollment
// unlocked by an OIDC login (nobody vouched) is not judged here.
func TestVouchIsJudgedByThePolicy(t *testing.T) {
	ctx := context.Background()
	cases := []struct {
		name   string
		admins *approval.Approvers
		dir    approvaltest.Directory
		by     string
		want   error
	}{
		{"a listed admin", &approval.Approvers{Users: []string{"U0ADMIN"}}, approvaltest.Directory{}, "U0ADMIN", nil},
		{"an approver who is no admin", &approval.Approvers{Users: []string{"U0ADMIN"}}, approvaltest.Directory{Channel: []string{"U0MALLORY"}}, "U0MALLORY", approval.ErrNotApprover},
		{"an admins' usergroup member", &approval.Approvers{Usergroups: []string{"S0ADMINS"}}, approvaltest.Directory{Groups: map[string][]string{"S0ADMINS": {"U0CAROL"}}}, "U0CAROL", nil},
		{"outside the admins' usergroup", &approval.Approvers{Usergroups: []string{"S0ADMINS"}}, approvaltest.Directory{Groups: map[string][]string{"S0ADMINS": {"U0CAROL"}}}, "U0MALLORY", approval.ErrNotApprover},
		{"no admins: an approvals channel member", nil, approvaltest.Directory{Channel: []string{"U0CAROL"}}, "U0CAROL", nil},
		{"no admins: outside the approvals channel", nil, approvaltest.Directory{Channel: []string{"U0CAROL"}}, "U0MALLORY", approval.ErrNotApprover},
		{"an admin vouching for themself", &approval.Approvers{Users: []string{"U0BOB"}}, approvaltest.Directory{}, "U0BOB", approval.ErrSelfApproval},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			clock := clocktest.New(clocktest.Opts{})
			gate, err := approval.NewGate(approval.Policy{Version: 1, PasskeyAdmins: c.admins, Tools: map[string]approval.ToolPolicy{"t": {}}})
			if err != nil {
				t.Fatal(err)
			}
			life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: c.dir, Gate: gate, Now: clock.Now,
				Records: approvaltest.NewLedger(approvaltest.NewRecords(clock.Now), approvaltest.NewAuditor(clock.Now))})
			if err != nil {
				t.Fatal(err)
			}
			life.SetStepUps(approvaltest.NewStepUps(clock.Now))
			_, err = life.OfferEnrollment(ctx, "U0BOB", c.by)
			if c.want == nil && err != nil || c.want != nil && !errors.Is(err, c.want) {
				t.Errorf("OfferEnrollment(U0BOB, vouched by %s) = %v, want %v", c.by, err, c.want)
			}
			if _, err := life.OfferEnrollment(ctx, "U0BOB", ""); err != nil {
				t.Errorf("OfferEnrollment(U0BOB, unlocked by OIDC) = %v, want a link", err)
			}
		})
	}
}
