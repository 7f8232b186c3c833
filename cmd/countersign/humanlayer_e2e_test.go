package main_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
)

// hlCall sends one HumanLayer SDK call (the SDK's path under
// HUMANLAYER_API_BASE, its Authorization header, its JSON) to the demo and
// returns the status and the decoded answer.
func hlCall(t *testing.T, d *main.Demo, key, method, path, body string) (int, map[string]any) {
	t.Helper()
	var rd io.Reader
	if body != "" {
		rd = strings.NewReader(body)
	}
	req, err := http.NewRequest(method, "http://"+d.Main.Addr()+"/humanlayer/v1"+path, rd)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var out map[string]any
	if err := json.Unmarshal(raw, &out); err != nil {
		t.Fatalf("%s %s = %d, body not a JSON object: %s", method, path, resp.StatusCode, raw)
	}
	return resp.StatusCode, out
}

// field reads a dotted path ("status.approved") of a decoded answer.
func field(m map[string]any, path string) any {
	var v any = m
	for _, k := range strings.Split(path, ".") {
		obj, ok := v.(map[string]any)
		if !ok {
			return nil
		}
		v = obj[k]
	}
	return v
}

// TestHumanLayerFunctionCall: a function call created the way HumanLayer's
// Python SDK does (require_approval: POST /function_calls with the SDK's
// model_dump, a Slack channel of the caller's choosing) gets one card in
// the approvals channel, with no Edit (the SDK cannot honour one); a
// re-POST of its call id makes no second card; GET says approved: null
// until a click approves it, then approved: true; spec.state comes back
// unchanged. A wrong key is 401 with a JSON error, and the SDK's respond
// call is refused: decisions come only from Slack.
func TestHumanLayerFunctionCall(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	body := `{"run_id": "deploy-agent-x1", "call_id": "call-hl-1",
	  "spec": {"fn": "deploy_service", "kwargs": {"service": "web", "version": "1.4.2"},
	    "channel": {"slack": {"channel_or_user_id": "C0ELSEWHERE", "context_about_channel_or_user": "the ops channel",
	      "bot_token": null, "allowed_responder_ids": null, "experimental_slack_blocks": null, "thread_ts": null},
	      "sms": null, "whatsapp": null, "email": null},
	    "reject_options": null, "state": {"ticket": "CHG-1042"}},
	  "status": null}`
	code, created := hlCall(t, d, d.APIKey, "POST", "/function_calls", body)
	id, _ := field(created, "countersign.request_id").(string)
	if code != http.StatusCreated || id == "" || field(created, "status.approved") != nil || field(created, "status.requested_at") == nil {
		t.Fatalf("POST /function_calls = %d %v, want 201, pending (approved null), a request id", code, created)
	}
	card := apiCard(t, d, id)
	text := string(card.Blocks)
	for _, want := range []string{"through the HumanLayer API by key `demo-agent`", "deploy_service", "1.4.2"} {
		if !strings.Contains(text, want) {
			t.Errorf("card does not show %q: %s", want, text)
		}
	}
	if strings.Contains(text, "cs_edit") {
		t.Errorf("card offers Edit, which the SDK cannot honour: %s", text)
	}
	if card.Channel != d.Cast.Approvals.ID {
		t.Errorf("card in %s, want the approvals channel %s (spec.channel is not the caller's to choose)", card.Channel, d.Cast.Approvals.ID)
	}

	code, again := hlCall(t, d, d.APIKey, "POST", "/function_calls", body)
	if code != http.StatusOK || field(again, "countersign.request_id") != id {
		t.Errorf("re-POST of call-hl-1 = %d %v, want 200 and the same request %s", code, again, id)
	}
	code, got := hlCall(t, d, d.APIKey, "GET", "/function_calls/call-hl-1", "")
	if code != http.StatusOK || field(got, "status.approved") != nil || field(got, "spec.fn") != "deploy_service" {
		t.Errorf("GET while pending = %d %v, want approved null", code, got)
	}

	code, refused := hlCall(t, d, d.APIKey, "POST", "/agent/function_calls/call-hl-1/respond", `{"approved": true, "comment": "self-approved"}`)
	if code != http.StatusForbidden || field(refused, "error.code") != "decision_not_allowed" || !strings.Contains(field(refused, "error.message").(string), "Slack") {
		t.Errorf("respond = %d %v, want 403 decision_not_allowed saying decisions come from Slack", code, refused)
	}
	code, unauth := hlCall(t, d, "csk_wrong", "GET", "/function_calls/call-hl-1", "")
	if code != http.StatusUnauthorized || field(unauth, "error.code") != "unauthenticated" {
		t.Errorf("GET with a wrong key = %d %v, want 401 unauthenticated", code, unauth)
	}

	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	waitAudit(t, d, id, approval.EventDecided)
	code, got = hlCall(t, d, d.APIKey, "GET", "/function_calls/call-hl-1", "")
	if code != http.StatusOK || field(got, "status.approved") != true || field(got, "status.responded_at") == nil ||
		field(got, "countersign.approver") != d.Cast.Approver.ID {
		t.Fatalf("GET after the click = %d %v, want approved true by %s", code, got, d.Cast.Approver.ID)
	}
	if st := field(got, "spec.state.ticket"); st != "CHG-1042" {
		t.Errorf("spec.state.ticket = %v, want CHG-1042 back", st)
	}
	if kw := field(got, "spec.kwargs.version"); kw != "1.4.2" {
		t.Errorf("spec.kwargs.version = %v, want 1.4.2", kw)
	}
	cards := 0
	for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
		if strings.Contains(string(m.Blocks), id) {
			cards++
		}
	}
	if cards != 1 {
		t.Errorf("approvals channel has %d cards for %s, want 1", cards, id)
	}
}

