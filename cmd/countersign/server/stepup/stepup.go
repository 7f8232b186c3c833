// Package stepup is the step-up page of `countersign serve`: where an
// approver confirms a vote with a passkey (WebAuthn) before it counts, and
// registers that passkey on a one-time enrollment link. It is go-webauthn's
// one home. The page verifies; the domain decides (approval.Lifecycle:
// TakeStepUpLink, DecideSteppedUp, the audit of every enrollment, use and
// failure). Nothing of WebAuthn is written here: the ceremony is
// go-webauthn's on the server and the browser's own JSON forms of it
// (PublicKeyCredential.parseRequestOptionsFromJSON, toJSON) on the page.
package stepup

import (
	"cmp"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io"
	"log/slog"
	"maps"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/go-webauthn/webauthn/protocol"
	"github.com/go-webauthn/webauthn/webauthn"

	"github.com/countersign/countersign/approval"
)

// Domain is what the page asks of the lifecycle (*approval.Lifecycle).
type Domain interface {
	StepUpLink(ctx context.Context, token string) (approval.StepUpLink, *approval.Request, error)
	TakeStepUpLink(ctx context.Context, token string) (approval.StepUpLink, error)
	StepUpRefused(ctx context.Context, link approval.StepUpLink, code string)
	DecideSteppedUp(ctx context.Context, link approval.StepUpLink, method approval.StepUpMethod, credential string) (*approval.Request, error)
	PasskeyEnrolled(ctx context.Context, link approval.StepUpLink, credential, idpEmail string)
	PasskeyRevoked(ctx context.Context, user, credential, by string)
	OfferStepUp(ctx context.Context, r *approval.Request, d approval.Decision, allow bool) (string, error)
	OfferEnrollment(ctx context.Context, user, vouchedBy string) (string, error)
}

// Keys keeps each user's passkeys and the registration ceremonies under
// way (*store.Store). Errors mean the store could not be read or written;
// TakeStepUpSession gives approval.ErrNotFound when there is none.
type Keys interface {
	AddPasskey(ctx context.Context, user, id string, data []byte) error
	Passkeys(ctx context.Context, user string) ([][]byte, error)
	RemovePasskey(ctx context.Context, user, id string) (bool, error)
	SaveStepUpSession(ctx context.Context, key string, data []byte, ttl time.Duration) error
	TakeStepUpSession(ctx context.Context, key string) ([]byte, error)
}

// Names turns a Slack id into a name for the page (the bot's cached
// users.info); "" when unknown.
type Names interface {
	Name(ctx context.Context, id string) string
}

// Options configure the page.
type Options struct {
	Domain Domain
	Keys   Keys
	Names  Names // optional: ids are shown
	// Origin is the page's public origin (scheme, host, port:
	// http://localhost:8080); its host is the passkeys' relying party id.
	Origin string
	// Prefix is where the page is mounted (server.PathStepUp).
	Prefix string
	// OIDC, when set, offers a login at the identity provider: to confirm
	// votes whose tool accepts oidc, and to unlock an enrollment without a
	// colleague. Emails is then needed (the bot; SetNames sets it).
	OIDC   *OIDC
	Emails Emails
	Logger *slog.Logger
}

// Page is the step-up page's handler.
type Page struct {
	opts Options
	wa   *webauthn.WebAuthn
	idp  *idp // nil: no login at an identity provider
	log  *slog.Logger
}

// New checks the options and builds the page.
func New(opts Options) (*Page, error) {
	switch {
	case opts.Domain == nil || opts.Keys == nil:
		return nil, errors.New("stepup: Options.Domain and Options.Keys are required")
	case opts.Origin == "":
		return nil, errors.New("stepup: Options.Origin is required (the page's public origin, e.g. https://countersign.example.com)")
	}
	host := opts.Origin
	if i := strings.Index(host, "://"); i >= 0 {
		host = host[i+3:]
	}
	host, _, _ = strings.Cut(host, "/")
	if h, _, ok := strings.Cut(host, ":"); ok {
		host = h
	}
	wa, err := webauthn.New(&webauthn.Config{RPID: host, RPDisplayName: "Countersign", RPOrigins: []string{strings.TrimSuffix(opts.Origin, "/")}})
	if err != nil {
		return nil, fmt.Errorf("stepup: origin %s: %w", opts.Origin, err)
	}
	opts.Prefix = cmp.Or(opts.Prefix, "/stepup/")
	p := &Page{opts: opts, wa: wa, log: cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))}
	if opts.OIDC != nil {
		if errs := CheckOIDC(opts.OIDC.Issuer, opts.OIDC.ClientID, opts.OIDC.ClientSecret, opts.Origin); len(errs) > 0 {
			return nil, errors.Join(errs...)
		}
		p.idp = &idp{cfg: *opts.OIDC}
	}
	return p, nil
}

