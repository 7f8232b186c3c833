package api_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// goneWhy is what the card of a request withdrawn because its caller went
// away says (the grace is the default, 5s).
const goneWhy = "The caller gave up: it stopped waiting for the decision and did not come back within 5s (key full); nothing ran"

// rawPollQuery is rawPoll with the query given (a long poll of id).
func rawPollQuery(t *testing.T, base, id, query string) (net.Conn, *bufio.Reader) {
	t.Helper()
	u, err := url.Parse(base)
	if err != nil {
		t.Fatal(err)
	}
	conn, err := net.Dial("tcp", u.Host)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = conn.Close() })
	req := "GET /v1/requests/" + id + "?" + query + " HTTP/1.1\r\nHost: " + u.Host + "\r\nAuthorization: Bearer " + fullKey + "\r\n\r\n"
	if _, err := io.WriteString(conn, req); err != nil {
		t.Fatal(err)
	}
	return conn, bufio.NewReader(conn)
}

// status reads request id's status from the store.
func (h *harness) status(id string) approval.Status {
	h.t.Helper()
	r, err := h.store.Request(h.ctx, id)
	if err != nil {
		h.t.Fatalf("Request(%s): %v", id, err)
	}
	return r.Status
}

// replica serves a second process's API on h's store and lifecycle, with
// polls counted by the store (as serve wires every replica).
func (h *harness) replica() string {
	h.t.Helper()
	secret, err := h.store.Secret(h.ctx)
	if err != nil {
		h.t.Fatal(err)
	}
	s, err := api.New(api.Options{IDSecret: secret, Lifecycle: h.life, Requests: h.store, Audit: h.audit, Now: h.clock.Now,
		Polls: h.store.Polls(), Keys: []api.Key{{Name: "full", SHA256: api.HashKey(fullKey), Tools: []string{"*"}, SlackUser: "U0ALICE01", RatePerMinute: 1000}}})
	if err != nil {
		h.t.Fatal(err)
	}
	parked := make(chan struct{}, 10)
	api.OnPark(s, func(p bool) {
		if p {
			parked <- struct{}{}
		}
	})
	srv := httptest.NewServer(s.Handler())
	h.t.Cleanup(srv.Close)
	h.t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = s.Release(ctx)
	})
	h.replicaParked = parked
	return srv.URL
}

// cutPolls is the store's poll counts, with the caller going while a
// count is on its way (cut, called once, first): Redis keeps the count,
// and the caller's context reports its end, as go-redis does when the
// reply comes after it.
type cutPolls struct {
	api.Polls
	cut func()
}

func (p *cutPolls) Begin(ctx context.Context, id string) (int64, error) {
	if p.cut != nil {
		p.cut()
		p.cut = nil
	}
	n, err := p.Polls.Begin(context.WithoutCancel(ctx), id)
	if err == nil && ctx.Err() != nil {
		return 0, ctx.Err()
	}
	return n, err
}