// TestHumanLayerRejectOption: the caller's reject_options are the reject
// modal's choices; the one picked comes back as reject_option_name with
// the approver's text as comment, or, with no text, the option's
// prompt_fill (the SDK needs a comment on every rejection).
func TestHumanLayerRejectOption(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	carol := d.Cast.SecondApprover.ID
	opts := `[{"name": "wrong_service", "title": "Wrong service", "description": "deploy another one", "prompt_fill": "deploy the API instead", "interactive": false},
	  {"name": "not_now", "title": "Not now", "description": null, "prompt_fill": null, "interactive": false}]`
	cases := []struct {
		name, callID string
		values       map[string]map[string]any
		option       string
		comment      string
	}{
		{"choice and text", "call-rej-1", map[string]map[string]any{"choice": {"choice": "not_now"}, "reason": {"text": "after the sale ends"}}, "not_now", "after the sale ends"},
		{"choice alone", "call-rej-2", map[string]map[string]any{"choice": {"choice": "wrong_service"}}, "wrong_service", "deploy the API instead"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"run_id": "r1", "call_id": "` + tc.callID + `", "spec": {"fn": "deploy_service", "kwargs": {"service": "db"},
			  "channel": null, "reject_options": ` + opts + `, "state": null}, "status": null}`
			code, created := hlCall(t, d, d.APIKey, "POST", "/function_calls", body)
			id, _ := field(created, "countersign.request_id").(string)
			if code != http.StatusCreated || id == "" {
				t.Fatalf("POST = %d %v", code, created)
			}
			card := apiCard(t, d, id)
			if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, "cs_reject"); err != nil {
				t.Fatalf("Click: %v", err)
			}
			v := openModal(t, d, carol)
			if !bytes.Contains(v.Blocks, []byte("Wrong service")) || !bytes.Contains(v.Blocks, []byte("radio_buttons")) {
				t.Fatalf("reject modal does not offer the reject options: %s", v.Blocks)
			}
			if res, err := d.Workspace.SubmitView(carol, v.ID, tc.values); err != nil || !res.Closed {
				t.Fatalf("SubmitView = %+v, %v", res, err)
			}
			waitAudit(t, d, id, approval.EventDecided)
			code, got := hlCall(t, d, d.APIKey, "GET", "/function_calls/"+tc.callID, "")
			if code != http.StatusOK || field(got, "status.approved") != false || field(got, "status.reject_option_name") != tc.option ||
				field(got, "status.comment") != tc.comment {
				t.Fatalf("GET = %d %v, want approved false, reject_option_name %q, comment %q", code, got, tc.option, tc.comment)
			}
		})
	}
}

// TestHumanLayerContactRequest: human_as_tool's question (POST
// /contact_requests) becomes a Respond card in the approvals channel with
// the question and the suggested answers; Answer opens a modal; the answer
// typed there (and the option picked) comes back on GET as status.response
// and response_option_name, and the card is redrawn as answered. The
// audit tells it like any request.
func TestHumanLayerContactRequest(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	bob := d.Cast.Approver.ID
	body := `{"run_id": "support-agent-7", "call_id": "ask-1",
	  "spec": {"msg": "Which warehouse should ship order 1234?", "subject": null, "channel": null,
	    "response_options": [{"name": "north", "title": "North", "description": null, "prompt_fill": null, "interactive": false},
	      {"name": "south", "title": "South", "description": "has stock", "prompt_fill": "ship from south", "interactive": false}],
	    "state": {"step": 3}},
	  "status": null}`
	code, created := hlCall(t, d, d.APIKey, "POST", "/contact_requests", body)
	id, _ := field(created, "countersign.request_id").(string)
	if code != http.StatusCreated || id == "" || field(created, "status.response") != nil {
		t.Fatalf("POST /contact_requests = %d %v, want 201 without a response", code, created)
	}
	card := apiCard(t, d, id)
	text := string(card.Blocks)
	for _, want := range []string{"Which warehouse should ship order 1234?", "North", "South", "cs_respond", "Answer"} {
		if !strings.Contains(text, want) {
			t.Errorf("Respond card does not show %q: %s", want, text)
		}
	}
	for _, not := range []string{"cs_approve", "cs_reject"} {
		if strings.Contains(text, not) {
			t.Errorf("Respond card offers %s: %s", not, text)
		}
	}
	code, again := hlCall(t, d, d.APIKey, "POST", "/contact_requests", body)
	if code != http.StatusOK || field(again, "countersign.request_id") != id {
		t.Errorf("re-POST of ask-1 = %d %v, want the same request", code, again)
	}

	if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_respond"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	v := openModal(t, d, bob)
	if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{}); err != nil || res.Closed {
		t.Fatalf("empty answer: SubmitView = %+v, %v; want the modal kept open with an error", res, err)
	}
	const answer = "South: the north warehouse is out of stock"
	if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"choice": {"choice": "south"}, "response": {"text": answer}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView = %+v, %v", res, err)
	}
	waitAudit(t, d, id, approval.EventDecided)
	code, got := hlCall(t, d, d.APIKey, "GET", "/contact_requests/ask-1", "")
	if code != http.StatusOK || field(got, "status.response") != answer || field(got, "status.response_option_name") != "south" ||
		field(got, "status.responded_at") == nil || field(got, "spec.msg") != "Which warehouse should ship order 1234?" {
		t.Fatalf("GET = %d %v, want the answer %q with option south", code, got, answer)
	}
	if step := field(got, "spec.state.step"); step != float64(3) {
		t.Errorf("spec.state.step = %v, want 3 back", step)
	}
	waitWS(t, d, "the card redrawn as answered", func() bool {
		m, _ := d.Workspace.Message(card.Channel, card.TS)
		return strings.Contains(string(m.Blocks), "Answered") && strings.Contains(string(m.Blocks), "out of stock") && !strings.Contains(string(m.Blocks), "cs_respond")
	})
	if n := len(d.Workspace.Messages(d.Cast.Tasks.ID)); n != 0 {
		t.Errorf("task channel has %d messages, want none for a contact request", n)
	}
}