// SetNames sets how the page names people (the bot, built after the page),
// and, when n also gives emails (Emails), whose the identity provider's
// logins must be. Call it once, before serving.
func (p *Page) SetNames(n Names) {
	p.opts.Names = n
	if e, ok := n.(Emails); ok {
		p.opts.Emails = e
	}
}

// OfferOIDCEnrollment makes a one-time enrollment link for user that a
// login at the identity provider as user unlocks (no colleague vouches),
// and returns its URL; "" when no identity provider is configured.
func (p *Page) OfferOIDCEnrollment(ctx context.Context, user string) (string, error) {
	if p.idp == nil {
		return "", nil
	}
	return p.OfferEnrollment(ctx, user, "")
}

// OfferStepUp makes the one-time link of a vote that needs a confirmation
// (Lifecycle.OfferStepUp) and returns its URL: what the bot sends the
// approver.
func (p *Page) OfferStepUp(ctx context.Context, r *approval.Request, d approval.Decision, allow bool) (string, error) {
	token, err := p.opts.Domain.OfferStepUp(ctx, r, d, allow)
	if err != nil {
		return "", err
	}
	return p.VoteURL(token), nil
}

// OfferEnrollment makes the one-time enrollment link of user's passkey,
// vouched for by vouchedBy (Lifecycle.OfferEnrollment), and returns its URL.
func (p *Page) OfferEnrollment(ctx context.Context, user, vouchedBy string) (string, error) {
	token, err := p.opts.Domain.OfferEnrollment(ctx, user, vouchedBy)
	if err != nil {
		return "", err
	}
	return p.EnrollURL(token), nil
}

// PasskeyIDs lists user's passkeys by id (base64url), sorted.
func (p *Page) PasskeyIDs(ctx context.Context, user string) ([]string, error) {
	u, err := p.user(ctx, user)
	if err != nil {
		return nil, err
	}
	var ids []string
	for _, c := range u.creds {
		ids = append(ids, base64.RawURLEncoding.EncodeToString(c.ID))
	}
	slices.Sort(ids)
	return ids, nil
}

// RevokePasskey removes user's passkey id, by by, audited
// (passkey_revoked); false when user had no such passkey.
func (p *Page) RevokePasskey(ctx context.Context, user, id, by string) (bool, error) {
	ok, err := p.opts.Keys.RemovePasskey(ctx, user, id)
	if err != nil || !ok {
		return false, err
	}
	p.opts.Domain.PasskeyRevoked(ctx, user, id, by)
	return true, nil
}

// VoteURL is the link of a vote's token.
func (p *Page) VoteURL(token string) string {
	return strings.TrimSuffix(p.opts.Origin, "/") + p.opts.Prefix + "vote/" + token
}

// EnrollURL is the link of an enrollment's token.
func (p *Page) EnrollURL(token string) string {
	return strings.TrimSuffix(p.opts.Origin, "/") + p.opts.Prefix + "enroll/" + token
}

