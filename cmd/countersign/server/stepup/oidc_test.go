package stepup_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/approvaltest"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/cmd/countersign/server/stepup"
)

// emails is the Slack directory's profile emails.
type emails map[string]string

func (e emails) Email(_ context.Context, user string) (string, error) { return e[user], nil }

// oidcWorld is the page with a real local identity provider (mockoidc,
// over HTTP), served at an origin its callback reaches.
type oidcWorld struct {
	world
	idp    *mockoidc.MockOIDC
	origin string // the page's, which the identity provider calls back
}

const (
	carol      = "U0CAROL01"
	carolEmail = "carol@example.com"
)

func newOIDCWorld(t *testing.T) oidcWorld {
	t.Helper()
	m, err := mockoidc.Run()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = m.Shutdown() })
	// The clock is real: the identity provider signs tokens at its own
	// now, which go-oidc's verifier checks against the wall clock.
	clock := clocktest.New(clocktest.Opts{Start: time.Now()})
	w := oidcWorld{world: world{rec: approvaltest.NewRecords(clock.Now), audit: approvaltest.NewAuditor(clock.Now), clock: clock}, idp: m}
	gate, err := approval.NewGate(approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"delete_customer": {Risk: approval.RiskHigh, StepUp: &approval.StepUp{}},
		"rotate_keys":     {Risk: approval.RiskHigh, StepUp: &approval.StepUp{Methods: []approval.StepUpMethod{approval.StepUpOIDC}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	w.life, err = approval.NewLifecycle(approval.LifecycleOptions{Directory: approvaltest.Directory{Everyone: true}, Records: approvaltest.NewLedger(w.rec, w.audit), Gate: gate, Now: clock.Now})
	if err != nil {
		t.Fatal(err)
	}
	w.life.SetStepUps(approvaltest.NewStepUps(clock.Now))
	w.srv = httptest.NewUnstartedServer(nil)
	w.srv.Start()
	t.Cleanup(w.srv.Close)
	origin := strings.Replace(w.srv.URL, "127.0.0.1", "localhost", 1)
	w.origin = origin
	cfg := m.Config()
	w.page, err = stepup.New(stepup.Options{Domain: w.life, Keys: &keys{passkeys: map[string]map[string][]byte{}, sessions: map[string][]byte{}},
		Origin: origin, Prefix: "/stepup/", Emails: emails{carol: carolEmail},
		OIDC: &stepup.OIDC{Issuer: cfg.Issuer, ClientID: cfg.ClientID, ClientSecret: cfg.ClientSecret}})
	if err != nil {
		t.Fatal(err)
	}
	w.srv.Config.Handler = w.page
	return w
}

func (w oidcWorld) pendingTool(t *testing.T, tool string) *approval.Request {
	t.Helper()
	now := w.clock.Now()
	r, err := w.life.Create(context.Background(), &approval.Request{ID: approval.NewID("req"), RunID: "run_1", Requester: "U0ALICE01",
		Tool: tool, Args: json.RawMessage(`{"key":"prod"}`), Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject},
		Quorum: 1, Created: now, Deadline: now.Add(time.Hour)})
	if err != nil {
		t.Fatal(err)
	}
	return r
}

func (w oidcWorld) voteLink(t *testing.T, r *approval.Request) string {
	t.Helper()
	link, err := w.page.OfferStepUp(context.Background(), r, approval.Decision{RequestID: r.ID, Verdict: approval.VerdictApprove, Approver: carol,
		At: w.clock.Now(), Digest: r.Digest}, false)
	if err != nil {
		t.Fatalf("OfferStepUp: %v", err)
	}
	return link
}

// browser is a client with a cookie jar that follows redirects, noting
// the last URL it was sent to.
type browser struct {
	c    *http.Client
	last string
}

func newBrowser(t *testing.T) *browser {
	jar, err := cookiejar.New(nil)
	if err != nil {
		t.Fatal(err)
	}
	b := &browser{}
	b.c = &http.Client{Jar: jar, Timeout: 10 * time.Second, CheckRedirect: func(req *http.Request, _ []*http.Request) error {
		b.last = req.URL.String()
		return nil
	}}
	return b
}

func (b *browser) do(t *testing.T, method, url string) (int, string) {
	t.Helper()
	req, err := http.NewRequest(method, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(body)
}

var loginForm = regexp.MustCompile(`<form method="post" action="([^"]+)">`)

// signIn opens page and presses "Sign in with your identity provider": the
// page after the identity provider's round trip.
func (b *browser) signIn(t *testing.T, origin, page string) (int, string) {
	t.Helper()
	code, body := b.do(t, http.MethodGet, page)
	m := loginForm.FindStringSubmatch(body)
	if code != http.StatusOK || m == nil {
		t.Fatalf("GET %s: %d %q, want the sign-in button", page, code, body)
	}
	return b.do(t, http.MethodPost, origin+m[1])
}

// A vote on a tool that accepts oidc counts after a login whose verified
// email is the approver's Slack email, carrying the proof of that login;
// the callback replayed counts nothing.
func TestOIDCVote(t *testing.T) {
	w := newOIDCWorld(t)
	ctx := context.Background()
	r := w.pendingTool(t, "rotate_keys")
	w.idp.QueueUser(&mockoidc.MockUser{Subject: "carol-sub", Email: "Carol@Example.com", EmailVerified: true})
	b := newBrowser(t)
	code, body := b.signIn(t, w.origin, w.voteLink(t, r))
	if code != http.StatusOK || !strings.Contains(body, "counted (approved)") {
		t.Fatalf("vote by login: %d %q, want 200 counted", code, body)
	}
	got, _ := w.rec.Request(ctx, r.ID)
	if got.Status != approval.StatusApproved || len(got.Approvals) != 1 || got.Approvals[0].StepUp == nil ||
		got.Approvals[0].StepUp.Method != approval.StepUpOIDC || got.Approvals[0].StepUp.Credential != "oidc:carol-sub" {
		t.Fatalf("after the login: %s, approvals %+v, want approved by carol with an oidc proof", got.Status, got.Approvals)
	}
	if evs := w.audit.Events(r.ID); !slices.Contains(evs, approval.EventStepUpVerified) {
		t.Errorf("audit of %s = %v, want step_up_verified", r.ID, evs)
	}
	if !strings.Contains(b.last, "/stepup/oidc/callback?") {
		t.Fatalf("last redirect %q, want the callback", b.last)
	}
	callback := b.last
	if code, body := b.do(t, http.MethodGet, callback); code != http.StatusGone || !strings.Contains(body, "used already") {
		t.Errorf("the callback replayed: %d %q, want 410 used already", code, body)
	}

	// A tool that accepts passkeys only offers no login, and refuses one.
	r2 := w.pendingTool(t, "delete_customer")
	link := w.voteLink(t, r2)
	if _, body := b.do(t, http.MethodGet, link); strings.Contains(body, "identity provider") {
		t.Errorf("vote page of a passkey-only tool offers a login: %q", body)
	}
	token := link[strings.LastIndex(link, "/")+1:]
	if code, _ := b.do(t, http.MethodPost, w.origin+"/stepup/login/"+token); code != http.StatusForbidden {
		t.Errorf("login on a passkey-only vote: %d, want 403", code)
	}
}

// Each login that does not prove the approver counts nothing and burns the
// link, audited: another person's email, an unverified one, a login
// finished in another browser, a state never given out.
func TestOIDCVoteRefused(t *testing.T) {
	w := newOIDCWorld(t)
	ctx := context.Background()
	for _, c := range []struct {
		name string
		user *mockoidc.MockUser
		want string
	}{
		{"another email", &mockoidc.MockUser{Subject: "mallory", Email: "mallory@example.com", EmailVerified: true}, "is not this Slack user"},
		{"unverified email", &mockoidc.MockUser{Subject: "carol-sub", Email: carolEmail, EmailVerified: false}, "could not be verified"},
	} {
		r := w.pendingTool(t, "rotate_keys")
		w.idp.QueueUser(c.user)
		b := newBrowser(t)
		link := w.voteLink(t, r)
		code, body := b.signIn(t, w.origin, link)
		if code != http.StatusForbidden || !strings.Contains(body, c.want) || !strings.Contains(body, "nothing was counted") {
			t.Errorf("%s: %d %q, want 403 %q", c.name, code, body, c.want)
		}
		if code, _ := b.do(t, http.MethodGet, link); code != http.StatusGone {
			t.Errorf("%s: the link after the refusal: %d, want 410 (used)", c.name, code)
		}
		got, _ := w.rec.Request(ctx, r.ID)
		if got.Status != approval.StatusPending || len(got.Approvals) != 0 {
			t.Errorf("%s: %s with %d approvals, want pending with none", c.name, got.Status, len(got.Approvals))
		}
		if evs := w.audit.Events(r.ID); !slices.Contains(evs, approval.EventStepUpRefused) {
			t.Errorf("%s: audit %v, want step_up_refused", c.name, evs)
		}
	}

	// Started in one browser, finished in another: the state cookie is
	// missing.
	r := w.pendingTool(t, "rotate_keys")
	w.idp.QueueUser(&mockoidc.MockUser{Subject: "carol-sub", Email: carolEmail, EmailVerified: true})
	a := newBrowser(t)
	a.c.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }
	link := w.voteLink(t, r)
	_, body := a.do(t, http.MethodGet, link)
	m := loginForm.FindStringSubmatch(body)
	if m == nil {
		t.Fatalf("no sign-in button on %q", body)
	}
	resp, err := a.c.Post(w.origin+m[1], "", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if code, body := newBrowser(t).do(t, http.MethodGet, resp.Header.Get("Location")); code != http.StatusForbidden || !strings.Contains(body, "another browser") {
		t.Errorf("login finished in another browser: %d %q, want 403", code, body)
	}
	if code, body := newBrowser(t).do(t, http.MethodGet, w.origin+"/stepup/oidc/callback?code=x&state=forged"); code != http.StatusGone || !strings.Contains(body, "nothing was counted") {
		t.Errorf("a forged state: %d %q, want 410", code, body)
	}
	got, _ := w.rec.Request(ctx, r.ID)
	if got.Status != approval.StatusPending {
		t.Errorf("after the refusals: %s, want pending", got.Status)
	}
}

// An enrollment nobody vouched for unlocks after a login as its user (the
// registration is offered, naming the login's email); another person's
// login refuses it and burns the link.
func TestOIDCEnrollment(t *testing.T) {
	w := newOIDCWorld(t)
	ctx := context.Background()
	link, err := w.page.OfferOIDCEnrollment(ctx, carol)
	if err != nil || link == "" {
		t.Fatalf("OfferOIDCEnrollment: %q, %v", link, err)
	}
	b := newBrowser(t)
	if code, body := b.do(t, http.MethodGet, link); code != http.StatusOK || strings.Contains(body, `data-testid="confirm"`) {
		t.Fatalf("the enrollment before a login: %d %q, want the sign-in button only", code, body)
	}
	w.idp.QueueUser(&mockoidc.MockUser{Subject: "carol-sub", Email: carolEmail, EmailVerified: true})
	code, body := b.signIn(t, w.origin, link)
	if code != http.StatusOK || !strings.Contains(body, `data-testid="confirm"`) || !strings.Contains(body, carolEmail) {
		t.Fatalf("the enrollment after carol's login: %d %q, want the registration, naming %s", code, body, carolEmail)
	}

	other, err := w.page.OfferOIDCEnrollment(ctx, carol)
	if err != nil {
		t.Fatal(err)
	}
	w.idp.QueueUser(&mockoidc.MockUser{Subject: "mallory", Email: "mallory@example.com", EmailVerified: true})
	if code, body := newBrowser(t).signIn(t, w.origin, other); code != http.StatusForbidden || !strings.Contains(body, "is not this Slack user") {
		t.Errorf("enrollment with another person's login: %d %q, want 403", code, body)
	}
	if code, _ := newBrowser(t).do(t, http.MethodGet, other); code != http.StatusGone {
		t.Errorf("the enrollment link after the refusal: %d, want 410", code)
	}
	if evs := w.audit.Events(""); !slices.Contains(evs, approval.EventPasskeyRefused) {
		t.Errorf("audit %v, want passkey_enrollment_refused", evs)
	}
}

// The three settings go together, each error naming its variable.
func TestCheckOIDC(t *testing.T) {
	if errs := stepup.CheckOIDC("", "", "", ""); errs != nil {
		t.Errorf("none set: %v, want no error", errs)
	}
	if errs := stepup.CheckOIDC("https://idp.example.com", "cs", "secret", "https://cs.example.com"); errs != nil {
		t.Errorf("all set: %v, want no error", errs)
	}
	for _, c := range []struct {
		issuer, id, secret, public string
		want                       []string
	}{
		{"https://idp.example.com", "", "", "https://cs.example.com", []string{"COUNTERSIGN_OIDC_CLIENT_ID: required", "COUNTERSIGN_OIDC_CLIENT_SECRET: required"}},
		{"", "cs", "secret", "https://cs.example.com", []string{"COUNTERSIGN_OIDC_ISSUER: \"\" is not"}},
		{"http://idp.example.com", "cs", "secret", "https://cs.example.com", []string{"COUNTERSIGN_OIDC_ISSUER: \"http://idp.example.com\" must be https"}},
		{"https://idp.example.com", "cs", "secret", "", []string{"COUNTERSIGN_OIDC_ISSUER: needs COUNTERSIGN_PUBLIC_URL"}},
	} {
		errs := stepup.CheckOIDC(c.issuer, c.id, c.secret, c.public)
		if len(errs) != len(c.want) {
			t.Errorf("CheckOIDC(%q, %q, %q, %q) = %v, want %d errors", c.issuer, c.id, c.secret, c.public, errs, len(c.want))
			continue
		}
		for i, w := range c.want {
			if !strings.HasPrefix(errs[i].Error(), w) {
				t.Errorf("error %d = %q, want it to start %q", i, errs[i], w)
			}
		}
	}
}

// A login whose ID token carries another nonce than the link's (a token
// minted for another link, or a login started elsewhere, injected into
// this one) counts nothing: the browser's way to the identity provider is
// rewritten to ask for another nonce, so the token comes back signed and
// valid, but not for this vote.
func TestOIDCVoteOtherNonce(t *testing.T) {
	w := newOIDCWorld(t)
	r := w.pendingTool(t, "rotate_keys")
	w.idp.QueueUser(&mockoidc.MockUser{Subject: "carol-sub", Email: carolEmail, EmailVerified: true})
	b := newBrowser(t)
	rewrote := false
	b.c.CheckRedirect = func(req *http.Request, _ []*http.Request) error {
		b.last = req.URL.String()
		if q := req.URL.Query(); q.Get("nonce") != "" {
			q.Set("nonce", "a-nonce-of-another-link")
			req.URL.RawQuery = q.Encode()
			rewrote = true
		}
		return nil
	}
	code, body := b.signIn(t, w.origin, w.voteLink(t, r))
	if !rewrote {
		t.Fatal("the way to the identity provider carried no nonce to rewrite")
	}
	if code != http.StatusForbidden || !strings.Contains(body, "nothing was counted") {
		t.Errorf("a token with another nonce: %d %q, want 403, nothing counted", code, body)
	}
	got, _ := w.rec.Request(context.Background(), r.ID)
	if got.Status != approval.StatusPending || len(got.Approvals) != 0 {
		t.Errorf("%s with %d approvals, want pending with none", got.Status, len(got.Approvals))
	}
	if evs := w.audit.Events(r.ID); !slices.Contains(evs, approval.EventStepUpRefused) {
		t.Errorf("audit %v, want step_up_refused", evs)
	}
}