// TestWithdrawIfGone: a long poll sent with withdraw_if_gone=true that ends
// without the decision — its caller hung up, or its wait ran out — and is
// followed by no other poll of the request within the grace period (the
// injected clock moved past it) withdraws the request: cancelled through
// the lifecycle, audited by countersign, its card saying the caller gave
// up and nothing ran. A poll that comes back in time (to this process or
// another), a request decided first, a caller that did not opt in, and a
// sweep before the grace ended withdraw nothing.
func TestWithdrawIfGone(t *testing.T) {
	for _, tt := range []struct {
		name string
		// polls: the store's counts (every replica's) rather than this
		// process's.
		polls bool
		// act makes the caller go (or not), then returns once the
		// server has noted how its poll ended.
		act      func(t *testing.T, h *harness, id string)
		withdraw bool
		// cut, when set, counts the store's polls through cutPolls.
		cut *cutPolls
	}{
		{name: "hung up on a parked poll", withdraw: true, act: func(t *testing.T, h *harness, id string) {
			conn, _ := rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
			_ = conn.Close()
			receiveN(t, h.gones, 1, "polls ended without the decision")
		}},
		{name: "killed while its poll was held in its handler", withdraw: true, act: func(t *testing.T, h *harness, id string) {
			// The handler holds it: the test calls it in process, with a
			// writer that cannot be hijacked, and cancels its context.
			ctx, cancel := context.WithCancel(h.ctx)
			r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/requests/"+id+"?wait=30s&withdraw_if_gone=true", nil)
			r.Header.Set("Authorization", "Bearer "+fullKey)
			done := make(chan struct{})
			go func() { defer close(done); h.server.Handler().ServeHTTP(httptest.NewRecorder(), r) }() // ends with ctx
			h.waitPolls(1)
			cancel()
			<-done
			receiveN(t, h.gones, 1, "polls ended without the decision")
		}},
		{name: "killed while its poll was counted", withdraw: true, cut: &cutPolls{}, act: func(t *testing.T, h *harness, id string) {
			// The caller goes while the count of its poll is on its way
			// to Redis, which keeps it: the poll must still be watched,
			// or the count would hide the caller's going for good.
			ctx, cancel := context.WithCancel(h.ctx)
			h.cut.cut = cancel
			r := httptest.NewRequestWithContext(ctx, http.MethodGet, "/v1/requests/"+id+"?wait=30s&withdraw_if_gone=true", nil)
			r.Header.Set("Authorization", "Bearer "+fullKey)
			h.server.Handler().ServeHTTP(httptest.NewRecorder(), r) // ends with ctx
			receiveN(t, h.gones, 1, "polls ended without the decision")
		}},
		{name: "killed while its watch was set up", withdraw: true, act: func(t *testing.T, h *harness, id string) {
			// The parked poll's watch fails (its caller went while the
			// record was read): the poll ended without the decision.
			h.reads.watchErr = fmt.Errorf("wait: load request %s: %w", id, context.Canceled)
			_, br := rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			if resp, err := http.ReadResponse(br, nil); err != nil || resp.StatusCode != http.StatusInternalServerError {
				t.Fatalf("the poll answered %v, %v; want 500", resp, err)
			}
			receiveN(t, h.gones, 1, "polls ended without the decision")
		}},
		{name: "its wait ran out and it did not ask again", withdraw: true, act: func(t *testing.T, h *harness, id string) {
			_, br := rawPollQuery(t, h.url, id, "wait=1s&withdraw_if_gone=true")
			resp, err := http.ReadResponse(br, nil)
			if err != nil || resp.StatusCode != http.StatusOK {
				t.Fatalf("the poll answered %v, %v; want 200 pending", resp, err)
			}
			receiveN(t, h.gones, 1, "polls ended without the decision")
		}},
		{name: "asked for it and never polled", withdraw: true, act: func(t *testing.T, h *harness, id string) {
			// The same call asked again (as the hook asks), opting in: a
			// caller killed between its ask and its first poll is gone.
			c := h.client(fullKey)
			c.WithdrawIfGone = true
			r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "gone-asked-for-it-and-never-polled", Arguments: json.RawMessage(`{"amount":64}`)})
			if err != nil || r.ID != id {
				t.Fatalf("Request = %+v, %v; want request %s", r, err, id)
			}
			receiveN(t, h.gones, 1, "requests asked for without a poll yet")
		}},
		{name: "asked for it, then polled", act: func(t *testing.T, h *harness, id string) {
			c := h.client(fullKey)
			c.WithdrawIfGone = true
			if _, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: "gone-asked-for-it,-then-polled", Arguments: json.RawMessage(`{"amount":64}`)}); err != nil {
				t.Fatal(err)
			}
			receiveN(t, h.gones, 1, "requests asked for without a poll yet")
			rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
		}},
		{name: "back within the grace period", act: func(t *testing.T, h *harness, id string) {
			conn, _ := rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
			_ = conn.Close()
			receiveN(t, h.gones, 1, "polls ended without the decision")
			h.clock.Advance(4 * time.Second)
			rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
		}},
		{name: "back through another replica", polls: true, act: func(t *testing.T, h *harness, id string) {
			other := h.replica()
			conn, _ := rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
			_ = conn.Close()
			receiveN(t, h.gones, 1, "polls ended without the decision")
			rawPollQuery(t, other, id, "wait=30s&withdraw_if_gone=true")
			receiveN(t, h.replicaParked, 1, "polls parked on the other replica")
		}},
		{name: "released as the process stops", act: func(t *testing.T, h *harness, id string) {
			// Its caller polls again, of another replica or after the
			// restart: not a caller gone.
			rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
			ctx, cancel := context.WithTimeout(h.ctx, 10*time.Second)
			defer cancel()
			if err := h.server.Release(ctx); err != nil {
				t.Fatal(err)
			}
		}},
		{name: "did not opt in", act: func(t *testing.T, h *harness, id string) {
			conn, _ := rawPollQuery(t, h.url, id, "wait=30s")
			h.waitParked(1)
			_ = conn.Close()
			h.waitUnparked(1)
		}},
		{name: "decided before the grace ended", act: func(t *testing.T, h *harness, id string) {
			conn, _ := rawPollQuery(t, h.url, id, "wait=30s&withdraw_if_gone=true")
			h.waitParked(1)
			_ = conn.Close()
			receiveN(t, h.gones, 1, "polls ended without the decision")
			h.decide(id, approval.VerdictApprove, "U0BOB0001", "")
		}},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var o harnessOptions
			if tt.polls {
				o.polls = func(s *store.Store) api.Polls { return s.Polls() }
			}
			if tt.cut != nil {
				o.polls = func(s *store.Store) api.Polls { tt.cut.Polls = s.Polls(); return tt.cut }
			}
			h := newHarness(t, o)
			h.cut = tt.cut
			id := h.newRequest("gone-" + strings.ReplaceAll(tt.name, " ", "-"))
			tt.act(t, h, id)
			before := h.status(id)
			h.clock.Advance(api.DefaultWithdrawGrace - time.Millisecond)
			if n := h.server.WithdrawDue(h.ctx); n != 0 || h.status(id) != before {
				t.Fatalf("WithdrawDue before the grace ended = %d, status %s; want 0, %s", n, h.status(id), before)
			}
			h.clock.Advance(time.Millisecond)
			n := h.server.WithdrawDue(h.ctx)
			cancelled := h.events(approval.EventCancelled)
			if !tt.withdraw {
				if n != 0 || h.status(id) != before || len(cancelled) != 0 {
					t.Errorf("WithdrawDue = %d, status %s, %d cancelled entries; want 0, %s, none", n, h.status(id), len(cancelled), before)
				}
				return
			}
			if n != 1 || h.status(id) != approval.StatusCancelled {
				t.Fatalf("WithdrawDue = %d, status %s; want 1, cancelled", n, h.status(id))
			}
			if len(cancelled) != 1 || cancelled[0].Actor != "countersign" || !strings.Contains(string(cancelled[0].Data), goneWhy) {
				t.Errorf("audit cancelled = %+v, want one by countersign saying %q", cancelled, goneWhy)
			}
			if card, ok := h.cards.Drawn(id); !ok || card.Status != approval.StatusCancelled || card.Decision == nil || card.Decision.Text != goneWhy {
				t.Errorf("card last drawn with %+v, want cancelled saying %q", card, goneWhy)
			}
			got, err := h.client(fullKey).Get(h.ctx, id, 0)
			if err != nil || got.Status != client.Cancelled || got.Reason != goneWhy {
				t.Errorf("GET = %+v, %v; want cancelled, reason %q", got, err, goneWhy)
			}
			if n := h.server.WithdrawDue(h.ctx); n != 0 {
				t.Errorf("a second WithdrawDue withdrew %d", n)
			}
		})
	}
}

