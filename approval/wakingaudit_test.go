package approval_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
)

// wakingAuditor is an approval.WakingAuditor over the doubles:
// AppendWake appends, then, when push, pushes the wake-up itself (as the
// store does in the same round trip) and says so.
type wakingAuditor struct {
	*approvaltest.Auditor
	rec  *approvaltest.Records
	push bool
}

func (a *wakingAuditor) AppendWake(ctx context.Context, r approval.Record, id string, st approval.Status) (approval.Entry, bool, error) {
	e, err := a.Append(ctx, r)
	if err != nil || !a.push {
		return e, false, err
	}
	return e, true, a.rec.Wake(ctx, id, st)
}

// TestDecideWakesWithTheAudit: with an Auditor that can push the wake-up
// behind the entry (approval.WakingAuditor), a decision's wake-up goes
// that way, once; when it reports the wake-up not pushed, the lifecycle
// pushes it (Records.Wake), once.
func TestDecideWakesWithTheAudit(t *testing.T) {
	for _, push := range []bool{true, false} {
		clock := clocktest.New(clocktest.Opts{})
		rec := approvaltest.NewRecords(clock.Now)
		audit := &wakingAuditor{Auditor: approvaltest.NewAuditor(clock.Now), rec: rec, push: push}
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: rec, Audit: audit, Now: clock.Now})
		if err != nil {
			t.Fatalf("NewLifecycle: %v", err)
		}
		f := lifeFixture{life: life, rec: rec, audit: audit.Auditor, clock: clock}
		r := f.create(t, nil)
		got, err := life.Decide(context.Background(), r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
			Approver: "U0BOB", Digest: r.Digest, At: clock.Now()}, approval.DecideOptions{})
		if err != nil || got.Status != approval.StatusApproved {
			t.Fatalf("push %v: Decide = %v, %v; want approved", push, got, err)
		}
		if woken := rec.Woken(r.ID); !slices.Equal(woken, []approval.Status{approval.StatusApproved}) {
			t.Errorf("push %v: wake-ups = %v, want one, approved", push, woken)
		}
		if evs := audit.Events(r.ID); !slices.Contains(evs, approval.EventDecided) {
			t.Errorf("push %v: audit events = %v, want decided", push, evs)
		}
	}
}

// claimingAuditor is an approval.ClaimingAuditor over the
// doubles: ClaimAppend claims (Records.Claim), then appends r when the
// claim took with the arguments r describes and append is set, as the
// store does in one round trip; cannot: it has no store to claim in.
type claimingAuditor struct {
	*approvaltest.Auditor
	rec    *approvaltest.Records
	append bool
	cannot bool
	calls  int
}

func (a *claimingAuditor) ClaimAppend(ctx context.Context, r approval.Record, id, owner, tokenHash, digest string) (*approval.Request, approval.Entry, bool, error) {
	a.calls++
	if a.cannot {
		return nil, approval.Entry{}, false, approval.ErrCannotClaim
	}
	got, err := a.rec.Claim(ctx, id, owner, tokenHash, digest)
	if err != nil || !a.append || got.Digest != digest {
		return got, approval.Entry{}, false, err
	}
	e, err := a.Append(ctx, r)
	return got, e, err == nil, nil
}

// TestClaimRequestWithTheAudit: a claimant that knows the approved
// request (ClaimRequest) claims through an Auditor that can claim and
// append together (approval.ClaimingAuditor); whichever way the entry goes
// — with the claim, after it by the lifecycle (not appended with it), or
// the usual way (the auditor cannot claim) — the request is executing
// with exactly one executing entry, built from the request, and its card
// redrawn; a second claim is refused and audits nothing.
func TestClaimRequestWithTheAudit(t *testing.T) {
	for _, tc := range []struct {
		name           string
		append, cannot bool
	}{{name: "appended with the claim", append: true}, {name: "appended after"}, {name: "auditor cannot claim", cannot: true}} {
		t.Run(tc.name, func(t *testing.T) {
			ctx := context.Background()
			clock := clocktest.New(clocktest.Opts{})
			rec := approvaltest.NewRecords(clock.Now)
			audit := &claimingAuditor{Auditor: approvaltest.NewAuditor(clock.Now), rec: rec, append: tc.append, cannot: tc.cannot}
			cards := approvaltest.NewCards()
			life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: rec, Audit: audit, Cards: cards, Now: clock.Now, Gate: mustRefundGate(t)})
			if err != nil {
				t.Fatalf("NewLifecycle: %v", err)
			}
			f := lifeFixture{life: life, rec: rec, audit: audit.Auditor, clock: clock}
			r := f.create(t, func(r *approval.Request) { r.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736" })
			approved, err := life.Decide(ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
				Approver: "U0BOB", Digest: r.Digest, At: clock.Now()}, approval.DecideOptions{})
			if err != nil || approved.Status != approval.StatusApproved {
				t.Fatalf("Decide = %v, %v; want approved", approved, err)
			}
			redraws := cards.Refreshed(r.ID)
			got, err := life.ClaimRequest(ctx, approved, "agent")
			if err != nil || got.Status != approval.StatusExecuting {
				t.Fatalf("ClaimRequest = %v, %v; want executing", got, err)
			}
			if audit.calls != 1 {
				t.Errorf("ClaimAppend called %d times, want 1", audit.calls)
			}
			var executing []approval.Entry
			for _, e := range audit.Entries() {
				if e.RequestID == r.ID && e.Event == approval.EventExecuting {
					executing = append(executing, e)
				}
			}
			if len(executing) != 1 || executing[0].Actor != "agent" || executing[0].RunID != r.RunID || executing[0].TraceID != r.TraceID {
				t.Errorf("executing entries = %+v, want one by agent for run %s with trace %s", executing, r.RunID, r.TraceID)
			}
			if cards.Refreshed(r.ID) != redraws+1 {
				t.Errorf("card redrawn %d times after the claim, want once", cards.Refreshed(r.ID)-redraws)
			}
			if _, err := life.ClaimRequest(ctx, approved, "another"); !errors.Is(err, approval.ErrAlreadyClaimed) {
				t.Errorf("second ClaimRequest = %v, want ErrAlreadyClaimed", err)
			}
			if evs := audit.Events(r.ID); count(evs, approval.EventExecuting) != 1 {
				t.Errorf("audit events after the second claim = %v, want one executing", evs)
			}
		})
	}
}

