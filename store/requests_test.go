package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
	"github.com/redis/go-redis/v9"
)

func TestCreateRequestRoundTrip(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	conf := 0.42
	want := f.mustCreate(t, func(r *approval.Request) {
		r.Confidence = &conf
		r.Signals = []approval.Signal{{Code: "risk_high", Text: "risk is high"}}
		r.Preview = approval.Preview{Summary: "refund 12.50", Facts: []approval.Fact{{Label: "Order", Value: "A-1"}}}
		r.Origin = approval.Origin{Channel: "C1", ThreadTS: "1.2"}
	})
	got, err := f.s.Request(ctx, want.ID)
	if err != nil {
		t.Fatalf("Request(%s) = %v", want.ID, err)
	}
	if string(got.Args) != testArgs {
		t.Errorf("Args = %s, want byte-exact %s", got.Args, testArgs)
	}
	if got.Status != approval.StatusPending || got.Digest != want.Digest || got.Quorum != 1 {
		t.Errorf("Request = status %s digest %s quorum %d, want pending %s 1", got.Status, got.Digest, got.Quorum, want.Digest)
	}
	if d, _ := approval.Digest(json.RawMessage(testArgs)); got.Digest != d {
		t.Errorf("Digest = %s, want approval.Digest(args) %s", got.Digest, d)
	}
	if !got.Deadline.Equal(want.Deadline) || !got.Created.Equal(want.Created) {
		t.Errorf("times = %v/%v, want %v/%v", got.Created, got.Deadline, want.Created, want.Deadline)
	}
	if got.Confidence == nil || *got.Confidence != conf || len(got.Signals) != 1 || got.Preview.Facts[0].Value != "A-1" || got.Origin.ThreadTS != "1.2" {
		t.Errorf("Request lost fields: %+v", got)
	}
	if got.Decision != nil || len(got.Approvals) != 0 || got.OriginalArgs != nil {
		t.Errorf("new request has decision %v approvals %v original %s", got.Decision, got.Approvals, got.OriginalArgs)
	}
}

