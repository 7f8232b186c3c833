package stepup_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/cmd/countersign/server/stepup"
)

// keys is stepup.Keys in memory.
type keys struct {
	mu       sync.Mutex // guards the maps
	passkeys map[string]map[string][]byte
	sessions map[string][]byte
}

func (k *keys) AddPasskey(_ context.Context, user, id string, data []byte) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	if k.passkeys[user] == nil {
		k.passkeys[user] = map[string][]byte{}
	}
	k.passkeys[user][id] = data
	return nil
}

func (k *keys) Passkeys(_ context.Context, user string) ([][]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	var out [][]byte
	for _, b := range k.passkeys[user] {
		out = append(out, b)
	}
	return out, nil
}

func (k *keys) RemovePasskey(_ context.Context, user, id string) (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	_, ok := k.passkeys[user][id]
	delete(k.passkeys[user], id)
	return ok, nil
}

func (k *keys) SaveStepUpSession(_ context.Context, key string, data []byte, _ time.Duration) error {
	k.mu.Lock()
	defer k.mu.Unlock()
	k.sessions[key] = data
	return nil
}

func (k *keys) TakeStepUpSession(_ context.Context, key string) ([]byte, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	b, ok := k.sessions[key]
	if !ok {
		return nil, approval.ErrNotFound
	}
	delete(k.sessions, key)
	return b, nil
}

type world struct {
	page  *stepup.Page
	life  *approval.Lifecycle
	rec   *approvaltest.Records
	audit *approvaltest.Auditor
	clock *clocktest.Clock
	srv   *httptest.Server
}

func newWorld(t *testing.T) world {
	t.Helper()
	clock := clocktest.New(clocktest.Opts{})
	w := world{rec: approvaltest.NewRecords(clock.Now), audit: approvaltest.NewAuditor(clock.Now), clock: clock}
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"delete_customer": {Risk: approval.RiskHigh, StepUp: &approval.StepUp{}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	w.life, err = approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: approvaltest.NewLedger(w.rec, w.audit), Gate: gate, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w.life.SetStepUps(approvaltest.NewStepUps(clock.Now))
	w.page, err = stepup.New(stepup.Options{Domain: w.life, Keys: &keys{passkeys: map[string]map[string][]byte{}, sessions: map[string][]byte{}},
		Origin: "http://localhost:8080", Prefix: "/stepup/"})
	if err != nil {
		t.Fatal(err)
	}
	w.srv = httptest.NewServer(w.page)
	t.Cleanup(w.srv.Close)
	return w
}

// local turns a link of the page's origin into the test server's.
func (w world) local(link string) string {
	return w.srv.URL + strings.TrimPrefix(link, "http://localhost:8080")
}

func (w world) pending(t *testing.T) *approval.Request {
	t.Helper()
	now := w.clock.Now()
	r, err := w.life.Create(context.Background(), &approval.Request{ID: approval.NewID("req"), RunID: "run_1", Requester: "U0ALICE01",
		Tool: "delete_customer", Args: json.RawMessage(`{"customer_id":"C-300"}`), Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject},
		Quorum: 1, Created: now, Deadline: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func post(t *testing.T, url, body string) (int, string) {
	t.Helper()
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// What reaches the page without a valid passkey assertion decides nothing:
// a forged answer burns the link (audited), an unknown link and a used one
// are gone, a page of an enrollment nobody vouched for is refused.
func TestPageRefuses(t *testing.T) {
	w := newWorld(t)
	ctx := context.Background()
	r := w.pending(t)
	link, err := w.page.OfferStepUp(ctx, r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: "U0CAROL01",
		At: w.clock.Now(), Digest: r.Digest}, false)
	if err != nil {
		t.Fatalf("OfferStepUp: %v", err)
	}
	if code, body := get(t, w.local(link)); code != http.StatusOK || !strings.Contains(body, "no passkey registered") || !strings.Contains(body, "C-300") {
		t.Errorf("GET the vote page of carol without a passkey: %d %q, want 200 with the facts and that she has none", code, body)
	}
	if code, body := post(t, w.local(link), `{"id":"x","rawId":"x","type":"public-key","response":{}}`); code != http.StatusForbidden || !strings.Contains(body, "nothing was counted") {
		t.Errorf("POST a forged assertion: %d %q, want 403 nothing counted", code, body)
	}
	if code, _ := post(t, w.local(link), `{}`); code != http.StatusGone {
		t.Errorf("POST again on the used link: %d, want 410", code)
	}
	if code, _ := get(t, w.srv.URL+"/stepup/vote/unknown-token"); code != http.StatusGone {
		t.Errorf("GET an unknown link: %d, want 410", code)
	}
	got, _ := w.rec.Request(ctx, r.ID)
	if got.Status != approval.StatusPending || len(got.Approvals) != 0 {
		t.Errorf("after the refusals: %s with %d approvals, want pending with none", got.Status, len(got.Approvals))
	}
	if evs := w.audit.Events(r.ID); !slices.Contains(evs, approval.EventStepUpRefused) {
		t.Errorf("audit of %s = %v, want step_up_refused", r.ID, evs)
	}

	enroll, err := w.page.OfferEnrollment(ctx, "U0CAROL01", "")
	if err != nil {
		t.Fatal(err)
	}
	if code, body := get(t, w.local(enroll)); code != http.StatusForbidden || !strings.Contains(body, "identity provider") {
		t.Errorf("GET an enrollment nobody vouched for: %d %q, want 403", code, body)
	}
	if code, _ := post(t, w.local(enroll), `{}`); code != http.StatusGone {
		t.Errorf("POST on an enrollment nobody vouched for: %d, want 410", code)
	}
}
