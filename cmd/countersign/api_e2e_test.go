package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store"
)

// apiClient is the Go client on the demo's HTTP API with its key.
func apiClient(d *main.Demo) *client.Client {
	c := client.New("http://"+d.Main.Addr(), d.APIKey)
	c.PollWait = 20 * time.Second
	return c
}

// apiCard waits for the approval card of request id (bound to it) and
// returns it.
func apiCard(t *testing.T, d *main.Demo, id string) slacksim.Message {
	t.Helper()
	var card slacksim.Message
	// Polled: the binding is in Redis, which tells the workspace nothing.
	waitUntil(t, "the card of "+id, func() bool {
		r, err := d.Main.Store.Request(context.Background(), id)
		if err != nil || !r.Card.Bound() {
			return false
		}
		m, ok := d.Workspace.Message(r.Card.Channel, r.Card.TS)
		card = m
		return ok
	})
	return card
}

// waitAsync runs wait in the background and returns its answer channel:
// the long poll is in progress while the test clicks.
func waitAsync(c *client.Client, id string) <-chan any {
	out := make(chan any, 1)
	go func() { // exits when the long poll returns (final, or the 60 s ctx)
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		r, err := c.Wait(ctx, id)
		if err != nil {
			out <- err
			return
		}
		out <- r
	}()
	return out
}

func answer(t *testing.T, ch <-chan any) *client.Request {
	t.Helper()
	select {
	case v := <-ch:
		if err, ok := v.(error); ok {
			t.Fatalf("Wait: %v", err)
		}
		return v.(*client.Request)
	case <-time.After(60 * time.Second):
		t.Fatal("Wait did not return")
	}
	return nil
}

// TestAPIApprovedByClick: an outside agent asks through the HTTP API for a
// tool the policy does not declare (the external rule); the card says which
// key asked and links no task thread; a re-POST of the same call id returns
// the same request and posts no second card; the long poll in progress
// returns the approval clicked in Slack; the caller's result is shown on the
// card and audited, and accepted once.
func TestAPIApprovedByClick(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	c := apiClient(d)
	ctx := context.Background()
	call := client.Call{Tool: "deploy_service", CallID: "call-1", RunID: "lg-run-9",
		Arguments: json.RawMessage(`{"service":"web","version":"1.4.2"}`), Reason: "the fix for the login bug is merged",
		Facts: []client.Fact{{Label: "Change ticket", Value: "CHG-1042"}}}
	r, err := c.Request(ctx, call)
	if err != nil {
		t.Fatalf("Request: %v", err)
	}
	if r.Status != client.Pending || !strings.HasPrefix(r.ID, "req_") {
		t.Fatalf("Request = %+v, want a pending request", r)
	}
	card := apiCard(t, d, r.ID)
	text := string(card.Blocks)
	for _, want := range []string{"through the API by key `demo-agent`", "Supplied by the caller", "CHG-1042", "deploy_service"} {
		if !strings.Contains(text, want) {
			t.Errorf("card does not show %q: %s", want, text)
		}
	}
	if strings.Contains(text, "task thread") {
		t.Errorf("card links a task thread: %s", text)
	}

	again, err := c.Request(ctx, call)
	if err != nil || again.ID != r.ID || again.Status != client.Pending {
		t.Fatalf("re-POST of call-1 = %+v, %v; want the same pending request %s", again, err, r.ID)
	}
	other := call
	other.Arguments = json.RawMessage(`{"service":"db"}`)
	var apiErr *client.Error
	if _, err := c.Request(ctx, other); !errors.As(err, &apiErr) || apiErr.HTTPStatus != 409 || apiErr.Field != "call_id" {
		t.Errorf("call-1 reused with other arguments: %v, want 409 on call_id", err)
	}
	if m := getText(t, "http://"+d.Main.Addr()+"/metrics"); !strings.Contains(m, `countersign_api_refusals_total{code="call_id_reused"} 1`) {
		t.Errorf("/metrics does not count the refusal: %s", m)
	}

	ch := waitAsync(c, r.ID)
	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	got := answer(t, ch)
	if got.Status != client.Approved || got.Verdict != "approve" || got.Approver != d.Cast.Approver.ID || got.Digest == "" {
		t.Fatalf("Wait = %+v, want approved by %s", got, d.Cast.Approver.ID)
	}

	claim, err := c.Claim(ctx, r.ID)
	if err != nil {
		t.Fatalf("Claim: %v", err)
	}
	if _, err := c.Claim(ctx, r.ID); !errors.As(err, &apiErr) || apiErr.HTTPStatus != 409 || apiErr.Code != "already_claimed" {
		t.Errorf("second Claim: %v, want 409 already_claimed", err)
	}
	done, err := c.Result(ctx, r.ID, claim.Token, client.Executed, "deployed web 1.4.2")
	if err != nil || done.Status != client.Executed || done.Result == nil || done.Result.Output != "deployed web 1.4.2" {
		t.Fatalf("Result = %+v, %v; want executed", done, err)
	}
	if _, err := c.Result(ctx, r.ID, claim.Token, client.Failed, "again"); !errors.As(err, &apiErr) || apiErr.HTTPStatus != 409 || apiErr.Code != "already_reported" {
		t.Errorf("second Result: %v, want 409 already_reported", err)
	}
	waitWS(t, d, "the card showing the result", func() bool {
		m, _ := d.Workspace.Message(card.Channel, card.TS)
		return strings.Contains(string(m.Blocks), "deployed web 1.4.2")
	})

	// One card, nothing in any task channel, an audit chain that tells it.
	cards := 0
	for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
		if strings.Contains(string(m.Blocks), r.ID) {
			cards++
		}
	}
	if cards != 1 {
		t.Errorf("approvals channel has %d cards for %s, want 1", cards, r.ID)
	}
	if n := len(d.Workspace.Messages(d.Cast.Tasks.ID)); n != 0 {
		t.Errorf("task channel has %d messages, want none for an API request", n)
	}
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	if _, err := audit.Verify(ctx); err != nil {
		t.Fatalf("audit Verify: %v", err)
	}
	entries, err := audit.Range(ctx, "", 1000)
	if err != nil {
		t.Fatal(err)
	}
	var events []approval.Event
	for _, e := range entries {
		if e.RequestID == r.ID {
			events = append(events, e.Event)
		}
	}
	want := []approval.Event{approval.EventAssessed, approval.EventRequested, approval.EventCardPosted, approval.EventDecided, approval.EventExecuting, approval.EventExecuted}
	if strings.Join(eventNames(events), " ") != strings.Join(eventNames(want), " ") {
		t.Errorf("audit of %s = %v, want %v", r.ID, events, want)
	}
}