func TestCreateRequestRefusals(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	existing := f.mustCreate(t, nil)
	tests := []struct {
		name string
		r    *approval.Request
		want error
	}{
		{"duplicate id", request(t, func(r *approval.Request) { r.ID = existing.ID }), approval.ErrExists},
		{"digest mismatch", request(t, func(r *approval.Request) { r.Digest = "deadbeef" }), approval.ErrInvalidArgs},
		{"args not json", request(t, func(r *approval.Request) { r.Args = json.RawMessage(`{"a":`) }), approval.ErrInvalidArgs},
		{"not pending", request(t, func(r *approval.Request) { r.Status = approval.StatusApproved }), approval.ErrInvalidArgs},
		{"empty id", request(t, func(r *approval.Request) { r.ID = "" }), approval.ErrInvalidArgs},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := f.s.CreateRequest(ctx, tt.r); !errors.Is(err, tt.want) {
				t.Errorf("CreateRequest() = %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := f.s.Request(ctx, "req_missing"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("Request(missing) = %v, want ErrNotFound", err)
	}
}

func TestDecide(t *testing.T) {
	type step struct {
		verdict  approval.Verdict
		approver string
		args     string // edit only
		digest   string // "" = current digest, "old" = the digest at creation, other = literal
		wantErr  error
	}
	edited := `{"amount":5,"big":1e2,"tags":[]}`
	tests := []struct {
		name       string
		quorum     int
		decisions  []approval.Verdict // nil: approve, edit, reject
		steps      []step
		wantStatus approval.Status
		wantVotes  int
		wantArgs   string // "" = unchanged
		wantFinal  approval.Verdict
	}{
		{name: "approve", quorum: 1,
			steps:      []step{{verdict: approval.VerdictApprove, approver: "U1"}},
			wantStatus: approval.StatusApproved, wantVotes: 1, wantFinal: approval.VerdictApprove},
		{name: "reject", quorum: 2,
			steps:      []step{{verdict: approval.VerdictApprove, approver: "U1"}, {verdict: approval.VerdictReject, approver: "U2"}},
			wantStatus: approval.StatusRejected, wantVotes: 1, wantFinal: approval.VerdictReject},
		{name: "respond allowed", quorum: 1, decisions: []approval.Verdict{approval.VerdictRespond},
			steps:      []step{{verdict: approval.VerdictRespond, approver: "U1"}},
			wantStatus: approval.StatusResponded, wantFinal: approval.VerdictRespond},
		{name: "respond not allowed", quorum: 1,
			steps:      []step{{verdict: approval.VerdictRespond, approver: "U1", wantErr: approval.ErrVerdictNotAllowed}},
			wantStatus: approval.StatusPending},
		{name: "edit not allowed", quorum: 1, decisions: []approval.Verdict{approval.VerdictApprove},
			steps:      []step{{verdict: approval.VerdictEdit, approver: "U1", args: edited, wantErr: approval.ErrVerdictNotAllowed}},
			wantStatus: approval.StatusPending},
		{name: "reject always allowed", quorum: 1, decisions: []approval.Verdict{approval.VerdictApprove},
			steps:      []step{{verdict: approval.VerdictReject, approver: "U1"}},
			wantStatus: approval.StatusRejected, wantFinal: approval.VerdictReject},
		{name: "system verdict refused", quorum: 1,
			steps:      []step{{verdict: approval.VerdictExpire, approver: "U1", wantErr: approval.ErrVerdictNotAllowed}},
			wantStatus: approval.StatusPending},
		{name: "stale digest", quorum: 1,
			steps:      []step{{verdict: approval.VerdictApprove, approver: "U1", digest: "0000", wantErr: approval.ErrStaleArgs}},
			wantStatus: approval.StatusPending},
		{name: "quorum two distinct approvers", quorum: 2,
			steps: []step{
				{verdict: approval.VerdictApprove, approver: "U1"},
				{verdict: approval.VerdictApprove, approver: "U1", wantErr: approval.ErrAlreadyVoted},
				{verdict: approval.VerdictApprove, approver: "U2"},
			},
			wantStatus: approval.StatusApproved, wantVotes: 2, wantFinal: approval.VerdictApprove},
		{name: "quorum two same approver twice", quorum: 2,
			steps: []step{
				{verdict: approval.VerdictApprove, approver: "U1"},
				{verdict: approval.VerdictApprove, approver: "U1", wantErr: approval.ErrAlreadyVoted},
			},
			wantStatus: approval.StatusPending, wantVotes: 1},
		{name: "edit quorum one is final", quorum: 1,
			steps:      []step{{verdict: approval.VerdictEdit, approver: "U1", args: edited}},
			wantStatus: approval.StatusApproved, wantVotes: 1, wantArgs: edited, wantFinal: approval.VerdictEdit},
		{name: "edit quorum two resets approvals", quorum: 2,
			steps: []step{
				{verdict: approval.VerdictApprove, approver: "U1"},
				{verdict: approval.VerdictEdit, approver: "U2", args: edited},
				{verdict: approval.VerdictApprove, approver: "U1", digest: "old", wantErr: approval.ErrStaleArgs},
			},
			wantStatus: approval.StatusPending, wantVotes: 1, wantArgs: edited},
		{name: "edit quorum two then approval of edited args", quorum: 2,
			steps: []step{
				{verdict: approval.VerdictApprove, approver: "U1"},
				{verdict: approval.VerdictEdit, approver: "U2", args: edited},
				{verdict: approval.VerdictApprove, approver: "U2", wantErr: approval.ErrAlreadyVoted},
				{verdict: approval.VerdictApprove, approver: "U1"},
			},
			wantStatus: approval.StatusApproved, wantVotes: 2, wantArgs: edited, wantFinal: approval.VerdictApprove},
		{name: "edit with invalid json", quorum: 1,
			steps:      []step{{verdict: approval.VerdictEdit, approver: "U1", args: `{"a":`, wantErr: approval.ErrInvalidArgs}},
			wantStatus: approval.StatusPending},
		{name: "decision after final", quorum: 1,
			steps: []step{
				{verdict: approval.VerdictReject, approver: "U1"},
				{verdict: approval.VerdictApprove, approver: "U2", wantErr: approval.ErrAlreadyDecided},
			},
			wantStatus: approval.StatusRejected, wantFinal: approval.VerdictReject},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			f := mustStore(t, store.Options{})
			r := f.mustCreate(t, func(r *approval.Request) {
				r.Quorum = tt.quorum
				if tt.decisions != nil {
					r.Decisions = tt.decisions
				}
			})
			original := r.Digest
			current := r
			for i, st := range tt.steps {
				d := decision(current, st.verdict, st.approver)
				switch st.digest {
				case "":
				case "old":
					d.Digest = original
				default:
					d.Digest = st.digest
				}
				if st.args != "" {
					d.Args = json.RawMessage(st.args)
				}
				got, err := decide(ctx, f.s, d)
				if !errors.Is(err, st.wantErr) {
					t.Fatalf("step %d: Decide(%s by %s) = %v, want %v", i, st.verdict, st.approver, err, st.wantErr)
				}
				if err == nil {
					current = got
				}
			}
			got, err := f.s.Request(ctx, r.ID)
			if err != nil {
				t.Fatalf("Request(%s) = %v", r.ID, err)
			}
			if got.Status != tt.wantStatus {
				t.Errorf("Status = %s, want %s", got.Status, tt.wantStatus)
			}
			if len(got.Approvals) != tt.wantVotes {
				t.Errorf("len(Approvals) = %d (%+v), want %d", len(got.Approvals), got.Approvals, tt.wantVotes)
			}
			seen := map[string]bool{}
			for _, a := range got.Approvals {
				if seen[a.Approver] {
					t.Errorf("approver %s counted twice", a.Approver)
				}
				seen[a.Approver] = true
			}
			if tt.wantArgs != "" {
				wantDigest, _ := approval.Digest(json.RawMessage(tt.wantArgs))
				if string(got.Args) != tt.wantArgs || got.Digest != wantDigest {
					t.Errorf("Args, Digest = %s, %s; want %s, %s", got.Args, got.Digest, tt.wantArgs, wantDigest)
				}
				if string(got.OriginalArgs) != testArgs {
					t.Errorf("OriginalArgs = %s, want %s", got.OriginalArgs, testArgs)
				}
			} else if string(got.Args) != testArgs || got.Digest != original {
				t.Errorf("Args changed to %s (%s)", got.Args, got.Digest)
			}
			switch {
			case tt.wantFinal == "" && got.Decision != nil:
				t.Errorf("Decision = %+v, want none", got.Decision)
			case tt.wantFinal != "" && (got.Decision == nil || got.Decision.Verdict != tt.wantFinal):
				t.Errorf("Decision = %+v, want verdict %s", got.Decision, tt.wantFinal)
			}
			wakes, err := f.rdb.LLen(ctx, f.prefix+":req:{"+r.ID+"}:wake").Result()
			if err != nil {
				t.Fatal(err)
			}
			if want := int64(0); tt.wantStatus.Decided() {
				want = 1
				if wakes != want {
					t.Errorf("wake list length = %d, want %d", wakes, want)
				}
			} else if wakes != want {
				t.Errorf("wake list length = %d, want %d", wakes, want)
			}
		})
	}
}

