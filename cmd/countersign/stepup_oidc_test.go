package main_test

import (
	"context"
	"io"
	"net/http"
	"net/http/cookiejar"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/oauth2-proxy/mockoidc"

	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

var signInForm = regexp.MustCompile(`<form method="post" action="([^"]+)">`)

// TestDemoOIDCEnrollment is the login at an identity provider wired end to
// end (no browser needed): with COUNTERSIGN_OIDC_* set, /countersign
// passkey answers with a registration link at once; a login as carol at a
// real local identity provider (mockoidc), whose email is her Slack
// profile's (users.info), unlocks the registration; a login as somebody
// else is refused and audited.
func TestDemoOIDCEnrollment(t *testing.T) {
	t.Parallel()
	idp, err := mockoidc.Run()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = idp.Shutdown() })
	cfg := idp.Config()
	d := MustStartDemo(t, &main.Demo{World: demo.World{}, Configure: func(c *main.Config) {
		c.OIDCIssuer, c.OIDCClientID, c.OIDCClientSecret = cfg.Issuer, cfg.ClientID, cfg.ClientSecret
	}})
	ws, cast := d.Workspace, d.Cast
	carol := cast.SecondApprover
	carol.Email = "carol@example.com"
	ws.AddUser(carol)

	register := func() string {
		t.Helper()
		before := len(ws.Ephemerals(carol.ID))
		if err := ws.SlashCommand(carol.ID, cast.Approvals.ID, "/countersign", "passkey"); err != nil {
			t.Fatalf("/countersign passkey: %v", err)
		}
		var link string
		waitWS(t, d, "the registration link", func() bool {
			for _, m := range ws.Ephemerals(carol.ID)[before:] {
				if v := enrollLink.FindStringSubmatch(m.Text); v != nil {
					link = v[1]
					return true
				}
			}
			return false
		})
		return link
	}
	signIn := func(link string) (int, string) {
		t.Helper()
		jar, _ := cookiejar.New(nil)
		c := &http.Client{Jar: jar, Timeout: 10 * time.Second}
		resp, err := c.Get(link)
		if err != nil {
			t.Fatal(err)
		}
		page, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		m := signInForm.FindStringSubmatch(string(page))
		if m == nil {
			t.Fatalf("the enrollment page has no sign-in button:\n%s", page)
		}
		resp, err = c.Post(strings.TrimSuffix(d.Main.Config.PublicURL, "/")+m[1], "", nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}

	idp.QueueUser(&mockoidc.MockUser{Subject: "carol-sub", Email: "carol@example.com", EmailVerified: true})
	if code, page := signIn(register()); code != http.StatusOK || !strings.Contains(page, `data-testid="confirm"`) || !strings.Contains(page, "carol@example.com") {
		t.Fatalf("carol's login: %d\n%s\nwant the registration unlocked", code, page)
	}
	idp.QueueUser(&mockoidc.MockUser{Subject: "mallory", Email: "mallory@example.com", EmailVerified: true})
	if code, page := signIn(register()); code != http.StatusForbidden || !strings.Contains(page, "nothing was counted") {
		t.Fatalf("another person's login: %d\n%s\nwant 403", code, page)
	}
	waitAudit(t, d, "", approval.EventPasskeyRefused)
	if ids, err := d.Main.StepUp.PasskeyIDs(context.Background(), carol.ID); err != nil || len(ids) != 0 {
		t.Errorf("carol's passkeys = %v, %v: want none (nothing registered yet)", ids, err)
	}
}