// ServeHTTP serves GET and POST on vote/{token} and enroll/{token}.
func (p *Page) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	rest, ok := strings.CutPrefix(r.URL.Path, p.opts.Prefix)
	kind, token, _ := strings.Cut(rest, "/")
	if ok && rest == "oidc/callback" && r.Method == http.MethodGet && p.idp != nil {
		w.Header().Set("Cache-Control", "no-store")
		w.Header().Set("Referrer-Policy", "no-referrer")
		p.oidcCallback(w, r)
		return
	}
	if !ok || token == "" || strings.Contains(token, "/") {
		http.NotFound(w, r)
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	w.Header().Set("X-Frame-Options", "DENY")
	switch {
	case kind == "vote" && r.Method == http.MethodGet:
		p.votePage(w, r, token)
	case kind == "vote" && r.Method == http.MethodPost:
		p.vote(w, r, token)
	case kind == "enroll" && r.Method == http.MethodGet:
		p.enrollPage(w, r, token)
	case kind == "enroll" && r.Method == http.MethodPost:
		p.enroll(w, r, token)
	case kind == "login" && r.Method == http.MethodPost && p.idp != nil:
		p.oidcStart(w, r, token)
	default:
		http.NotFound(w, r)
	}
}

// user is a Slack user as go-webauthn sees them: their id is the user
// handle.
type user struct {
	id, name string
	creds    []webauthn.Credential
}

func (u *user) WebAuthnID() []byte                         { return []byte(u.id) }
func (u *user) WebAuthnName() string                       { return u.id }
func (u *user) WebAuthnDisplayName() string                { return cmp.Or(u.name, u.id) }
func (u *user) WebAuthnCredentials() []webauthn.Credential { return u.creds }

func (p *Page) name(ctx context.Context, id string) string {
	if p.opts.Names != nil {
		if n := p.opts.Names.Name(ctx, id); n != "" {
			return n
		}
	}
	return id
}

func (p *Page) user(ctx context.Context, id string) (*user, error) {
	raw, err := p.opts.Keys.Passkeys(ctx, id)
	if err != nil {
		return nil, err
	}
	u := &user{id: id, name: p.name(ctx, id)}
	for _, b := range raw {
		var c webauthn.Credential
		if err := json.Unmarshal(b, &c); err != nil {
			return nil, fmt.Errorf("passkey of %s: %w", id, err)
		}
		u.creds = append(u.creds, c)
	}
	return u, nil
}

// assertion begins the login ceremony of link for u: its challenge is the
// link's (approval.StepUpChallenge), so beginning it again when the answer
// comes gives the same session, and an answer made for another vote never
// matches.
func (p *Page) assertion(u *user, link approval.StepUpLink) (*protocol.CredentialAssertion, *webauthn.SessionData, error) {
	return p.wa.BeginLogin(u, webauthn.WithChallenge(approval.StepUpChallenge(link)),
		webauthn.WithUserVerification(protocol.VerificationRequired))
}

// Sentences the page answers with: one each, nothing counted.
const (
	sayGone      = "This link was used already or has expired: click the card's button again for a new one."
	sayNoPasskey = "You have no passkey registered for Countersign yet: type /countersign passkey in Slack to register one."
	sayNotYou    = "The passkey was not accepted for this vote (it is not the approver's, or the confirmation failed): nothing was counted."
	sayChanged   = "The arguments changed since you clicked (an edit landed): nothing was counted; look at the card again."
	sayError     = "Something went wrong on our side: nothing was counted. Try again from the card."
	sayRefused   = "Your vote was refused: "
)

func (p *Page) votePage(w http.ResponseWriter, r *http.Request, token string) {
	ctx := r.Context()
	link, req, err := p.opts.Domain.StepUpLink(ctx, token)
	if errors.Is(err, approval.ErrStepUpLinkGone) || errors.Is(err, approval.ErrNotFound) || (err == nil && link.Purpose != approval.PurposeVote) {
		p.say(w, http.StatusGone, sayGone)
		return
	}
	if err != nil {
		p.fail(w, "read step-up link", err)
		return
	}
	u, err := p.user(ctx, link.User)
	if err != nil {
		p.fail(w, "read passkeys", err)
		return
	}
	v := votePage{Title: "Confirm your vote", Facts: p.facts(ctx, req, link), Approver: u.WebAuthnDisplayName()}
	if p.oidcOffered(link) {
		v.Login = p.opts.Prefix + "login/" + token
	}
	passkey := len(link.Need.Methods) == 0 || slices.Contains(link.Need.Methods, approval.StepUpPasskey)
	switch {
	case !passkey:
		if v.Login == "" {
			v.Message = "This vote needs a login at your identity provider, which this deployment does not offer (COUNTERSIGN_OIDC_ISSUER is not set): nothing can be counted. Tell whoever runs Countersign."
		}
	case len(u.creds) == 0:
		v.Message = sayNoPasskey
	default:
		opts, _, err := p.assertion(u, link)
		if err != nil {
			p.fail(w, "begin passkey login", err)
			return
		}
		b, err := json.Marshal(opts.Response)
		if err != nil {
			p.fail(w, "encode passkey options", err)
			return
		}
		v.Options = template.JS(b)
		v.Post = p.opts.Prefix + "vote/" + token
		v.Button = "Confirm with your passkey"
	}
	p.render(w, http.StatusOK, v)
}