func TestDecideAfterFinalSaysWhoAndWhen(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, nil)
	first := decision(r, approval.VerdictReject, "U_FIRST")
	first.Text = "no"
	if _, err := decide(ctx, f.s, first); err != nil {
		t.Fatalf("Decide(first) = %v", err)
	}
	got, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U_LATE"))
	var de *approval.DecidedError
	if !errors.As(err, &de) || !errors.Is(err, approval.ErrAlreadyDecided) {
		t.Fatalf("Decide(late) = %v, want *approval.DecidedError wrapping ErrAlreadyDecided", err)
	}
	if de.By != "U_FIRST" || !de.At.Equal(first.At) || de.Status != approval.StatusRejected || de.RequestID != r.ID {
		t.Errorf("DecidedError = %+v, want by U_FIRST at %v rejected", de, first.At)
	}
	if got == nil || got.Status != approval.StatusRejected || got.Decision.Text != "no" {
		t.Errorf("Decide(late) request = %+v, want the rejected record", got)
	}
	if _, err := decide(ctx, f.s, approval.Decision{RequestID: "req_missing", Verdict: approval.VerdictApprove, Approver: "U1"}); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("Decide(missing) = %v, want ErrNotFound", err)
	}
}

func TestDecidePastDeadlineExpires(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, nil)
	d := decision(r, approval.VerdictApprove, "U1")
	d.At = r.Deadline // at the deadline counts as past it
	got, err := decide(ctx, f.s, d)
	var de *approval.DecidedError
	if !errors.Is(err, approval.ErrExpired) || !errors.As(err, &de) {
		t.Fatalf("Decide(at deadline) = %v, want ErrExpired as *DecidedError", err)
	}
	if de.Status != approval.StatusExpired || de.By != "system" {
		t.Errorf("DecidedError = %+v, want expired by system", de)
	}
	if got == nil || got.Status != approval.StatusExpired || got.Decision == nil || got.Decision.Verdict != approval.VerdictExpire {
		t.Fatalf("Decide(at deadline) request = %+v, want expired", got)
	}
	if n, _ := f.rdb.LLen(ctx, f.prefix+":req:{"+r.ID+"}:wake").Result(); n != 1 {
		t.Errorf("wake list length = %d, want 1", n)
	}
	if exp, err := expireDue(ctx, f.s, r.Deadline.Add(time.Hour)); err != nil || len(exp) != 0 {
		t.Errorf("ExpireDue after = %v, %v; want nothing left to expire", exp, err)
	}
	w, err := f.s.Wait(ctx, r.ID)
	if err != nil || w.Status != approval.StatusExpired {
		t.Errorf("Wait = %v, %v; want expired", w, err)
	}
}