func count[T comparable](s []T, v T) int {
	n := 0
	for _, x := range s {
		if x == v {
			n++
		}
	}
	return n
}

// decidingAuditor is an approval.DecidingAuditor over the
// doubles: DecideAppendWake records the decision (Records.RecordDecision),
// then, when append is set and that decision made the pending request
// final with st and digest, appends r and, when push is set, pushes the
// wake-up, as the store does in one round trip; cannot: it has no store to
// record in.
type decidingAuditor struct {
	*approvaltest.Auditor
	rec          *approvaltest.Records
	append, push bool
	cannot       bool
	calls        int
}

func (a *decidingAuditor) DecideAppendWake(ctx context.Context, d approval.Decision, r approval.Record, st approval.Status, digest string) (*approval.Request, approval.Entry, bool, bool, error) {
	a.calls++
	if a.cannot {
		return nil, approval.Entry{}, false, false, approval.ErrCannotDecide
	}
	before, _ := a.rec.Request(ctx, d.RequestID)
	after, err := a.rec.RecordDecision(ctx, d)
	if err != nil || !a.append || before == nil || before.Status != approval.StatusPending || after.Status != st || after.Digest != digest {
		return after, approval.Entry{}, false, false, err
	}
	e, err := a.Append(ctx, r)
	if err != nil || !a.push {
		return after, e, err == nil, false, nil
	}
	return after, e, true, true, a.rec.Wake(ctx, d.RequestID, st)
}

