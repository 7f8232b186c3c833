package stepup

// This file: the second way to confirm a vote, and to unlock a passkey
// enrollment without a colleague: a login at the organisation's identity
// provider (OpenID Connect, authorization code flow). The page is
// go-oidc's and golang.org/x/oauth2's one home. The login proves who is
// at the keyboard only when the identity provider's verified email is the
// Slack user's own (users.info profile email): anybody else's login counts
// nothing.

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/coreos/go-oidc/v3/oidc"
	"golang.org/x/oauth2"

	"github.com/countersign/countersign/approval"
)

// OIDC is the identity provider the page signs people in at.
type OIDC struct {
	// Issuer is the provider's issuer URL (its discovery document is at
	// Issuer + "/.well-known/openid-configuration").
	Issuer       string
	ClientID     string
	ClientSecret string
	// HTTPClient talks to the provider; nil: one with a 10 s timeout.
	HTTPClient *http.Client
}

// Emails gives a Slack user's profile email (users.info, which needs the
// users:read.email scope); "" when Slack shows none.
type Emails interface {
	Email(ctx context.Context, user string) (string, error)
}

// OIDCFrom is the provider of the three settings, nil when none is set.
func OIDCFrom(issuer, clientID, clientSecret string) *OIDC {
	if issuer == "" && clientID == "" && clientSecret == "" {
		return nil
	}
	return &OIDC{Issuer: issuer, ClientID: clientID, ClientSecret: clientSecret}
}

// CheckOIDC checks the identity provider's settings; each error names its
// variable. All three are set, or none (no login offered).
func CheckOIDC(issuer, clientID, clientSecret, publicURL string) []error {
	if issuer == "" && clientID == "" && clientSecret == "" {
		return nil
	}
	var errs []error
	if u, err := url.Parse(issuer); issuer == "" || err != nil || (u.Scheme != "https" && u.Scheme != "http") || u.Host == "" {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_OIDC_ISSUER: %q is not the identity provider's issuer URL (e.g. https://accounts.google.com); COUNTERSIGN_OIDC_CLIENT_ID and COUNTERSIGN_OIDC_CLIENT_SECRET need it", issuer))
	} else if u.Scheme == "http" && u.Hostname() != "localhost" && u.Hostname() != "127.0.0.1" && u.Hostname() != "::1" {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_OIDC_ISSUER: %q must be https (plain http only on this machine, for a local test provider)", issuer))
	}
	if clientID == "" {
		errs = append(errs, errors.New("COUNTERSIGN_OIDC_CLIENT_ID: required with COUNTERSIGN_OIDC_ISSUER (the client id the identity provider gave Countersign)"))
	}
	if clientSecret == "" {
		errs = append(errs, errors.New("COUNTERSIGN_OIDC_CLIENT_SECRET: required with COUNTERSIGN_OIDC_ISSUER (the client secret the identity provider gave Countersign)"))
	}
	if publicURL == "" {
		errs = append(errs, errors.New("COUNTERSIGN_OIDC_ISSUER: needs COUNTERSIGN_PUBLIC_URL (the login comes back to its /stepup/oidc/callback)"))
	}
	return errs
}

// idp is the provider, discovered on first use (a provider down at start
// must not stop Countersign; a failed discovery is tried again next time).
type idp struct {
	cfg OIDC
	mu  sync.Mutex // guards provider
	pr  *oidc.Provider
}

func (i *idp) provider() (*oidc.Provider, error) {
	i.mu.Lock()
	defer i.mu.Unlock()
	if i.pr != nil {
		return i.pr, nil
	}
	// The context lives as long as the page: go-oidc fetches the signing
	// keys with it later, on rotation.
	pr, err := oidc.NewProvider(i.ctx(context.Background()), i.cfg.Issuer)
	if err != nil {
		return nil, err
	}
	i.pr = pr
	return pr, nil
}

func (i *idp) ctx(ctx context.Context) context.Context {
	c := i.cfg.HTTPClient
	if c == nil {
		c = &http.Client{Timeout: 10 * time.Second}
	}
	return oidc.ClientContext(ctx, c)
}

// oidcOffered reports whether the login is offered for link: always for
// an enrollment, for a vote when its tool accepts oidc.
func (p *Page) oidcOffered(link approval.StepUpLink) bool {
	if p.idp == nil {
		return false
	}
	return link.Purpose == approval.PurposeEnroll || slices.Contains(link.Need.Methods, approval.StepUpOIDC)
}