// TestDecideRace has many approvers click at once: the first final decision
// wins and everyone else is told who won.
func TestDecideRace(t *testing.T) {
	tests := []struct {
		name     string
		quorum   int
		mixed    bool // half approve, half reject
		wantWins int  // successful Decide calls
	}{
		{"quorum 1 mixed approve and reject", 1, true, 1},
		{"quorum 1 all approve", 1, false, 1},
		{"quorum 3 all approve", 3, false, 3},
	}
	const clickers = 50
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			ctx := context.Background()
			f := mustStore(t, store.Options{})
			r := f.mustCreate(t, func(r *approval.Request) { r.Quorum = tt.quorum })
			start := make(chan struct{})
			type result struct {
				d   approval.Decision
				r   *approval.Request
				err error
			}
			results := make([]result, clickers)
			var wg sync.WaitGroup
			for i := range clickers {
				v := approval.VerdictApprove
				if tt.mixed && i%2 == 1 {
					v = approval.VerdictReject
				}
				d := decision(r, v, fmt.Sprintf("U%02d", i))
				wg.Go(func() {
					<-start
					got, err := decide(ctx, f.s, d)
					results[i] = result{d, got, err}
				})
			}
			close(start)
			wg.Wait()

			final, err := f.s.Request(ctx, r.ID)
			if err != nil {
				t.Fatal(err)
			}
			if !final.Status.Decided() || final.Decision == nil {
				t.Fatalf("final status %s, want decided", final.Status)
			}
			wins, finals := 0, 0
			for _, res := range results {
				switch {
				case res.err == nil:
					wins++
					if res.r.Status.Decided() {
						finals++
						if res.d.Approver != final.Decision.Approver {
							t.Errorf("final Decide by %s, stored decision by %s", res.d.Approver, final.Decision.Approver)
						}
					}
				default:
					var de *approval.DecidedError
					if !errors.Is(res.err, approval.ErrAlreadyDecided) || !errors.As(res.err, &de) {
						t.Errorf("Decide(%s) = %v, want ErrAlreadyDecided", res.d.Approver, res.err)
						continue
					}
					if de.By != final.Decision.Approver {
						t.Errorf("DecidedError.By = %s, want %s", de.By, final.Decision.Approver)
					}
				}
			}
			if wins != tt.wantWins || finals != 1 {
				t.Errorf("successful decisions = %d (final %d), want %d (final 1)", wins, finals, tt.wantWins)
			}
			if final.Status == approval.StatusApproved && len(final.Approvals) != tt.quorum {
				t.Errorf("len(Approvals) = %d, want %d", len(final.Approvals), tt.quorum)
			}
		})
	}
}