// TestDecideWithTheAudit: with an Auditor that can record a decision,
// append its entry and push the wake-up in one round trip
// (approval.DecidingAuditor), every decision ends as it does without one —
// the same entries (event, actor, data, trace id), the same wake-ups, the
// same statuses and refusals, the same card redraws and the same requests
// told final — whichever way each part goes: all with the decision, the
// wake-up by the lifecycle, the entry and wake-up by the lifecycle, or
// the usual way (the auditor cannot decide). The auditor is asked only
// for a decision expected to make the request final: not for an approval
// short of the quorum, nor for an approval that pre-authorises (its grant
// comes between the entry and the wake-up).
func TestDecideWithTheAudit(t *testing.T) {
	quorum2 := func(r *approval.Request) { r.Quorum = 2 }
	after := func(r *approval.Request) { r.Mode, r.Decisions = approval.ModeAfter, nil }
	respond := func(r *approval.Request) { r.Decisions = append(r.Decisions, approval.VerdictRespond) }
	type click struct {
		verdict approval.Verdict
		who     string
		stale   bool
		allow   bool
		text    string
	}
	scenarios := []struct {
		name      string
		mod       func(*approval.Request)
		clicks    []click
		wantCalls int // DecideAppendWake calls, when the auditor can
	}{
		{name: "approve", clicks: []click{{verdict: approval.VerdictApprove, who: "U0BOB"}}, wantCalls: 1},
		{name: "reject with a reason", clicks: []click{{verdict: approval.VerdictReject, who: "U0BOB", text: "not this order"}}, wantCalls: 1},
		{name: "respond", mod: respond, clicks: []click{{verdict: approval.VerdictRespond, who: "U0BOB", text: "use order 1235"}}, wantCalls: 1},
		{name: "quorum of two", mod: quorum2, clicks: []click{{verdict: approval.VerdictApprove, who: "U0BOB"}, {verdict: approval.VerdictApprove, who: "U0CAROL"}}, wantCalls: 1},
		{name: "stale, then approved, then too late", clicks: []click{{verdict: approval.VerdictApprove, who: "U0BOB", stale: true},
			{verdict: approval.VerdictApprove, who: "U0BOB"}, {verdict: approval.VerdictReject, who: "U0CAROL"}}, wantCalls: 2},
		{name: "approve and allow", clicks: []click{{verdict: approval.VerdictApprove, who: "U0BOB", allow: true}}, wantCalls: 0},
		{name: "cancelled in its window", mod: after, clicks: []click{{verdict: approval.VerdictCancel, who: "U0BOB", text: "wrong customer"}}, wantCalls: 1},
		{name: "run now", mod: after, clicks: []click{{verdict: approval.VerdictRunNow, who: "U0BOB"}}, wantCalls: 1},
	}
	type outcome struct {
		entries  []string
		woken    []approval.Status
		results  []string
		redraws  int
		told     []approval.Status
		auditors int
	}
	run := func(t *testing.T, mod func(*approval.Request), clicks []click, way string) outcome {
		t.Helper()
		ctx := context.Background()
		clock := clocktest.New(clocktest.Opts{})
		rec := approvaltest.NewRecords(clock.Now)
		base := approvaltest.NewAuditor(clock.Now)
		var audit approval.Auditor = base
		da := &decidingAuditor{Auditor: base, rec: rec}
		switch way {
		case "plain":
		case "all with the decision":
			da.append, da.push, audit = true, true, da
		case "wake-up by the lifecycle":
			da.append, audit = true, da
		case "entry by the lifecycle":
			audit = da
		case "auditor cannot decide":
			da.cannot, audit = true, da
		}
		cards := approvaltest.NewCards()
		var told []approval.Status
		life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: rec, Audit: audit, Cards: cards, Now: clock.Now,
			OnFinal: func(r *approval.Request) { told = append(told, r.Status) }})
		if err != nil {
			t.Fatalf("NewLifecycle: %v", err)
		}
		f := lifeFixture{life: life, rec: rec, audit: base, clock: clock}
		r := f.create(t, func(r *approval.Request) {
			r.TraceID = "4bf92f3577b34da6a3ce929d0e0e4736"
			r.Preauthorize = time.Hour
			if mod != nil {
				mod(r)
			}
		})
		var out outcome
		for _, c := range clicks {
			cur, err := rec.Request(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			d := approval.Decision{RequestID: r.ID, Verdict: c.verdict, Approver: c.who, At: clock.Now(), Digest: cur.Digest, Text: c.text}
			if c.stale {
				d.Digest = "sha256:an-older-card"
			}
			got, err := life.Decide(ctx, cur, d, approval.DecideOptions{Allow: c.allow})
			st := approval.Status("")
			if got != nil {
				st = got.Status
			}
			out.results = append(out.results, strings.ReplaceAll(fmt.Sprintf("%s %v grant=%v", st, err, got != nil && got.Grant != nil), r.ID, "{id}"))
		}
		for _, e := range base.Entries() {
			if e.RequestID != r.ID && e.Event != approval.EventGranted {
				continue
			}
			data := strings.ReplaceAll(string(e.Data), r.ID, "{id}")
			data = regexp.MustCompile(`grant_[a-z0-9]+`).ReplaceAllString(data, "{grant}")
			out.entries = append(out.entries, fmt.Sprintf("%s by %s on %s, trace %s: %s", e.Event, e.Actor, e.Tool, e.TraceID, data))
		}
		out.woken, out.redraws, out.told, out.auditors = rec.Woken(r.ID), cards.Refreshed(r.ID), told, da.calls
		return out
	}
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) {
			want := run(t, sc.mod, sc.clicks, "plain")
			if len(want.entries) < 2 {
				t.Fatalf("plain lifecycle: entries %v, want the request's and its decisions'", want.entries)
			}
			for _, way := range []string{"all with the decision", "wake-up by the lifecycle", "entry by the lifecycle", "auditor cannot decide"} {
				got := run(t, sc.mod, sc.clicks, way)
				if !slices.Equal(got.entries, want.entries) {
					t.Errorf("%s: entries\n%s\nwant (no DecidingAuditor)\n%s", way, strings.Join(got.entries, "\n"), strings.Join(want.entries, "\n"))
				}
				if !slices.Equal(got.woken, want.woken) || !slices.Equal(got.results, want.results) || !slices.Equal(got.told, want.told) || got.redraws != want.redraws {
					t.Errorf("%s: woken %v, results %v, told %v, redraws %d; want %v, %v, %v, %d", way, got.woken, got.results, got.told, got.redraws,
						want.woken, want.results, want.told, want.redraws)
				}
				if got.auditors != sc.wantCalls {
					t.Errorf("%s: DecideAppendWake called %d times, want %d", way, got.auditors, sc.wantCalls)
				}
			}
		})
	}
}
