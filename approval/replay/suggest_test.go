package replay_test

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/replay"
)

// mailPolicy asks a person about every email.
func mailPolicy() approval.Policy {
	return approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"send_email": {Review: approval.ReviewAlways, Decisions: []approval.Verdict{approve, edit, reject}},
	}}
}

// declinedMail are the five calls of send_email people rejected in the
// suggestion fixture, each unlike the approved ones in one way.
var declinedMail = []struct{ why, requester, args string }{
	{"another recipient", "api:mailer", `{"to":"boss@evil.example","subject":"Nightly report 4","attachments":1}`},
	{"a command chained in the subject", "api:mailer", `{"to":"ops@example.com","subject":"Nightly report 5; rm -rf /","attachments":1}`},
	{"more attachments than ever approved", "api:mailer", `{"to":"ops@example.com","subject":"Nightly report 6","attachments":50}`},
	{"an extra field", "api:mailer", `{"to":"ops@example.com","subject":"Nightly report 7","attachments":1,"bcc":"x@evil.example"}`},
	{"another requester", "api:other", `{"to":"ops@example.com","subject":"Nightly report 8","attachments":1}`},
}

// recordMail records 20 approvals of send_email by api:mailer, unedited,
// and the five declined calls, interleaved.
func recordMail(t *testing.T) *world {
	t.Helper()
	w := mustWorld(t, mailPolicy())
	for i := 1; i <= 20; i++ {
		p := w.propose(t, "send_email", "api:mailer", fmt.Sprintf(`{"to":"ops@example.com","subject":"Nightly report %d","attachments":%d}`, i, 1+i%3))
		w.decide(t, p.Request, approve, "U0ANN", 20*time.Second, "")
		if i%4 == 0 {
			d := declinedMail[i/4-1]
			p := w.propose(t, "send_email", d.requester, d.args)
			w.decide(t, p.Request, reject, "U0ANN", 40*time.Second, "")
		}
	}
	return w
}

// TestSuggestNarrow: the suggestion drawn from 20 unedited approvals lets
// all 20 through and none of the 5 rejected calls of the same tool, in the
// replay and when the rule itself is asked.
func TestSuggestNarrow(t *testing.T) {
	w := recordMail(t)
	cur := replay.Policy{Policy: mailPolicy()}
	got, err := replay.Suggest(context.Background(), w.audit, replay.SuggestOptions{Current: cur, Min: 20})
	if err != nil {
		t.Fatalf("Suggest = %v", err)
	}
	if len(got.Suggestions) != 1 {
		t.Fatalf("Suggest = %d suggestions (%+v), want 1", len(got.Suggestions), got)
	}
	s := got.Suggestions[0]
	if s.Tool != "send_email" || s.Requester != "api:mailer" || s.Approvals != 20 || s.LetThrough != 20 || s.Regressions != 0 || s.StillAsked != 5 {
		t.Errorf("suggestion = %+v, want send_email by api:mailer, 20 approvals, 20 let through, 0 regressions, 5 declined still asked", s)
	}
	// The rule itself, through the gate: every rejected call asks a person.
	p := mailPolicy()
	tp := p.Tools["send_email"]
	tp.Review, tp.When = approval.ReviewAuto, s.When
	p.Tools["send_email"] = tp
	gate, err := approval.NewGate(p)
	if err != nil {
		t.Fatalf("NewGate(suggested %s) = %v", s.When, err)
	}
	for _, d := range declinedMail {
		as, err := gate.AssessExternal(approval.ToolCall{Tool: "send_email", Args: json.RawMessage(d.args)}, d.requester)
		if err != nil || !as.NeedsHuman {
			t.Errorf("suggested rule on the rejected call with %s (%s): needs human %v, %v; want a person", d.why, d.args, as.NeedsHuman, err)
		}
	}
	as, err := gate.AssessExternal(approval.ToolCall{Tool: "send_email", Args: json.RawMessage(`{"to":"ops@example.com","subject":"Nightly report 12","attachments":2}`)}, "api:mailer")
	if err != nil || as.NeedsHuman {
		t.Errorf("suggested rule on an approved call: needs human %v, %v; want none", as.NeedsHuman, err)
	}
	t.Logf("suggested: %s", s.When)
	// The patch is YAML for the policy file, the rule in it.
	var b strings.Builder
	if err := replay.WriteSuggestions(&b, got, "policy.yaml"); err != nil {
		t.Fatalf("WriteSuggestions = %v", err)
	}
	if !strings.Contains(b.String(), "  - name: 'send_email'\n    review:\n      mode: auto\n") || !strings.Contains(b.String(), strings.ReplaceAll(s.When, "'", "''")) {
		t.Errorf("patch =\n%s\nwant the tool's review with the rule", b.String())
	}
}

// TestSuggestDeclines: fewer approvals than --min, or an approval marked
// wrong afterwards, make no suggestion.
func TestSuggestDeclines(t *testing.T) {
	tests := []struct {
		name   string
		min    int
		wrong  bool
		wantNo string
	}{
		{name: "fewer than min", min: 21},
		{name: "an approval marked wrong", min: 20, wrong: true, wantNo: "marked wrong"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			w := mustWorld(t, mailPolicy())
			for i := 1; i <= 20; i++ {
				p := w.propose(t, "send_email", "api:mailer", fmt.Sprintf(`{"to":"ops@example.com","subject":"r%d"}`, i))
				w.decide(t, p.Request, approve, "U0ANN", 20*time.Second, "")
				if i == 3 && tc.wrong {
					w.run(t, p.Request.ID)
					w.markWrong(t, p.Request.ID, "U0BOB")
				}
			}
			got, err := replay.Suggest(context.Background(), w.audit, replay.SuggestOptions{Current: replay.Policy{Policy: mailPolicy()}, Min: tc.min})
			if err != nil {
				t.Fatalf("Suggest = %v", err)
			}
			if len(got.Suggestions) != 0 {
				t.Errorf("Suggest = %+v, want no suggestion", got.Suggestions)
			}
			if tc.wantNo != "" && (len(got.NotSuggested) != 1 || !strings.Contains(got.NotSuggested[0].Why, tc.wantNo)) {
				t.Errorf("not suggested = %+v, want one saying %q", got.NotSuggested, tc.wantNo)
			}
		})
	}
}