func TestClaimOnce(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, nil)
	if _, err := f.s.Claim(ctx, r.ID, "p0", "", ""); !errors.Is(err, approval.ErrNotApproved) {
		t.Fatalf("Claim(pending) = %v, want ErrNotApproved", err)
	}
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); err != nil {
		t.Fatal(err)
	}
	const claimers = 20
	errs := make([]error, claimers)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range claimers {
		wg.Go(func() {
			<-start
			_, errs[i] = f.s.Claim(ctx, r.ID, fmt.Sprintf("proc-%d", i), "", "")
		})
	}
	close(start)
	wg.Wait()
	winner := -1
	for i, err := range errs {
		switch {
		case err == nil && winner >= 0:
			t.Errorf("Claim by proc-%d and proc-%d both won", winner, i)
		case err == nil:
			winner = i
		case !errors.Is(err, approval.ErrAlreadyClaimed):
			t.Errorf("Claim(proc-%d) = %v, want ErrAlreadyClaimed", i, err)
		}
	}
	if winner < 0 {
		t.Fatal("no Claim won")
	}
	owner, at, err := f.s.Claimant(ctx, r.ID)
	if err != nil || owner != fmt.Sprintf("proc-%d", winner) || !at.Equal(t0) {
		t.Errorf("Claimant = %q, %v, %v; want proc-%d at %v", owner, at, err, winner, t0)
	}

	got, err := f.s.Finish(ctx, r.ID, approval.StatusExecuted, "refunded")
	if err != nil || got.Status != approval.StatusExecuted || got.Result != "refunded" {
		t.Fatalf("Finish = %+v, %v; want executed", got, err)
	}
	tests := []struct {
		name string
		call func() error
		want error
	}{
		{"claim after finish", func() error { _, err := f.s.Claim(ctx, r.ID, "late", "", ""); return err }, approval.ErrAlreadyClaimed},
		{"finish twice", func() error { _, err := f.s.Finish(ctx, r.ID, approval.StatusFailed, "x"); return err }, approval.ErrAlreadyClaimed},
		{"claim missing", func() error { _, err := f.s.Claim(ctx, "req_missing", "p", "", ""); return err }, approval.ErrNotFound},
		{"finish missing", func() error { _, err := f.s.Finish(ctx, "req_missing", approval.StatusFailed, ""); return err }, approval.ErrNotFound},
		{"finish pending", func() error {
			p := f.mustCreate(t, nil)
			_, err := f.s.Finish(ctx, p.ID, approval.StatusExecuted, "")
			return err
		}, approval.ErrNotApproved},
		{"claim rejected", func() error {
			p := f.mustCreate(t, nil)
			if _, err := decide(ctx, f.s, decision(p, approval.VerdictReject, "U1")); err != nil {
				return err
			}
			_, err := f.s.Claim(ctx, p.ID, "p", "", "")
			return err
		}, approval.ErrNotApproved},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := tt.call(); !errors.Is(err, tt.want) {
				t.Errorf("got %v, want %v", err, tt.want)
			}
		})
	}
	if _, err := f.s.Finish(ctx, r.ID, approval.StatusApproved, ""); err == nil {
		t.Error("Finish(status approved) = nil, want an error")
	}
}