func eventNames(evs []approval.Event) []string {
	out := make([]string, len(evs))
	for i, e := range evs {
		out[i] = string(e)
	}
	return out
}

// TestAPIRejectAndEdit: a rejection with a reason typed in Slack's modal
// comes back on the long poll with the reason; an approver's edit comes
// back with the edited arguments and their digest, and the originals.
func TestAPIRejectAndEdit(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	c := apiClient(d)
	ctx := context.Background()
	bob, carol := d.Cast.Approver.ID, d.Cast.SecondApprover.ID

	t.Run("reject with reason", func(t *testing.T) {
		r, err := c.Request(ctx, client.Call{Tool: "deploy_service", CallID: "call-rej", Arguments: json.RawMessage(`{"service":"db"}`)})
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		card := apiCard(t, d, r.ID)
		ch := waitAsync(c, r.ID)
		if err := d.Workspace.Click(carol, d.Cast.Approvals.ID, card.TS, "cs_reject"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, carol)
		const reason = "not during the sale; try Monday"
		if res, err := d.Workspace.SubmitView(carol, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		got := answer(t, ch)
		if got.Status != client.Rejected || got.Reason != reason || got.Approver != carol {
			t.Fatalf("Wait = %+v, want rejected by %s with %q", got, carol, reason)
		}
		if _, err := c.Claim(ctx, r.ID); err == nil {
			t.Errorf("Claim of a rejected request accepted, want 409 not_approved")
		}
		if _, err := c.Result(ctx, r.ID, "cst_x", client.Executed, "ran anyway"); err == nil {
			t.Errorf("Result on a rejected request accepted, want 409 not_approved")
		}
	})

	t.Run("edit", func(t *testing.T) {
		r, err := c.Request(ctx, client.Call{Tool: "issue_refund", CallID: "call-edit",
			Arguments: json.RawMessage(`{"order_id":"1234","amount":80,"reason":"damaged"}`)})
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if r.Status != client.Pending {
			t.Fatalf("Request = %+v, want pending (amount above $50)", r)
		}
		card := apiCard(t, d, r.ID)
		if !strings.Contains(string(card.Blocks), "Order total") {
			t.Errorf("card lacks the system-of-record preview: %s", card.Blocks)
		}
		ch := waitAsync(c, r.ID)
		if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_edit"); err != nil {
			t.Fatalf("Click: %v", err)
		}
		v := openModal(t, d, bob)
		if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "64"}}); err != nil || !res.Closed {
			t.Fatalf("SubmitView = %+v, %v", res, err)
		}
		got := answer(t, ch)
		wantDigest, _ := approval.Digest(json.RawMessage(`{"order_id":"1234","amount":64,"reason":"damaged"}`))
		if got.Status != client.Approved || got.Verdict != "edit" || !got.Edited || got.Digest != wantDigest {
			t.Fatalf("Wait = %+v, want approved with edits, digest %s", got, wantDigest)
		}
		var args struct{ Amount float64 }
		if err := json.Unmarshal(got.Arguments, &args); err != nil || args.Amount != 64 {
			t.Errorf("edited arguments = %s, want amount 64", got.Arguments)
		}
		if !strings.Contains(string(got.OriginalArguments), "80") {
			t.Errorf("original_arguments = %s, want the amount 80 proposed", got.OriginalArguments)
		}
	})

	t.Run("auto-approved", func(t *testing.T) {
		r, err := c.Request(ctx, client.Call{Tool: "lookup_order", CallID: "call-auto", Arguments: json.RawMessage(`{"order_id":"1234"}`)})
		if err != nil {
			t.Fatalf("Request: %v", err)
		}
		if r.Status != client.Approved || !r.AutoApproved || r.ID != "" {
			t.Fatalf("Request(lookup_order) = %+v, want approved at once, no request", r)
		}
	})
}