// takePosted reads a posted ceremony's body (unreadable: 400 saying so)
// and takes the link of token (one use, whatever follows), refusing a gone
// link (410) and one made for another purpose (410, audited). ok false:
// the answer is written.
func (p *Page) takePosted(w http.ResponseWriter, r *http.Request, token string, purpose approval.StepUpPurpose, step, unreadable string) ([]byte, approval.StepUpLink, bool) {
	ctx := r.Context()
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, 64<<10))
	if err != nil {
		p.say(w, http.StatusBadRequest, unreadable)
		return nil, approval.StepUpLink{}, false
	}
	link, err := p.opts.Domain.TakeStepUpLink(ctx, token)
	if errors.Is(err, approval.ErrStepUpLinkGone) {
		p.say(w, http.StatusGone, sayGone)
		return nil, approval.StepUpLink{}, false
	}
	if err != nil {
		p.fail(w, step, err)
		return nil, approval.StepUpLink{}, false
	}
	if link.Purpose != purpose {
		p.opts.Domain.StepUpRefused(ctx, link, "wrong_link")
		p.say(w, http.StatusGone, sayGone)
		return nil, approval.StepUpLink{}, false
	}
	return body, link, true
}

// vote takes the link (one use, whatever follows), verifies the assertion
// against the approver's passkeys and the link's challenge, and has the
// domain decide.
func (p *Page) vote(w http.ResponseWriter, r *http.Request, token string) {
	ctx := r.Context()
	body, link, ok := p.takePosted(w, r, token, approval.PurposeVote, "take step-up link",
		"The confirmation could not be read: nothing was counted.")
	if !ok {
		return
	}
	u, err := p.user(ctx, link.User)
	if err != nil {
		p.opts.Domain.StepUpRefused(ctx, link, "store_error")
		p.fail(w, "read passkeys", err)
		return
	}
	cred, err := p.verify(u, link, body)
	if err != nil {
		p.log.InfoContext(ctx, "step-up passkey refused", "request_id", link.Decision.RequestID, "user", link.User, "err", err)
		p.opts.Domain.StepUpRefused(ctx, link, "passkey_not_verified")
		p.say(w, http.StatusForbidden, sayNotYou)
		return
	}
	id := base64.RawURLEncoding.EncodeToString(cred.ID)
	if b, err := json.Marshal(cred); err == nil {
		// The sign count moved: kept, so a cloned authenticator shows.
		if err := p.opts.Keys.AddPasskey(ctx, link.User, id, b); err != nil {
			p.log.WarnContext(ctx, "passkey counter not kept", "user", link.User, "err", err)
		}
	}
	after, err := p.opts.Domain.DecideSteppedUp(ctx, link, approval.StepUpPasskey, id)
	p.decided(w, after, err)
}

// decided answers a confirmed vote's decision, whichever way it was
// confirmed.
func (p *Page) decided(w http.ResponseWriter, after *approval.Request, err error) {
	switch {
	case errors.Is(err, approval.ErrStaleArgs):
		p.say(w, http.StatusConflict, sayChanged)
	case err != nil && refusal(err) != "":
		p.say(w, http.StatusConflict, sayRefused+refusal(err))
	case err != nil:
		p.fail(w, "decide", err)
	default:
		p.say(w, http.StatusOK, "Confirmed: your vote on "+after.Tool+" counted ("+statusWords(after)+").")
	}
}