func TestCancel(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	r := f.mustCreate(t, nil)
	got, err := cancelRequest(ctx, f.s, r.ID, "U_REQ", "run stopped")
	if err != nil || got.Status != approval.StatusCancelled || got.Decision.Verdict != approval.VerdictCancel || got.Decision.Approver != "U_REQ" || got.Decision.Text != "run stopped" {
		t.Fatalf("Cancel = %+v, %v; want cancelled by U_REQ", got, err)
	}
	if _, err := cancelRequest(ctx, f.s, r.ID, "U_REQ", "again"); !errors.Is(err, approval.ErrAlreadyDecided) {
		t.Errorf("Cancel(again) = %v, want ErrAlreadyDecided", err)
	}
	if _, err := decide(ctx, f.s, decision(r, approval.VerdictApprove, "U1")); !errors.Is(err, approval.ErrAlreadyDecided) {
		t.Errorf("Decide(cancelled) = %v, want ErrAlreadyDecided", err)
	}
	if _, err := cancelRequest(ctx, f.s, "req_missing", "U", ""); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("Cancel(missing) = %v, want ErrNotFound", err)
	}
	if w, err := f.s.Wait(ctx, r.ID); err != nil || w.Status != approval.StatusCancelled {
		t.Errorf("Wait = %v, %v; want cancelled", w, err)
	}
}

func TestBindCardPendingRecent(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	var ids []string
	for i := range 5 {
		r := f.mustCreate(t, func(r *approval.Request) {
			r.Created = t0.Add(time.Duration(5-i) * time.Minute) // created in reverse order
			if i == 4 {
				r.Requester = "U_OTHER"
			}
		})
		ids = append(ids, r.ID)
	}
	card := approval.CardRef{Channel: "C_APPROVALS", TS: "123.456"}
	if first, err := f.s.BindCard(ctx, ids[0], card); err != nil || !first {
		t.Fatalf("BindCard = %v, %v; want bound by this call", first, err)
	}
	if first, err := f.s.BindCard(ctx, ids[0], card); err != nil || first {
		t.Errorf("BindCard(same message again) = %v, %v; want nil, bound already (false)", first, err)
	}
	if _, err := f.s.BindCard(ctx, ids[0], approval.CardRef{Channel: "C_APPROVALS", TS: "999.000"}); !errors.Is(err, approval.ErrExists) {
		t.Errorf("BindCard(another message) = %v, want ErrExists (the first card stays the card)", err)
	}
	if _, err := f.s.BindCard(ctx, "req_missing", card); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("BindCard(missing) = %v, want ErrNotFound", err)
	}
	if first, err := f.s.StartCardPost(ctx, ids[1]); err != nil || !first {
		t.Errorf("StartCardPost = %v, %v; want the first attempt", first, err)
	}
	if first, err := f.s.StartCardPost(ctx, ids[1]); err != nil || first {
		t.Errorf("StartCardPost again = %v, %v; want a later attempt", first, err)
	}
	if _, err := f.s.StartCardPost(ctx, "req_missing"); !errors.Is(err, approval.ErrNotFound) {
		t.Errorf("StartCardPost(missing) = %v, want ErrNotFound", err)
	}
	if r, _ := f.s.Request(ctx, ids[0]); r.Card.TS != "123.456" || r.Card.Channel != "C_APPROVALS" {
		t.Errorf("Card = %+v, want C_APPROVALS/123.456", r.Card)
	}
	if _, err := decide(ctx, f.s, approval.Decision{RequestID: ids[2], Verdict: approval.VerdictReject, Approver: "U1", Digest: mustDigest(t), At: t0}); err != nil {
		t.Fatal(err)
	}
	pending, err := f.s.Pending(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := idsOf(pending), []string{ids[4], ids[3], ids[1], ids[0]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Pending = %v, want oldest first %v", got, want)
	}
	recent, err := f.s.RecentByRequester(ctx, "U_REQ", 3)
	if err != nil {
		t.Fatal(err)
	}
	if got, want := idsOf(recent), []string{ids[0], ids[1], ids[2]}; fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("RecentByRequester = %v, want newest first %v", got, want)
	}
}

func mustDigest(tb testing.TB) string {
	tb.Helper()
	d, err := approval.Digest(json.RawMessage(testArgs))
	if err != nil {
		tb.Fatal(err)
	}
	return d
}

func idsOf(rs []*approval.Request) []string {
	var out []string
	for _, r := range rs {
		out = append(out, r.ID)
	}
	return out
}