// TestPythonExample runs examples/api_client.py (standard library only)
// against the demo's API: it asks, long-polls while an approver clicks
// Approve in the workspace, reports its result, and prints who approved.
// It skips when python3 is missing, except under CI=true where it fails.
func TestPythonExample(t *testing.T) {
	t.Parallel()
	py, err := exec.LookPath("python3")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("python3 not found; CI must run the Python example")
		}
		t.Skip("python3 not found: the Python example is not run")
	}
	d := startDemo(t, false)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "../../examples/api_client.py", "--tool", "deploy_service", "--call-id", "py-1",
		"--args", `{"service":"web"}`, "--reason", "from python")
	cmd.Env = append(os.Environ(), "COUNTERSIGN_URL=http://"+d.Main.Addr(), "COUNTERSIGN_API_KEY="+d.APIKey, "PYTHONDONTWRITEBYTECODE=1")
	var out, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	var id string
	waitWS(t, d, "the Python example's card", func() bool {
		for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
			if v := buttonValue.FindStringSubmatch(string(m.Blocks)); v != nil && strings.Contains(string(m.Blocks), "deploy_service") {
				id = v[1]
				return true
			}
		}
		return false
	})
	card := apiCard(t, d, id)
	if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click: %v", err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatalf("python example: %v\nstderr: %s", err, stderr.String())
	}
	if got, want := strings.TrimSpace(out.String()), "executed by "+d.Cast.Approver.ID; got != want {
		t.Errorf("python example printed %q, want %q (stderr %s)", got, want, stderr.String())
	}
}

// TestServeRefusesWebhookWithoutSecret: a webhook whose secret variable is
// empty stops start-up with an error naming the policy key and the
// variable (never a delivery signed with an empty secret).
func TestServeRefusesWebhookWithoutSecret(t *testing.T) {
	t.Parallel()
	f, err := policyfile.Parse(demo.Policy)
	if err != nil {
		t.Fatal(err)
	}
	f.API.Webhooks = []policyfile.Webhook{{Name: "ops", URL: "https://hooks.example.com/x", SecretEnv: "CS_TEST_WEBHOOK_SECRET"}}
	err = runMain(t, &main.Main{Config: main.Config{SlackAPIURL: "http://127.0.0.1:1/"},
		Policy: f, Env: func(string) string { return "" }})
	if err == nil || !strings.Contains(err.Error(), "api.webhooks[0].secret_env") || !strings.Contains(err.Error(), "CS_TEST_WEBHOOK_SECRET") {
		t.Fatalf("Start = %v, want an error naming api.webhooks[0].secret_env and the variable", err)
	}
}

// TestCloseAnswersParkedLongPolls: a long poll held when the process stops
// is answered at once with its request still pending (the caller asks
// again, of another replica) on a connection then closed, and stopping
// does not wait out the poll: the API's parked polls are not the HTTP
// server's requests in flight, so Close releases them itself.
func TestCloseAnswersParkedLongPolls(t *testing.T) {
	t.Parallel()
	d := startDemo(t, false)
	c := apiClient(d)
	r, err := c.Request(context.Background(), client.Call{Tool: "deploy_service", CallID: "close-1",
		Arguments: json.RawMessage(`{"service":"web","version":"1.4.2"}`)})
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", d.Main.Addr())
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	if _, err := io.WriteString(conn, "GET /v1/requests/"+r.ID+"?wait=60s HTTP/1.1\r\nHost: countersign\r\nAuthorization: Bearer "+d.APIKey+"\r\n\r\n"); err != nil {
		t.Fatal(err)
	}
	waitUntil(t, "the long poll held", func() bool { return d.Main.API.Waiting() == 1 })
	closed := make(chan error, 1)
	go func() { closed <- d.Main.Close() }() // the demo's own Close follows at cleanup
	_ = conn.SetReadDeadline(time.Now().Add(30 * time.Second))
	br := bufio.NewReader(conn)
	resp, err := http.ReadResponse(br, nil)
	if err != nil {
		t.Fatalf("no answer to the held poll: %v", err)
	}
	var v client.Request
	if err := json.NewDecoder(resp.Body).Decode(&v); err != nil || resp.StatusCode != http.StatusOK || v.Status != client.Pending || !resp.Close {
		t.Errorf("answer %d %+v (%v), Close %v; want 200 pending, Connection: close", resp.StatusCode, v, err, resp.Close)
	}
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
}