func (p *Page) verify(u *user, link approval.StepUpLink, body []byte) (*webauthn.Credential, error) {
	if len(u.creds) == 0 {
		return nil, errors.New("no passkey")
	}
	parsed, err := protocol.ParseCredentialRequestResponseBytes(body)
	if err != nil {
		return nil, err
	}
	_, session, err := p.assertion(u, link)
	if err != nil {
		return nil, err
	}
	return p.wa.ValidateLogin(u, *session, parsed)
}

func (p *Page) enrollPage(w http.ResponseWriter, r *http.Request, token string) {
	ctx := r.Context()
	link, _, err := p.opts.Domain.StepUpLink(ctx, token)
	if errors.Is(err, approval.ErrStepUpLinkGone) || (err == nil && link.Purpose != approval.PurposeEnroll) {
		p.say(w, http.StatusGone, sayGone)
		return
	}
	if err != nil {
		p.fail(w, "read enrollment link", err)
		return
	}
	var idpEmail string
	if link.VouchedBy == "" {
		// No colleague vouched: a login at the identity provider as this
		// user unlocks the registration (oidcCallback), once.
		b, err := p.opts.Keys.TakeStepUpSession(ctx, unlockKey(token))
		switch {
		case err == nil:
			idpEmail = string(b)
		case p.idp == nil:
			p.say(w, http.StatusForbidden, "This enrollment needs a login at your organisation's identity provider, which this deployment does not offer: ask a colleague to vouch for you instead (/countersign passkey).")
			return
		default:
			p.render(w, http.StatusOK, votePage{Title: "Register your passkey", Approver: p.name(ctx, link.User), Enroll: true,
				Message: "First sign in at your identity provider as yourself: its verified email must be your Slack email.",
				Login:   p.opts.Prefix + "login/" + token})
			return
		}
	}
	u, err := p.user(ctx, link.User)
	if err != nil {
		p.fail(w, "read passkeys", err)
		return
	}
	var exclude []protocol.CredentialDescriptor
	for _, c := range u.creds {
		exclude = append(exclude, c.Descriptor())
	}
	opts, session, err := p.wa.BeginRegistration(u, webauthn.WithExclusions(exclude),
		webauthn.WithResidentKeyRequirement(protocol.ResidentKeyRequirementPreferred),
		webauthn.WithAuthenticatorSelection(protocol.AuthenticatorSelection{UserVerification: protocol.VerificationRequired}))
	if err != nil {
		p.fail(w, "begin passkey registration", err)
		return
	}
	sb, err := json.Marshal(ceremony{SessionData: *session, IdPEmail: idpEmail})
	if err == nil {
		err = p.opts.Keys.SaveStepUpSession(ctx, sessionKey(token), sb, time.Until(link.Expires))
	}
	if err != nil {
		p.fail(w, "keep registration session", err)
		return
	}
	b, err := json.Marshal(opts.Response)
	if err != nil {
		p.fail(w, "encode passkey options", err)
		return
	}
	vouched := p.name(ctx, link.VouchedBy)
	if link.VouchedBy == "" {
		vouched = "your identity provider (" + idpEmail + ")"
	}
	p.render(w, http.StatusOK, votePage{Title: "Register your passkey", Approver: u.WebAuthnDisplayName(), Enroll: true,
		VouchedBy: vouched, Options: template.JS(b), Post: p.opts.Prefix + "enroll/" + token, Button: "Register a passkey"})
}

// ceremony is a registration under way: go-webauthn's session and, when
// a login at the identity provider unlocked it, the login's email.
type ceremony struct {
	webauthn.SessionData
	IdPEmail string `json:"idp_email,omitempty"`
}

// sessionKey keeps the ceremony under a key that is not the token.
func sessionKey(token string) string {
	return "enroll:" + base64.RawURLEncoding.EncodeToString([]byte(token))
}

