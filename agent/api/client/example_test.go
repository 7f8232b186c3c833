package client_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/store"
)

// An agent asks before refunding, waits for a person's decision, claims
// the approved call (exactly one claim wins, so it runs at most once),
// runs the refund with the arguments the person approved (perhaps
// edited), and reports the result with the claim's token. The server here is a real Countersign API on an
// in-process Redis, where an approver approves each card as it is posted.
func Example() {
	url, stop := exampleServer()
	defer stop()
	ctx := context.Background()

	c := client.New(url, "csk_example_key")
	r, err := c.Request(ctx, client.Call{
		Tool: "issue_refund", CallID: "refund-order-1234", RunID: "support-run-7",
		Arguments: json.RawMessage(`{"order_id":"1234","amount":64}`),
		Reason:    "the table arrived damaged",
		Facts:     []client.Fact{{Label: "Customer says", Value: "the leg is cracked"}},
	})
	if err != nil {
		fmt.Println("error:", err)
		return
	}
	if !r.Status.Final() {
		r, err = c.Wait(ctx, r.ID) // long polls until a person decides
		if err != nil {
			fmt.Println("error:", err)
			return
		}
	}
	switch r.Status {
	case client.Approved:
		claim, err := c.Claim(ctx, r.ID)
		if err != nil {
			// 409 already_claimed: another executor runs it; its state is
			// in the error's Request. Never run it here.
			fmt.Println("not run here:", err)
			return
		}
		// Run the refund with claim.Request.Arguments (the approved ones), then:
		done, err := c.Result(ctx, r.ID, claim.Token, client.Executed, "refund RF-1 created")
		if err != nil {
			fmt.Println("error:", err)
			return
		}
		fmt.Println(done.Status, "after approval by", r.Approver)
	case client.Rejected, client.Expired, client.Cancelled:
		fmt.Println("not run:", r.Reason)
	}
	// Output: executed after approval by U0BOB0001
}

// ExampleVerifyWebhook checks a webhook delivery before trusting it.
func ExampleVerifyWebhook() {
	secret := []byte("whsec_from_the_environment")
	handler := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20)) // raw, before any decoding
		if err != nil {
			http.Error(w, "unreadable", http.StatusBadRequest)
			return
		}
		ev, err := client.VerifyWebhook(secret, r.Header, body, time.Now())
		if err != nil {
			http.Error(w, "bad signature", http.StatusUnauthorized)
			return
		}
		// Dedupe on ev.DeliveryID: a retry carries the same one.
		fmt.Println(ev.Type, ev.Request.ID, ev.Request.Status)
	})

	// What Countersign sends (signed with the same secret):
	body := []byte(`{"type":"request.final","delivery_id":"whd_1","key":"support-bot","request":{"id":"req_1","tool":"issue_refund","call_id":"c1","status":"approved","arguments":{},"digest":"d"}}`)
	now := time.Now()
	req := httptest.NewRequest(http.MethodPost, "/hooks/countersign", strings.NewReader(string(body)))
	req.Header.Set(client.HeaderTimestamp, strconv.FormatInt(now.Unix(), 10))
	req.Header.Set(client.HeaderSignature, client.Sign(secret, now, body))
	req.Header.Set(client.HeaderDelivery, "whd_1")
	handler.ServeHTTP(httptest.NewRecorder(), req)
	// Output: request.final req_1 approved
}

// approver stands in for the Slack bot: it posts a card for each request
// (the lifecycle binds it) and has U0BOB0001 approve it at once.
type approver struct {
	store *store.Store
	life  *approval.Lifecycle
}

func (a *approver) Post(context.Context, *approval.Request, bool) (approval.CardRef, bool, error) {
	return approval.CardRef{Channel: "G0APPROV1", TS: "1700000000.000100"}, false, nil
}

// Posted is told once the card is bound: U0BOB0001 approves it.
func (a *approver) Posted(_ context.Context, r *approval.Request) {
	go func() { // ends once the decision is recorded
		_, _ = a.life.Decide(context.Background(), r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove,
			Approver: "U0BOB0001", At: time.Now(), Digest: r.Digest}, approval.DecideOptions{})
	}()
}

func (a *approver) Delete(context.Context, *approval.Request, approval.CardRef) {}
func (a *approver) Refresh(*approval.Request)                                   {}

// exampleServer runs the API with one key on an in-process Redis.
func exampleServer() (url string, stop func()) {
	mr, err := store.StartEmbedded()
	if err != nil {
		panic(err)
	}
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr()})
	st := store.New(rdb, store.Options{})
	audit := store.NewAudit(rdb, store.AuditOptions{})
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"issue_refund": {Risk: approval.RiskMedium, Review: approval.ReviewAlways},
	}})
	if err != nil {
		panic(err)
	}
	life, err := approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: store.NewLedger(st, audit), Gate: gate})
	if err != nil {
		panic(err)
	}
	life.SetCards(&approver{store: st, life: life})
	secret, err := st.Secret(context.Background()) // the deployment's: it keys request ids
	if err != nil {
		panic(err)
	}
	s, err := api.New(api.Options{Lifecycle: life, Requests: st, Audit: audit, IDSecret: secret,
		Keys: []api.Key{{Name: "support-bot", SHA256: api.HashKey("csk_example_key"), Tools: []string{"issue_refund"}}}})
	if err != nil {
		panic(err)
	}
	srv := httptest.NewServer(s.Handler())
	return srv.URL, func() { srv.Close(); _ = st.Close(); _ = rdb.Close(); mr.Close() }
}