func TestRememberAndFirstSeen(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	if ok, err := f.s.Remembered(ctx, "U1", "refund", "abc"); err != nil || ok {
		t.Fatalf("Remembered before = %v, %v; want false", ok, err)
	}
	if err := f.s.Remember(ctx, "U1", "refund", "abc", time.Hour); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		requester, tool, digest string
		want                    bool
	}{
		{"U1", "refund", "abc", true},
		{"U2", "refund", "abc", false},
		{"U1", "email", "abc", false},
		{"U1", "refund", "abd", false},
	}
	for _, tt := range tests {
		if ok, err := f.s.Remembered(ctx, tt.requester, tt.tool, tt.digest); err != nil || ok != tt.want {
			t.Errorf("Remembered(%s, %s, %s) = %v, %v; want %v", tt.requester, tt.tool, tt.digest, ok, err, tt.want)
		}
	}
	ttl, err := f.rdb.PTTL(ctx, f.prefix+":remember:{U1}:refund:abc").Result()
	if err != nil || ttl <= 59*time.Minute || ttl > time.Hour {
		t.Errorf("remember TTL = %v, %v; want about 1h", ttl, err)
	}

	if ok, err := f.s.FirstSeen(ctx, "Ev1", time.Second); err != nil || !ok {
		t.Fatalf("FirstSeen(Ev1) = %v, %v; want true", ok, err)
	}
	if ok, err := f.s.FirstSeen(ctx, "Ev1", time.Second); err != nil || ok {
		t.Errorf("FirstSeen(Ev1) again = %v, %v; want false", ok, err)
	}
	ttl, err = f.rdb.PTTL(ctx, f.prefix+":event:Ev1").Result()
	if err != nil || ttl < store.MinEventTTL-time.Minute {
		t.Errorf("event TTL = %v, %v; want clamped to at least %v", ttl, err, store.MinEventTTL)
	}
}

// TestPendingFromAndRequests: PendingFrom lists, oldest first, the pending
// requests created at or after a time, with their creation to the
// millisecond and no decided one, PendingRank a page of them by rank;
// PendingRecords reads records in the order asked, nil for one gone or
// decided.
func TestPendingFromAndRequests(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	var rs []*approval.Request
	for i := range 4 {
		rs = append(rs, f.mustCreate(t, func(r *approval.Request) { r.Created = t0.Add(time.Duration(i) * time.Minute) }))
	}
	ref := func(r *approval.Request) approval.PendingRef {
		return approval.PendingRef{ID: r.ID, Created: r.Created}
	}
	same := func(a, b approval.PendingRef) bool { return a.ID == b.ID && a.Created.Equal(b.Created) }
	for _, c := range []struct {
		name          string
		from          time.Time
		offset, count int
		want          []approval.PendingRef
	}{
		{"from t0+1m", t0.Add(time.Minute), 0, 10, []approval.PendingRef{ref(rs[1]), ref(rs[2]), ref(rs[3])}}, // rs[0] older
		{"all", time.Time{}, 0, 10, []approval.PendingRef{ref(rs[0]), ref(rs[1]), ref(rs[2]), ref(rs[3])}},
		{"a page", time.Time{}, 1, 2, []approval.PendingRef{ref(rs[1]), ref(rs[2])}},
		{"past the end", time.Time{}, 4, 10, []approval.PendingRef{}},
	} {
		got, err := f.s.PendingFrom(ctx, c.from, c.offset, c.count)
		if err != nil {
			t.Fatal(err)
		}
		if !slices.EqualFunc(got, c.want, same) {
			t.Errorf("%s: PendingFrom = %v, want %v", c.name, got, c.want)
		}
	}
	if got, err := f.s.PendingRank(ctx, 2, 5); err != nil || !slices.EqualFunc(got, []approval.PendingRef{ref(rs[2]), ref(rs[3])}, same) {
		t.Errorf("PendingRank(2, 5) = %v, %v; want rs[2], rs[3]", got, err)
	}
	// Decided: on a single node the decision leaves the index in its
	// script; on a Cluster a later step (or a reader) removes the entry.
	if _, err := f.s.RecordDecision(ctx, decision(rs[2], approval.VerdictReject, "U_BOSS")); err != nil {
		t.Fatal(err)
	}
	recs, err := f.s.PendingRecords(ctx, []string{rs[3].ID, "req_gone", rs[2].ID, rs[0].ID})
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 4 || recs[0] == nil || recs[0].ID != rs[3].ID || recs[1] != nil || recs[2] != nil || recs[3] == nil || recs[3].ID != rs[0].ID {
		t.Errorf("PendingRecords = %v, want rs[3], nil (gone), nil (decided), rs[0]", recs)
	}
	if got, err := f.s.PendingFrom(ctx, time.Time{}, 0, 10); err != nil || !slices.EqualFunc(got, []approval.PendingRef{ref(rs[0]), ref(rs[1]), ref(rs[3])}, same) {
		t.Errorf("after PendingRecords, PendingFrom = %v, %v; want rs[0], rs[1], rs[3] (the decided one's entry removed)", got, err)
	}
}