func (p *Page) enroll(w http.ResponseWriter, r *http.Request, token string) {
	ctx := r.Context()
	body, link, ok := p.takePosted(w, r, token, approval.PurposeEnroll, "take enrollment link",
		"The passkey could not be read: nothing was registered.")
	if !ok {
		return
	}
	sb, err := p.opts.Keys.TakeStepUpSession(ctx, sessionKey(token))
	var c ceremony
	if err == nil {
		err = json.Unmarshal(sb, &c)
	}
	if err == nil && link.VouchedBy == "" && c.IdPEmail == "" {
		err = errors.New("neither vouched for nor unlocked by a login")
	}
	session := c.SessionData
	if err != nil {
		p.opts.Domain.StepUpRefused(ctx, link, "no_ceremony")
		p.say(w, http.StatusGone, sayGone)
		return
	}
	u, err := p.user(ctx, link.User)
	if err != nil {
		p.fail(w, "read passkeys", err)
		return
	}
	parsed, err := protocol.ParseCredentialCreationResponseBytes(body)
	var cred *webauthn.Credential
	if err == nil {
		cred, err = p.wa.CreateCredential(u, session, parsed)
	}
	if err != nil {
		p.log.InfoContext(ctx, "passkey registration refused", "user", link.User, "err", err)
		p.opts.Domain.StepUpRefused(ctx, link, "registration_not_verified")
		p.say(w, http.StatusForbidden, "The passkey could not be verified: nothing was registered.")
		return
	}
	id := base64.RawURLEncoding.EncodeToString(cred.ID)
	b, err := json.Marshal(cred)
	if err == nil {
		err = p.opts.Keys.AddPasskey(ctx, link.User, id, b)
	}
	if err != nil {
		p.fail(w, "keep passkey", err)
		return
	}
	p.opts.Domain.PasskeyEnrolled(ctx, link, id, c.IdPEmail)
	p.say(w, http.StatusOK, "Registered: your passkey now confirms your votes.")
}

// refusal is a decision's refusal in words, "" for a failure of ours.
func refusal(err error) string {
	for _, r := range []struct {
		err  error
		text string
	}{
		{approval.ErrAlreadyDecided, "the request was decided already."},
		{approval.ErrExpired, "the request has expired."},
		{approval.ErrNotApprover, "you are not an approver of this request."},
		{approval.ErrSelfApproval, "you asked for this call, so you cannot approve it."},
		{approval.ErrStepUpInvalid, "the confirmation did not match this vote."},
		{approval.ErrStepUpRequired, "the confirmation did not match this vote."},
		{approval.ErrInvalidArgs, "the edited arguments are not valid."},
		{approval.ErrDenied, "a deny rule refuses these arguments."},
		{approval.ErrGrantNotOffered, "Approve + allow is not offered on this request."},
		{approval.ErrSelfGrant, "you asked for this call, so you cannot pre-authorise it."},
	} {
		if errors.Is(err, r.err) {
			return r.text
		}
	}
	return ""
}

func statusWords(r *approval.Request) string {
	if r.Status == approval.StatusPending {
		return fmt.Sprintf("%d of %d approvals", len(r.Approvals), max(r.Quorum, 1))
	}
	return string(r.Status)
}

func (p *Page) fail(w http.ResponseWriter, what string, err error) {
	p.log.Error("step-up page: "+what, "err", err)
	p.say(w, http.StatusInternalServerError, sayError)
}

func (p *Page) say(w http.ResponseWriter, code int, sentence string) {
	p.render(w, code, votePage{Title: "Countersign", Message: sentence})
}

// fact is one line of what the vote is about.
type fact struct{ Label, Value string }