// TestWithdrawIfGoneInvalid: withdraw_if_gone is true or false.
func TestWithdrawIfGoneInvalid(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	id := h.newRequest("gone-invalid")
	req, _ := http.NewRequest(http.MethodGet, h.url+"/v1/requests/"+id+"?wait=1s&withdraw_if_gone=yes", nil)
	req.Header.Set("Authorization", "Bearer "+fullKey)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var body api.ErrorBody
	_ = json.NewDecoder(resp.Body).Decode(&body)
	if resp.StatusCode != http.StatusBadRequest || body.Error.Code != "invalid_field" || body.Error.Field != "withdraw_if_gone" {
		t.Errorf("withdraw_if_gone=yes: %d %+v, want 400 invalid_field withdraw_if_gone", resp.StatusCode, body.Error)
	}
}

// TestCancelGaveUp: a caller that stopped waiting says so (gave_up): the
// card and the audit say it gave up and nothing ran. The body is
// optional; a body of another shape is refused, withdrawing nothing.
func TestCancelGaveUp(t *testing.T) {
	for _, tt := range []struct {
		name, body string
		status     int
		code, why  string
	}{
		{"no body", "", http.StatusOK, "", "Withdrawn by the caller (key full) — nothing ran"},
		{"empty object", "{}", http.StatusOK, "", "Withdrawn by the caller (key full) — nothing ran"},
		{"gave up", `{"gave_up": true}`, http.StatusOK, "", "The caller gave up waiting (key full); nothing ran"},
		{"gave up, not a boolean", `{"gave_up": "yes"}`, http.StatusBadRequest, "invalid_field", ""},
		{"unknown field", `{"reason": "tired"}`, http.StatusBadRequest, "unknown_field", ""},
		{"not JSON", `gave up`, http.StatusBadRequest, "invalid_json", ""},
	} {
		t.Run(tt.name, func(t *testing.T) {
			h := newHarness(t, harnessOptions{})
			id := h.newRequest("gave-up")
			req, _ := http.NewRequest(http.MethodPost, h.url+"/v1/requests/"+id+"/cancel", strings.NewReader(tt.body))
			req.Header.Set("Authorization", "Bearer "+fullKey)
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			if resp.StatusCode != tt.status {
				t.Fatalf("POST cancel %q = %d %s, want %d", tt.body, resp.StatusCode, b, tt.status)
			}
			if tt.code != "" {
				var body api.ErrorBody
				if err := json.Unmarshal(b, &body); err != nil || body.Error.Code != tt.code {
					t.Errorf("refusal %s, want code %s", b, tt.code)
				}
				if st := h.status(id); st != approval.StatusPending {
					t.Errorf("status after a refused cancel = %s, want pending", st)
				}
				return
			}
			var got client.Request
			if err := json.Unmarshal(b, &got); err != nil || got.Status != client.Cancelled || got.Reason != tt.why {
				t.Errorf("answer %s, want cancelled with reason %q", b, tt.why)
			}
			if card, ok := h.cards.Drawn(id); !ok || card.Decision == nil || card.Decision.Text != tt.why {
				t.Errorf("card last drawn with %+v, want %q", card, tt.why)
			}
		})
	}
	// The client's GiveUp sends gave_up.
	h := newHarness(t, harnessOptions{})
	id := h.newRequest("gave-up-client")
	got, err := h.client(fullKey).GiveUp(h.ctx, id)
	if err != nil || got.Reason != "The caller gave up waiting (key full); nothing ran" {
		t.Errorf("GiveUp = %+v, %v", got, err)
	}
	var apiErr *client.Error
	if _, err := h.client(fullKey).GiveUp(h.ctx, id); !errors.As(err, &apiErr) || apiErr.Code != "not_pending" {
		t.Errorf("a second GiveUp = %v, want 409 not_pending", err)
	}
}