func (p *Page) oauth(pr *oidc.Provider) *oauth2.Config {
	return &oauth2.Config{ClientID: p.idp.cfg.ClientID, ClientSecret: p.idp.cfg.ClientSecret, Endpoint: pr.Endpoint(),
		RedirectURL: strings.TrimSuffix(p.opts.Origin, "/") + p.opts.Prefix + "oidc/callback",
		Scopes:      []string{oidc.ScopeOpenID, "email"}}
}

// oidcNonce is the nonce of link's login: its challenge, so an ID token
// issued for one vote (request, digest, verdict, approver, the link's own
// nonce) never confirms another.
func oidcNonce(link approval.StepUpLink) string {
	return base64.RawURLEncoding.EncodeToString(approval.StepUpChallenge(link))
}

// stateCookie binds the login to the browser that started it.
const stateCookie = "countersign_oidc_state"

// oidcLogin is what a login's state stands for, kept until it comes back.
type oidcLogin struct {
	Token string `json:"token"`
}

func stateKey(state string) string {
	h := sha256.Sum256([]byte(state))
	return "oidc:" + base64.RawURLEncoding.EncodeToString(h[:])
}

// unlockKey keeps an enrollment unlocked by a login, for the registration
// page that follows.
func unlockKey(token string) string { return "oidc-unlock:" + sessionKey(token) }

// oidcStart (POST oidc/start/{token}) sends the browser to the identity
// provider with a fresh state (kept here and in a cookie) and the link's
// nonce. Nothing is used yet: the link is taken when the login comes back.
func (p *Page) oidcStart(w http.ResponseWriter, r *http.Request, token string) {
	ctx := r.Context()
	link, _, err := p.opts.Domain.StepUpLink(ctx, token)
	if errors.Is(err, approval.ErrStepUpLinkGone) || errors.Is(err, approval.ErrNotFound) {
		p.say(w, http.StatusGone, sayGone)
		return
	}
	if err != nil {
		p.fail(w, "read step-up link", err)
		return
	}
	if !p.oidcOffered(link) {
		p.say(w, http.StatusForbidden, "A login at the identity provider does not confirm this vote: use your passkey.")
		return
	}
	pr, err := p.idp.provider()
	if err != nil {
		p.fail(w, "discover the identity provider", err)
		return
	}
	state, err := randomState()
	if err == nil {
		var b []byte
		b, _ = json.Marshal(oidcLogin{Token: token})
		err = p.opts.Keys.SaveStepUpSession(ctx, stateKey(state), b, time.Until(link.Expires))
	}
	if err != nil {
		p.fail(w, "keep the login's state", err)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: stateCookie, Value: state, Path: p.opts.Prefix + "oidc/", MaxAge: int(approval.StepUpLinkTTL / time.Second),
		HttpOnly: true, Secure: strings.HasPrefix(p.opts.Origin, "https://"), SameSite: http.SameSiteLaxMode})
	http.Redirect(w, r, p.oauth(pr).AuthCodeURL(state, oidc.Nonce(oidcNonce(link))), http.StatusSeeOther)
}

func randomState() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// Sentences of the login: one each, nothing counted.
const (
	sayLoginGone     = "This sign-in was used already or has expired: nothing was counted. Open the link from Slack again."
	sayLoginBrowser  = "This sign-in was started in another browser (or its cookie is gone): nothing was counted. Click the card's button again."
	sayLoginFailed   = "The identity provider's login could not be verified: nothing was counted."
	sayEmailMismatch = "The identity provider signed in somebody whose verified email is not this Slack user's: nothing was counted."
)