// cmdCount counts the commands a client sends.
type cmdCount struct {
	mu sync.Mutex
	n  int
}

func (c *cmdCount) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *cmdCount) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		c.mu.Lock()
		c.n++
		c.mu.Unlock()
		return next(ctx, cmd)
	}
}
func (c *cmdCount) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		c.mu.Lock()
		c.n += len(cmds)
		c.mu.Unlock()
		return next(ctx, cmds)
	}
}

func (c *cmdCount) take() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := c.n
	c.n = 0
	return n
}

// TestPendingCountAndAges: the figures of the pending metrics come from the
// indexes in a few commands whatever the backlog (they read every pending
// record per scrape), and an oldest index entry left by a decided request
// is dropped rather than holding the oldest age up.
func TestPendingCountAndAges(t *testing.T) {
	ctx := context.Background()
	f := mustStore(t, store.Options{})
	cc := &cmdCount{}
	f.rdb.AddHook(cc)
	stale := f.mustCreate(t, func(r *approval.Request) { r.Created = t0.Add(-time.Hour) })
	if _, err := f.s.RecordDecision(ctx, decision(stale, approval.VerdictReject, "U_BOSS")); err != nil {
		t.Fatal(err)
	}
	// The decision's index removal lost (a failed write after the decision).
	if err := f.rdb.ZAdd(ctx, f.prefix+":pending", redis.Z{Score: float64(stale.Created.UnixMilli()), Member: stale.ID}).Err(); err != nil {
		t.Fatal(err)
	}
	oldest := f.mustCreate(t, func(r *approval.Request) { r.Created = t0; r.Deadline = t0.Add(30 * time.Second) })
	for i := range 200 {
		f.mustCreate(t, func(r *approval.Request) { r.Created = t0.Add(time.Duration(i+1) * time.Second) })
	}
	now := t0.Add(5 * time.Minute)
	cc.take()
	got, overdue, err := f.s.PendingAges(ctx, now)
	if err != nil {
		t.Fatal(err)
	}
	if !got.Equal(oldest.Created) || overdue != 1 {
		t.Errorf("PendingAges = %v, %d overdue; want %v (the stale entry skipped), 1", got, overdue, oldest.Created)
	}
	if n := cc.take(); n > 6 {
		t.Errorf("PendingAges sent %d commands with 202 pending, want at most 6", n)
	}
	if n, err := f.s.PendingCount(ctx); err != nil || n != 201 {
		t.Errorf("PendingCount = %d, %v; want 201 (the stale entry was removed)", n, err)
	}
	if n := cc.take(); n != 1 {
		t.Errorf("PendingCount sent %d commands, want 1", n)
	}
	for _, k := range []string{f.prefix + ":pending", f.prefix + ":deadlines"} { // apart: other slots on a Cluster
		if err := f.rdb.Del(ctx, k).Err(); err != nil {
			t.Fatal(err)
		}
	}
	if got, overdue, err := f.s.PendingAges(ctx, now); err != nil || !got.IsZero() || overdue != 0 {
		t.Errorf("PendingAges with none pending = %v, %d, %v; want zero, 0, nil", got, overdue, err)
	}
}