// facts are the card's facts: the tool, who asked and why, the arguments
// (formatted as the card formats them), the vote.
func (p *Page) facts(ctx context.Context, r *approval.Request, link approval.StepUpLink) []fact {
	d := link.Decision
	verdict := "Approve"
	switch {
	case d.Verdict == approval.VerdictEdit:
		verdict = "Edit and approve"
	case link.Allow:
		verdict = "Approve + allow"
	}
	fs := []fact{{"Your vote", verdict}}
	if r == nil {
		return fs
	}
	fs = append(fs, fact{"Tool", r.Tool}, fact{"Requested by", p.name(ctx, r.Requester)})
	if r.Reason != "" {
		fs = append(fs, fact{"Why", r.Reason})
	}
	args := r.Args
	if d.Verdict == approval.VerdictEdit {
		args = d.Args
	}
	var m map[string]any
	_ = json.Unmarshal(args, &m)
	for _, k := range slices.Sorted(maps.Keys(m)) {
		v := m[k]
		s := ""
		if f, ok := r.Formats[k]; ok {
			s = f.Apply(v)
		}
		if s == "" {
			b, _ := json.Marshal(v)
			s = string(b)
		}
		fs = append(fs, fact{"Argument " + k, s})
	}
	fs = append(fs, fact{"Needs", link.Need.Words()}, fact{"Request", r.ID})
	if len(link.VotedDigest()) >= 12 {
		fs = append(fs, fact{"Arguments sha256", link.VotedDigest()[:12]})
	}
	return fs
}

// votePage is what the template shows.
type votePage struct {
	Title, Approver, VouchedBy, Message, Post, Button string
	// Login is where the identity provider's button posts; "" for none.
	Login   string
	Enroll  bool
	Facts   []fact
	Options template.JS
}

func (p *Page) render(w http.ResponseWriter, code int, v votePage) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; connect-src 'self'")
	w.WriteHeader(code)
	if err := page.Execute(w, v); err != nil {
		p.log.Error("step-up page: render", "err", err)
	}
}

var page = template.Must(template.New("stepup").Parse(`<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>{{.Title}}</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<style>body{font-family:system-ui,sans-serif;max-width:40rem;margin:2rem auto;padding:0 1rem;color:#1d1c1d}
dl{display:grid;grid-template-columns:max-content 1fr;gap:.3rem 1rem}dt{color:#616061}dd{margin:0;word-break:break-word}
button{font-size:1rem;padding:.6rem 1.2rem;background:#007a5a;color:#fff;border:0;border-radius:4px}
#result{margin-top:1rem;font-weight:600}</style></head>
<body><h1>{{.Title}}</h1>
{{if .Approver}}<p data-testid="who">{{if .Enroll}}A passkey for <b>{{.Approver}}</b>{{if .VouchedBy}}, approved by {{.VouchedBy}}{{end}}.{{else}}This vote is <b>{{.Approver}}</b>'s: only their passkey confirms it.{{end}}</p>{{end}}
{{if .Facts}}<dl data-testid="facts">{{range .Facts}}<dt>{{.Label}}</dt><dd>{{.Value}}</dd>{{end}}</dl>{{end}}
{{if .Message}}<p id="message" data-testid="message">{{.Message}}</p>{{end}}
{{if .Login}}<form method="post" action="{{.Login}}"><button type="submit" data-testid="oidc">Sign in with your identity provider</button></form>{{end}}
{{if .Button}}<button id="go" data-testid="confirm">{{.Button}}</button>
<p id="result" data-testid="result" role="status"></p>
<script>
const options = {{.Options}};
const enroll = {{.Enroll}};
document.getElementById("go").addEventListener("click", async () => {
  const out = document.getElementById("result");
  out.textContent = "";
  let cred;
  try {
    cred = enroll
      ? await navigator.credentials.create({publicKey: PublicKeyCredential.parseCreationOptionsFromJSON(options.publicKey ?? options)})
      : await navigator.credentials.get({publicKey: PublicKeyCredential.parseRequestOptionsFromJSON(options.publicKey ?? options)});
  } catch (e) {
    out.textContent = "No passkey confirmed this (" + e.name + "): nothing was counted. Reload the page to try again.";
    out.dataset.done = "1";
    return;
  }
  const resp = await fetch({{.Post}}, {method: "POST", headers: {"Content-Type": "application/json"}, body: JSON.stringify(cred.toJSON())});
  const html = new DOMParser().parseFromString(await resp.text(), "text/html");
  const msg = html.getElementById("message");
  out.textContent = msg ? msg.textContent : ("HTTP " + resp.status);
  out.dataset.status = String(resp.status);
  out.dataset.done = "1";
  document.getElementById("go").disabled = true;
});
</script>{{end}}
</body></html>
`))
