package approval_test

import (
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"reflect"
	"strconv"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
)

// TestDecodeEventRoundTrip writes each event's typed data as the audit
// writer does (JSON, redacted) and reads it back with DecodeEvent: the
// same type and the same values. Every event the package declares is
// listed, so an event added without its typed data fails here.
func TestDecodeEventRoundTrip(t *testing.T) {
	at := time.Date(2026, 12, 2, 14, 5, 0, 0, time.UTC)
	conf := 0.8
	args := json.RawMessage(`{"amount":64,"order":"1234"}`)
	signals := []approval.Signal{{Code: "rule", Text: "refund above $50"}}
	cases := []struct {
		event approval.Event
		data  any // nil: the event carries no data
	}{
		{approval.EventRunStarted, approval.RunStartedEvent{Origin: approval.Origin{Team: "T1", Channel: "C1", ThreadTS: "1.2"}, Text: "refund order 1234", EventID: "Ev1", FollowUp: true}},
		{approval.EventProposed, approval.ProposedEvent{CallID: "call_1", Args: args, Reason: "damaged", Confidence: &conf}},
		{approval.EventCallRefused, approval.CallErrorEvent{CallID: "call_1", Error: "refused by policy: too much", DenyRule: "double(args.amount) > 1000.0", Args: args}},
		{approval.EventAssessed, approval.AssessedEvent{CallID: "call_1", NeedsHuman: true, Signals: signals, Quorum: 2}},
		{approval.EventAutoApproved, approval.CallEvent{CallID: "call_1"}},
		{approval.EventRemembered, approval.RememberedEvent{CallID: "call_1", Digest: "d1", Requester: "U1"}},
		{approval.EventGranted, approval.GrantedEvent{GrantID: "g1", Requester: "U1", Channel: "C1", ThreadTS: "1.2", Expires: at}},
		{approval.EventGrantRevoked, approval.GrantRevokedEvent{GrantID: "g1", GrantedBy: "U2", RevokedBy: "U3"}},
		{approval.EventPreauthorized, approval.PreauthorizedEvent{CallID: "call_2", GrantID: "g1", GrantedBy: "U2", GrantRequestID: "req_1", Expires: at, Signals: signals}},
		{approval.EventRequested, approval.RequestedEvent{CallID: "call_1", Args: args, Digest: "d1", Deadline: at, Quorum: 1, Signals: signals,
			Preview: approval.Preview{Summary: "Refund", Facts: []approval.Fact{{Label: "Order total", Value: "$64.00"}}}, Decisions: []approval.Verdict{approval.VerdictApprove},
			Created: at, Reason: "damaged", Confidence: &conf, Requester: "U1"}},
		{approval.EventRequested, approval.RequestedEvent{CallID: "call_q", Args: json.RawMessage(`{"msg":"Which warehouse?"}`), Digest: "d3", Deadline: at, Quorum: 1,
			Decisions: []approval.Verdict{approval.VerdictRespond}, Created: at, Requester: "humanlayer:support", Kind: approval.KindContact,
			Choices: []approval.Choice{{Name: "north", Title: "North", PromptFill: "Ship from north"}}}},
		{approval.EventCardPosted, approval.CardPostedEvent{Channel: "C2", TS: "3.4"}},
		{approval.EventStepUpOffered, approval.StepUpEvent{Verdict: approval.VerdictApprove, Methods: []approval.StepUpMethod{approval.StepUpPasskey}, Digest: "d1", Allow: true}},
		{approval.EventStepUpVerified, approval.StepUpEvent{Verdict: approval.VerdictEdit, Methods: []approval.StepUpMethod{approval.StepUpPasskey}, Credential: "cred", Digest: "d2"}},
		{approval.EventStepUpRefused, approval.StepUpEvent{Verdict: approval.VerdictApprove, Digest: "d1", Reason: "passkey_not_verified"}},
		{approval.EventPasskeyOffered, approval.PasskeyEvent{User: "U1", VouchedBy: "U2"}},
		{approval.EventPasskeyEnrolled, approval.PasskeyEvent{User: "U1", Credential: "cred", Email: "u1@example.com"}},
		{approval.EventPasskeyRefused, approval.PasskeyEvent{User: "U1", Reason: "email_mismatch"}},
		{approval.EventPasskeyRevoked, approval.PasskeyEvent{User: "U1", Credential: "cred"}},
		{approval.EventApprovalVote, approval.DecidedEvent{Verdict: approval.VerdictApprove, Digest: "d1", Status: approval.StatusPending, Created: at, DecisionMS: 1200, Approvals: 1, Quorum: 2}},
		{approval.EventDecided, approval.DecidedEvent{Verdict: approval.VerdictEdit, Digest: "d1", Status: approval.StatusApproved, Created: at, DecisionMS: 900,
			Args: json.RawMessage(`{"amount":50,"order":"1234"}`), OriginalArgs: args, NewDigest: "d2"}},
		{approval.EventDecided, approval.DecidedEvent{Verdict: approval.VerdictReject, Digest: "d1", Status: approval.StatusRejected, Created: at, DecisionMS: 700,
			Text: "wrong customer", Choice: "wrong_customer"}},
		{approval.EventDecisionRefuse, approval.RefusalEvent{Verdict: approval.VerdictApprove, Reason: "foreign_team", Team: "T9"}},
		{approval.EventExpired, approval.ExpiredEvent{Deadline: at, Created: at.Add(-time.Hour)}},
		{approval.EventCancelled, approval.ReasonEvent{Reason: "the approval card could not be posted"}},
		{approval.EventReminded, approval.RemindedEvent{N: 2, WaitingSince: at, Deadline: at.Add(time.Hour)}},
		{approval.EventEscalated, approval.EscalatedEvent{To: approval.Approvers{Usergroups: []string{"S1"}}, Widened: true, Approvers: approval.Approvers{Users: []string{"U2"}, Usergroups: []string{"S1"}}}},
		{approval.EventExecuting, approval.ExecutingEvent{CallID: "call_1", Args: args, Gated: true}},
		{approval.EventExecuted, approval.ExecutedEvent{CallID: "call_1", Result: `{"id":"RF-1"}`, DurationMS: 80}},
		{approval.EventFailed, approval.ExecutedEvent{CallID: "call_1", Result: "HTTP 500", DurationMS: 20}},
		{approval.EventFailed, approval.CallErrorEvent{CallID: "call_1", Error: "arguments differ from the approved ones"}},
		{approval.EventOutcomeUnknown, approval.CallEvent{CallID: "call_1"}},
		{approval.EventLost, approval.ReasonEvent{Reason: "the request's record vanished"}},
		{approval.EventAbandoned, approval.AbandonedEvent{Approver: "U2", ApprovedAt: at, ClaimWindowMS: 300000, Caller: "api:agent", Created: at.Add(-time.Hour)}},
		{approval.EventReopened, approval.ReopenedEvent{Need: 2, Have: 1, Reason: "the policy in force asks 2 approvals", Deadline: at.Add(time.Hour)}},
		{approval.EventScheduled, approval.ScheduledEvent{RunAt: at, WindowMS: 300000}},
		{approval.EventRunNow, approval.WindowDecisionEvent{Verdict: approval.VerdictApprove, Digest: "d1", RunAt: at, Created: at.Add(-time.Minute), DecisionMS: 60000}},
		{approval.EventCancelled, approval.WindowDecisionEvent{Verdict: approval.VerdictCancel, Reason: "not now", Digest: "d1", RunAt: at, Created: at.Add(-time.Minute), DecisionMS: 30000}},
		{approval.EventWindowElapsed, approval.WindowElapsedEvent{RunAt: at, Created: at.Add(-5 * time.Minute)}},
		{approval.EventSampled, approval.SampledEvent{CallID: "call_3", Args: args, Digest: "d1", Status: approval.StatusExecuted, Result: "ok", Rate: 0.05, Created: at, Requester: "U1"}},
		{approval.EventSampleReviewed, approval.FeedbackEvent{Status: approval.StatusExecuted, Sampled: true, Created: at}},
		{approval.EventMarkedWrong, approval.FeedbackEvent{Reason: "wrong customer", Status: approval.StatusExecuted, Verdict: approval.VerdictApprove, DecidedBy: "U2", Created: at}},
		{approval.EventAPIRefused, approval.APIRefusedEvent{Key: "support-bot", Method: "POST", Path: "/v1/requests", Status: 400, Code: "invalid_field", Field: "confidence", Message: "confidence must be between 0 and 1", HTTPReqID: "h1"}},
		{approval.EventWebhookSent, approval.WebhookEvent{DeliveryID: "whd_1", Endpoint: "hooks.example.com", Attempt: 2, HTTPStatus: 200}},
		{approval.EventWebhookFailed, approval.WebhookEvent{DeliveryID: "whd_1", Endpoint: "hooks.example.com", Attempt: 5, HTTPStatus: 500, Error: "HTTP 500", GaveUp: true}},
		{approval.EventRunFinished, approval.RunFinishedEvent{Status: approval.RunDone, Steps: 3,
			Result: approval.RunResult{RunID: "run_1", Status: approval.RunDone, Answer: "Refunded.", Approved: 1}}},
	}
	seen := map[approval.Event]bool{}
	for _, c := range cases {
		seen[c.event] = true
		t.Run(string(c.event), func(t *testing.T) {
			raw, err := json.Marshal(approval.Redact(c.data, nil))
			if err != nil {
				t.Fatal(err)
			}
			got := approval.DecodeEvent(approval.Entry{Event: c.event, Data: raw})
			if got == nil {
				t.Fatalf("DecodeEvent(%s) = nil, want %T", c.event, c.data)
			}
			if g := reflect.ValueOf(got).Elem().Interface(); !reflect.DeepEqual(g, c.data) {
				t.Errorf("DecodeEvent(%s) = %#v, want %#v", c.event, g, c.data)
			}
		})
	}
	for _, ev := range declaredEvents(t) {
		if !seen[ev] {
			t.Errorf("event %s has no case here: declare its typed data in events.go and add it", ev)
		}
	}
}