// oidcCallback (GET oidc/callback) finishes a login: the state must be one
// this page gave out (once) to this browser; the vote's link is then used,
// whatever follows; the ID token must verify (issuer, audience, expiry,
// signature) and carry the link's nonce and a verified email equal to the
// Slack user's. Only then does the vote decide, through the same door as
// a passkey's, or the enrollment unlock.
func (p *Page) oidcCallback(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	q := r.URL.Query()
	state := q.Get("state")
	var login oidcLogin
	b, err := p.opts.Keys.TakeStepUpSession(ctx, stateKey(state))
	if err == nil {
		err = json.Unmarshal(b, &login)
	}
	if state == "" || err != nil {
		code := "oidc_state_unknown"
		if state == "" {
			code = "oidc_state_missing"
		}
		p.opts.Domain.StepUpRefused(ctx, approval.StepUpLink{Purpose: approval.PurposeVote}, code)
		p.say(w, http.StatusGone, sayLoginGone)
		return
	}
	// The link: a vote's is used now (one use, whatever follows); an
	// enrollment's only after its passkey is registered, or now on failure.
	var link approval.StepUpLink
	if link, _, err = p.opts.Domain.StepUpLink(ctx, login.Token); err == nil && link.Purpose == approval.PurposeVote {
		link, err = p.opts.Domain.TakeStepUpLink(ctx, login.Token)
	}
	if errors.Is(err, approval.ErrStepUpLinkGone) || errors.Is(err, approval.ErrNotFound) {
		p.say(w, http.StatusGone, sayGone)
		return
	}
	if err != nil {
		p.fail(w, "read step-up link", err)
		return
	}
	refuse := func(code string, status int, sentence string) {
		if link.Purpose == approval.PurposeEnroll {
			_, _ = p.opts.Domain.TakeStepUpLink(ctx, login.Token)
		}
		p.opts.Domain.StepUpRefused(ctx, link, code)
		p.say(w, status, sentence)
	}
	if c, err := r.Cookie(stateCookie); err != nil || c.Value != state {
		refuse("oidc_state_mismatch", http.StatusForbidden, sayLoginBrowser)
		return
	}
	http.SetCookie(w, &http.Cookie{Name: stateCookie, Path: p.opts.Prefix + "oidc/", MaxAge: -1})
	if !p.oidcOffered(link) {
		refuse("oidc_not_accepted", http.StatusForbidden, sayLoginFailed)
		return
	}
	email, sub, err := p.oidcIdentity(r.Context(), q, link)
	if err != nil {
		p.log.InfoContext(ctx, "identity provider login refused", "user", link.User, "err", err)
		refuse("oidc_not_verified", http.StatusForbidden, sayLoginFailed)
		return
	}
	want, err := p.slackEmail(ctx, link.User)
	if err != nil {
		p.log.WarnContext(ctx, "slack email unknown", "user", link.User, "err", err)
		refuse("slack_email_unknown", http.StatusForbidden, "Slack shows no email for you, so the identity provider's login cannot be matched to you: nothing was counted.")
		return
	}
	if !strings.EqualFold(strings.TrimSpace(email), strings.TrimSpace(want)) {
		p.log.InfoContext(ctx, "identity provider email is not the slack user's", "user", link.User)
		refuse("oidc_email_mismatch", http.StatusForbidden, sayEmailMismatch)
		return
	}
	if link.Purpose == approval.PurposeEnroll {
		if err := p.opts.Keys.SaveStepUpSession(ctx, unlockKey(login.Token), []byte(email), time.Until(link.Expires)); err != nil {
			p.fail(w, "keep the unlocked enrollment", err)
			return
		}
		http.Redirect(w, r, p.opts.Prefix+"enroll/"+login.Token, http.StatusSeeOther)
		return
	}
	after, err := p.opts.Domain.DecideSteppedUp(ctx, link, approval.StepUpOIDC, "oidc:"+sub)
	p.decided(w, after, err)
}

// oidcIdentity exchanges the code and verifies the ID token: the verified
// email and the subject, or why not.
func (p *Page) oidcIdentity(ctx context.Context, q url.Values, link approval.StepUpLink) (email, sub string, err error) {
	if e := q.Get("error"); e != "" {
		return "", "", fmt.Errorf("the provider answered %s: %s", e, q.Get("error_description"))
	}
	pr, err := p.idp.provider()
	if err != nil {
		return "", "", err
	}
	ctx = p.idp.ctx(ctx)
	tok, err := p.oauth(pr).Exchange(ctx, q.Get("code"))
	if err != nil {
		return "", "", fmt.Errorf("code exchange: %w", err)
	}
	raw, _ := tok.Extra("id_token").(string)
	if raw == "" {
		return "", "", errors.New("no id_token in the token response")
	}
	idt, err := pr.Verifier(&oidc.Config{ClientID: p.idp.cfg.ClientID}).Verify(ctx, raw)
	if err != nil {
		return "", "", err
	}
	if idt.Nonce != oidcNonce(link) {
		return "", "", errors.New("the ID token's nonce is not this link's")
	}
	var claims struct {
		Email         string `json:"email"`
		EmailVerified *bool  `json:"email_verified"`
	}
	if err := idt.Claims(&claims); err != nil {
		return "", "", err
	}
	if claims.Email == "" || claims.EmailVerified == nil || !*claims.EmailVerified {
		return "", "", errors.New("the ID token has no verified email")
	}
	return claims.Email, idt.Subject, nil
}

func (p *Page) slackEmail(ctx context.Context, user string) (string, error) {
	if p.opts.Emails == nil {
		return "", errors.New("no Slack directory")
	}
	e, err := p.opts.Emails.Email(ctx, user)
	if err == nil && e == "" {
		err = errors.New("no profile email (the app needs the users:read.email scope)")
	}
	return e, err
}