// TestDecodeEventLenient: one field of an unexpected type keeps the rest,
// and data that is not an object gives the zero value, never a panic.
func TestDecodeEventLenient(t *testing.T) {
	got := approval.DecodeEvent(approval.Entry{Event: approval.EventDecided, Data: json.RawMessage(`{"verdict":"reject","decision_ms":"soon","text":"too much"}`)})
	d, ok := got.(*approval.DecidedEvent)
	if !ok || d.Verdict != approval.VerdictReject || d.Text != "too much" || d.DecisionMS != 0 {
		t.Errorf("DecodeEvent(odd decided) = %#v, want verdict and text kept", got)
	}
	got = approval.DecodeEvent(approval.Entry{Event: approval.EventExecuted, Data: json.RawMessage(`[1,2]`)})
	if e, ok := got.(*approval.ExecutedEvent); !ok || *e != (approval.ExecutedEvent{}) {
		t.Errorf("DecodeEvent(array) = %#v, want an empty ExecutedEvent", got)
	}
	if got := approval.DecodeEvent(approval.Entry{Event: "made_up"}); got != nil {
		t.Errorf("DecodeEvent(unknown event) = %#v, want nil", got)
	}
}

// declaredEvents reads the Event constants declared in audit.go.
func declaredEvents(t *testing.T) []approval.Event {
	t.Helper()
	f, err := parser.ParseFile(token.NewFileSet(), "audit.go", nil, 0)
	if err != nil {
		t.Fatal(err)
	}
	var out []approval.Event
	ast.Inspect(f, func(n ast.Node) bool {
		vs, ok := n.(*ast.ValueSpec)
		if !ok || vs.Type == nil || len(vs.Values) != 1 {
			return true
		}
		if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "Event" {
			return true
		}
		if lit, ok := vs.Values[0].(*ast.BasicLit); ok {
			if v, err := strconv.Unquote(lit.Value); err == nil {
				out = append(out, approval.Event(v))
			}
		}
		return true
	})
	if len(out) < 20 {
		t.Fatalf("found %d Event constants in audit.go, want them all", len(out))
	}
	return out
}
