package approval

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// This file: step-up votes. A Slack session is long-lived and can be
// stolen; for the calls a policy marks, a vote counts only when the
// approver also confirms it with a passkey (or their single sign-on) on a
// page of this deployment. Decide refuses an approval or an edit of such a
// request unless it carries a verified StepUpProof, so no surface can count
// one without it; a rejection needs none (it can only stop things).

// StepUpMethod is a way to confirm a vote: a passkey (WebAuthn) or a login
// at the organisation's identity provider (OIDC).
type StepUpMethod string

// The step-up methods.
const (
	StepUpPasskey StepUpMethod = "passkey"
	StepUpOIDC    StepUpMethod = "oidc"
)

// Step-up bounds.
const (
	// StepUpLinkTTL is how long a step-up or enrollment link can be used
	// (once).
	StepUpLinkTTL = 5 * time.Minute
	// StepUpProofMaxAge is how old a proof may be when its decision is
	// recorded: it is made by the page a moment before.
	StepUpProofMaxAge = time.Minute
	// MaxStepUpFresh bounds step_up.fresh: one confirmation cannot cover a
	// whole working day of votes.
	MaxStepUpFresh = 12 * time.Hour
)

// Step-up errors. Each refuses a decision; nothing is recorded.
var (
	// ErrStepUpRequired: the request's policy asks a confirmation of the
	// vote and the decision carries none (the surface offers the link).
	ErrStepUpRequired = errors.New("approval: this vote needs a step-up confirmation")
	// ErrStepUpInvalid: the decision's proof is not for this vote (another
	// request, arguments, verdict or approver), too old, or of a method the
	// policy does not accept; or the confirmation failed.
	ErrStepUpInvalid = errors.New("approval: the step-up confirmation is not valid for this vote")
	// ErrStepUpLinkGone: the link was used already, has expired, or never
	// existed.
	ErrStepUpLinkGone = errors.New("approval: the step-up link was used already or has expired")
)

// StepUp is a tool's step-up rule (ToolPolicy.StepUp; the policy file's
// step_up key).
type StepUp struct {
	// When is a CEL expression over args, tool and requester; empty: every
	// vote on the tool.
	When string
	// Reason says in words why (shown with the card's note).
	Reason string
	// Risk, when set, limits the rule to requests of at least this risk
	// (a rule in defaults: "every high-risk tool").
	Risk Risk
	// Methods are the accepted confirmations, passkey first by default.
	Methods []StepUpMethod
	// Fresh is how long one confirmation covers the same approver's further
	// votes; zero: every vote is confirmed.
	Fresh time.Duration
}

// StepUpNeed is what a request's approving votes need (Request.StepUp):
// one of Methods, unless the approver confirmed within Fresh.
type StepUpNeed struct {
	Methods []StepUpMethod `json:"methods"`
	Fresh   time.Duration  `json:"fresh,omitempty"`
	Reason  string         `json:"reason,omitempty"`
}

// Words says the need for people: "your vote needs a passkey
// confirmation".
func (n *StepUpNeed) Words() string {
	var ms []string
	for _, m := range n.Methods {
		switch m {
		case StepUpPasskey:
			ms = append(ms, "a passkey")
		case StepUpOIDC:
			ms = append(ms, "a single sign-on")
		}
	}
	if len(ms) == 0 {
		ms = []string{"a passkey"}
	}
	s := "your vote needs " + strings.Join(ms, " or ") + " confirmation"
	if n.Reason != "" {
		s += " (" + n.Reason + ")"
	}
	return s
}

// StepUpProof is a verified confirmation of one vote, set on
// Decision.StepUp only by the step-up page after it verified the passkey
// assertion (or the login) whose challenge bound these fields. Decide
// checks it names the very vote it confirms.
type StepUpProof struct {
	Method StepUpMethod `json:"method"`
	// Credential names what confirmed: the passkey's id, or the identity
	// provider's subject.
	Credential string    `json:"confirmed_by"`
	At         time.Time `json:"at"`
	RequestID  string    `json:"request_id"`
	// Digest is the digest of the arguments the vote approves (the edited
	// ones for an edit).
	Digest   string  `json:"digest"`
	Verdict  Verdict `json:"verdict"`
	Approver string  `json:"approver"`
	Allow    bool    `json:"allow,omitempty"`
}

// StepUpPurpose says what a link is for.
type StepUpPurpose string

// The purposes of a step-up link.
const (
	PurposeVote   StepUpPurpose = "vote"
	PurposeEnroll StepUpPurpose = "enroll"
)

// StepUpLink is what a one-time link stands for: a vote waiting for its
// confirmation (Decision, Allow), or a passkey enrollment for User.
type StepUpLink struct {
	Purpose StepUpPurpose `json:"purpose"`
	// User is the Slack user the link is bound to: the approver of the
	// vote, or the person enrolling a passkey.
	User     string   `json:"user"`
	Decision Decision `json:"decision,omitzero"`
	Allow    bool     `json:"allow,omitempty"`
	// Need is the request's need when the link was made (vote).
	Need StepUpNeed `json:"need,omitzero"`
	// VouchedBy is who approved an enrollment (four-eyes); empty when the
	// enrolling person must log in at the identity provider instead.
	VouchedBy string `json:"vouched_by,omitempty"`
	// Nonce makes each link's challenge unique (StepUpChallenge).
	Nonce   string    `json:"nonce"`
	Expires time.Time `json:"expires"`
}

// VotedDigest is the digest of the arguments the link's vote approves: the
// card's for an approval, the edited arguments' for an edit.
func (k StepUpLink) VotedDigest() string {
	return votedDigest(k.Decision)
}

func votedDigest(d Decision) string {
	if d.Verdict == VerdictEdit {
		if dg, err := Digest(d.Args); err == nil {
			return dg
		}
		return ""
	}
	return d.Digest
}

// StepUpChallenge is the WebAuthn challenge of a link: a hash of its nonce
// and of the vote it confirms (request, digest, verdict, Approve + allow,
// approver) or the enrollment (user), so an assertion made for one vote
// never confirms another.
func StepUpChallenge(k StepUpLink) []byte {
	h := sha256.New()
	for _, s := range []string{"countersign step-up v1", string(k.Purpose), k.Nonce, k.User,
		k.Decision.RequestID, k.VotedDigest(), string(k.Decision.Verdict), fmt.Sprint(k.Allow)} {
		fmt.Fprintf(h, "%d:%s;", len(s), s)
	}
	return h.Sum(nil)
}

// StepUps stores the links and the confirmations that are still fresh.
// The store implements it; links are kept by the SHA-256 of their token
// (the token itself is only in the link sent to the person).
type StepUps interface {
	// SaveStepUpLink keeps link under key until link.Expires.
	SaveStepUpLink(ctx context.Context, key string, link StepUpLink) error
	// StepUpLink reads a link without using it; ErrNotFound when used,
	// expired or unknown.
	StepUpLink(ctx context.Context, key string) (StepUpLink, error)
	// TakeStepUpLink reads and deletes a link in one step (one use);
	// ErrNotFound when used, expired or unknown.
	TakeStepUpLink(ctx context.Context, key string) (StepUpLink, error)
	// NoteStepUp remembers that user confirmed a vote, until until.
	NoteStepUp(ctx context.Context, user string, until time.Time) error
	// SteppedUp returns until when user's last confirmation covers further
	// votes; the zero time when none does.
	SteppedUp(ctx context.Context, user string) (time.Time, error)
}

// SetStepUps sets the store of links and fresh confirmations. Without it
// a vote that needs a step-up can only be refused (ErrStepUpRequired) and
// no link is offered. Call it once, before any decision.
func (l *Lifecycle) SetStepUps(s StepUps) { l.stepUps = s }

// stepUpRule is a compiled StepUp.
type stepUpRule struct {
	when *rule // nil: every vote
	risk Risk
	need StepUpNeed
}

// compileStepUp checks and compiles a tool's step-up rule; nil for none.
func compileStepUp(s *StepUp) (*stepUpRule, error) {
	if s == nil {
		return nil, nil
	}
	var errs []error
	r := &stepUpRule{risk: s.Risk, need: StepUpNeed{Methods: slices.Clone(s.Methods), Fresh: s.Fresh, Reason: s.Reason}}
	if len(r.need.Methods) == 0 {
		r.need.Methods = []StepUpMethod{StepUpPasskey}
	}
	for _, m := range r.need.Methods {
		if m != StepUpPasskey && m != StepUpOIDC {
			errs = append(errs, fmt.Errorf("step_up.method %q: must be passkey or oidc", m))
		}
	}
	switch s.Risk {
	case "", RiskLow, RiskMedium, RiskHigh:
	default:
		errs = append(errs, fmt.Errorf("step_up.risk %q: must be low, medium or high", s.Risk))
	}
	if s.Fresh < 0 || s.Fresh > MaxStepUpFresh {
		errs = append(errs, fmt.Errorf("step_up.fresh %s: must be between 0 and %s", s.Fresh, MaxStepUpFresh))
	}
	if strings.TrimSpace(s.When) != "" {
		prg, err := compileWhen(s.When)
		if err != nil {
			errs = append(errs, fmt.Errorf("step_up.when: %w", err))
		} else {
			r.when = &rule{expr: s.When, prg: prg}
		}
	}
	return r, errors.Join(errs...)
}

// StepUpFor judges, in memory, whether approving r with args (r's own, or
// an edit's) needs a step-up under the policy the gate holds: nil when it
// does not. A rule that cannot be evaluated asks for one (fail closed).
func (g *Gate) StepUpFor(r *Request, args json.RawMessage) *StepUpNeed {
	if g == nil || r == nil {
		return nil
	}
	t, ok := g.tools[r.Tool]
	if !ok {
		if !r.Undeclared || g.external == nil {
			return nil
		}
		t = g.external
	}
	s := t.stepUp
	if s == nil {
		return nil
	}
	level := map[Risk]int{RiskLow: 0, RiskMedium: 1, RiskHigh: 2}
	if s.risk != "" && level[cmpRisk(r.Risk, t.policy.Risk)] < level[s.risk] {
		return nil
	}
	need := s.need
	need.Methods = slices.Clone(need.Methods)
	if s.when == nil {
		return &need
	}
	parsed, err := decodeArgs(args)
	if err != nil {
		return &need
	}
	fired, err := s.when.eval(map[string]any{"args": parsed, "tool": r.Tool, "requester": r.Requester})
	if err != nil || fired {
		return &need
	}
	return nil
}

func cmpRisk(a, b Risk) Risk {
	if a != "" {
		return a
	}
	return b
}

// stepUpNeed is what d on r needs now: the policy in force for the
// arguments voted on, or what the card was told when it was proposed (so
// a card that said "needs a passkey" never counts a vote without one).
// Only approvals and edits need a step-up.
func (l *Lifecycle) stepUpNeed(r *Request, d Decision) *StepUpNeed {
	if d.Verdict != VerdictApprove && d.Verdict != VerdictEdit {
		return nil
	}
	args := r.Args
	if d.Verdict == VerdictEdit {
		args = d.Args
	}
	if n := l.gate.StepUpFor(r, args); n != nil {
		return n
	}
	return r.StepUp
}

// NeedsStepUp reports, in memory, whether user's vote v on r needs a
// confirmation under the policy in force (a surface asks it to word its
// answer; Decide judges).
func (l *Lifecycle) NeedsStepUp(r *Request, v Verdict) *StepUpNeed {
	return l.stepUpNeed(r, Decision{Verdict: v, Args: r.Args})
}

// checkStepUp is Decide's step-up judgement, after who may decide: a vote
// that needs a confirmation carries a proof of this very vote, or its
// approver confirmed another within the policy's fresh window. The policy
// is in memory: a request that needs none costs nothing more.
func (l *Lifecycle) checkStepUp(ctx context.Context, r *Request, d Decision, allow bool) error {
	need := l.stepUpNeed(r, d)
	if need == nil {
		return nil
	}
	if p := d.StepUp; p != nil {
		now := l.now()
		switch {
		case p.RequestID != d.RequestID || p.RequestID != r.ID, p.Approver != d.Approver, p.Verdict != d.Verdict,
			p.Allow != allow, p.Digest == "" || p.Digest != votedDigest(d):
			return fmt.Errorf("decide %s: proof for another vote: %w", r.ID, ErrStepUpInvalid)
		case !slices.Contains(need.Methods, p.Method):
			return fmt.Errorf("decide %s: method %s not accepted: %w", r.ID, p.Method, ErrStepUpInvalid)
		case now.Sub(p.At) > StepUpProofMaxAge || p.At.Sub(now) > StepUpProofMaxAge:
			return fmt.Errorf("decide %s: proof made at %s: %w", r.ID, p.At.Format(time.RFC3339), ErrStepUpInvalid)
		}
		return nil
	}
	if need.Fresh > 0 && l.stepUps != nil {
		until, err := l.stepUps.SteppedUp(ctx, d.Approver)
		if err == nil && l.now().Before(until) {
			return nil
		}
	}
	return fmt.Errorf("decide %s: %w", r.ID, ErrStepUpRequired)
}

// stepUpKey is the store's key of a link's token: its SHA-256, so that the
// store never holds a usable link.
func stepUpKey(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

func randomToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// OfferStepUp keeps d (by its approver, with Approve + allow when allow)
// waiting for its confirmation and returns the one-time token of its link,
// valid StepUpLinkTTL. The surface calls it when Decide answered
// ErrStepUpRequired; nothing is recorded on the request. Audited
// (step_up_offered).
func (l *Lifecycle) OfferStepUp(ctx context.Context, r *Request, d Decision, allow bool) (string, error) {
	need := l.stepUpNeed(r, d)
	if need == nil {
		return "", fmt.Errorf("offer step-up on %s: the vote needs none", r.ID)
	}
	if l.stepUps == nil {
		return "", fmt.Errorf("offer step-up on %s: no step-up store", r.ID)
	}
	token, err := randomToken()
	if err != nil {
		return "", err
	}
	nonce, err := randomToken()
	if err != nil {
		return "", err
	}
	d.StepUp = nil
	link := StepUpLink{Purpose: PurposeVote, User: d.Approver, Decision: d, Allow: allow, Need: *need, Nonce: nonce,
		Expires: l.now().Add(StepUpLinkTTL)}
	if err := l.stepUps.SaveStepUpLink(ctx, stepUpKey(token), link); err != nil {
		return "", fmt.Errorf("offer step-up on %s: %w", r.ID, err)
	}
	l.append(ctx, r, Record{Event: EventStepUpOffered, RequestID: r.ID, RunID: r.RunID, Actor: d.Approver, Tool: r.Tool,
		Data: StepUpEvent{Verdict: d.Verdict, Methods: need.Methods, Digest: link.VotedDigest(), Allow: allow}})
	return token, nil
}

// OfferEnrollment returns the one-time token of a link on which user
// registers a passkey. Somebody other than user must vouch for it
// (vouchedBy: an admin who approved, four-eyes), or, with vouchedBy empty,
// the page must first have user log in at the identity provider. A thief
// holding user's Slack session can do neither. Audited
// (passkey_enrollment_offered).
func (l *Lifecycle) OfferEnrollment(ctx context.Context, user, vouchedBy string) (string, error) {
	switch {
	case user == "":
		return "", errors.New("offer enrollment: empty user")
	case vouchedBy == user:
		return "", fmt.Errorf("offer enrollment for %s: nobody vouches for their own passkey: %w", user, ErrSelfApproval)
	case l.stepUps == nil:
		return "", fmt.Errorf("offer enrollment for %s: no step-up store", user)
	}
	if err := l.mayVouch(ctx, user, vouchedBy); err != nil {
		return "", err
	}
	token, err := randomToken()
	if err != nil {
		return "", err
	}
	nonce, err := randomToken()
	if err != nil {
		return "", err
	}
	link := StepUpLink{Purpose: PurposeEnroll, User: user, VouchedBy: vouchedBy, Nonce: nonce, Expires: l.now().Add(StepUpLinkTTL)}
	if err := l.stepUps.SaveStepUpLink(ctx, stepUpKey(token), link); err != nil {
		return "", fmt.Errorf("offer enrollment for %s: %w", user, err)
	}
	l.append(ctx, nil, Record{Event: EventPasskeyOffered, Actor: cmpUser(vouchedBy, user), Data: PasskeyEvent{User: user, VouchedBy: vouchedBy}})
	return token, nil
}

// mayVouch judges whether vouchedBy may vouch for user's passkey
// enrollment: one of the policy's passkey admins (slack.passkey_admins:
// users, usergroups, or the approvals channel's members, the default),
// never user themself — Authorize's judgement, as for a decision, over a
// request that stands for the enrollment. An enrollment nobody vouched
// for (vouchedBy "": unlocked by an OIDC login as user) is not judged
// here. Errors wrap ErrNotApprover or ErrSelfApproval.
func (l *Lifecycle) mayVouch(ctx context.Context, user, vouchedBy string) error {
	if vouchedBy == "" {
		return nil
	}
	var admins Approvers
	if l.gate != nil {
		admins = l.gate.PasskeyAdmins()
	}
	enrollment := &Request{ID: "passkey enrollment of " + user, Requester: user, Approvers: admins}
	if err := l.authorize(ctx, enrollment, vouchedBy); err != nil {
		return fmt.Errorf("offer enrollment for %s: %w", user, err)
	}
	return nil
}

func cmpUser(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// StepUpLink reads the link of token without using it (the page shows
// what it confirms), and for a vote the request as it is now. Errors wrap
// ErrStepUpLinkGone (used, expired or unknown) or say the store failed.
func (l *Lifecycle) StepUpLink(ctx context.Context, token string) (StepUpLink, *Request, error) {
	if l.stepUps == nil || token == "" {
		return StepUpLink{}, nil, ErrStepUpLinkGone
	}
	link, err := l.stepUps.StepUpLink(ctx, stepUpKey(token))
	if errors.Is(err, ErrNotFound) || (err == nil && !l.now().Before(link.Expires)) {
		return StepUpLink{}, nil, ErrStepUpLinkGone
	}
	if err != nil || link.Purpose != PurposeVote {
		return link, nil, err
	}
	r, err := l.rec.Request(ctx, link.Decision.RequestID)
	return link, r, err
}

// TakeStepUpLink uses the link of token: it is gone once taken, whatever
// follows (a wrong passkey burns it). A link used already or expired is
// refused and audited (step_up_refused).
func (l *Lifecycle) TakeStepUpLink(ctx context.Context, token string) (StepUpLink, error) {
	var link StepUpLink
	err := ErrStepUpLinkGone
	if l.stepUps != nil && token != "" {
		link, err = l.stepUps.TakeStepUpLink(ctx, stepUpKey(token))
	}
	switch {
	case errors.Is(err, ErrNotFound) || errors.Is(err, ErrStepUpLinkGone):
		l.append(ctx, nil, Record{Event: EventStepUpRefused, Data: StepUpEvent{Reason: "link_used_or_expired"}})
		return StepUpLink{}, ErrStepUpLinkGone
	case err != nil:
		return StepUpLink{}, err
	case !l.now().Before(link.Expires):
		l.StepUpRefused(ctx, link, "link_expired")
		return StepUpLink{}, ErrStepUpLinkGone
	}
	return link, nil
}

// StepUpRefused audits a confirmation that failed (step_up_refused, or
// passkey_enrollment_refused): the link's vote or enrollment, and why as a
// short code (passkey_not_verified, digest_changed, …). Nothing is
// counted.
func (l *Lifecycle) StepUpRefused(ctx context.Context, link StepUpLink, code string) {
	if link.Purpose == PurposeEnroll {
		l.append(ctx, nil, Record{Event: EventPasskeyRefused, Actor: link.User, Data: PasskeyEvent{User: link.User, VouchedBy: link.VouchedBy, Reason: code}})
		return
	}
	d := link.Decision
	l.append(ctx, nil, Record{Event: EventStepUpRefused, RequestID: d.RequestID, Actor: d.Approver,
		Data: StepUpEvent{Verdict: d.Verdict, Digest: link.VotedDigest(), Allow: link.Allow, Reason: code}})
}

// DecideSteppedUp decides the vote of a link taken by TakeStepUpLink,
// now confirmed by proof's method and credential (the page verified the
// assertion whose challenge is StepUpChallenge(link)), through Decide as
// every vote; then the confirmation is audited (step_up_verified) and, under
// a fresh window, remembered. A request whose arguments changed since the
// click is refused (ErrStaleArgs) and audited, nothing counted.
func (l *Lifecycle) DecideSteppedUp(ctx context.Context, link StepUpLink, method StepUpMethod, credential string) (*Request, error) {
	if link.Purpose != PurposeVote {
		return nil, fmt.Errorf("decide step-up: a %s link: %w", link.Purpose, ErrStepUpInvalid)
	}
	d := link.Decision
	r, err := l.rec.Request(ctx, d.RequestID)
	if err != nil {
		return nil, err
	}
	if r.Digest != d.Digest {
		l.StepUpRefused(ctx, link, "digest_changed")
		return r, fmt.Errorf("decide step-up on %s: %w", r.ID, ErrStaleArgs)
	}
	now := l.now()
	d.At = now
	d.StepUp = &StepUpProof{Method: method, Credential: credential, At: now, RequestID: d.RequestID, Digest: link.VotedDigest(),
		Verdict: d.Verdict, Approver: d.Approver, Allow: link.Allow}
	after, err := l.Decide(ctx, r, d, DecideOptions{Allow: link.Allow})
	if err != nil {
		l.StepUpRefused(ctx, link, "decision_refused")
		return after, err
	}
	l.append(ctx, after, Record{Event: EventStepUpVerified, RequestID: d.RequestID, RunID: r.RunID, Actor: d.Approver, Tool: r.Tool,
		Data: StepUpEvent{Verdict: d.Verdict, Methods: []StepUpMethod{method}, Credential: credential, Digest: link.VotedDigest(), Allow: link.Allow}})
	if link.Need.Fresh > 0 && l.stepUps != nil {
		if err := l.stepUps.NoteStepUp(ctx, d.Approver, now.Add(link.Need.Fresh)); err != nil {
			l.log.WarnContext(ctx, "step-up freshness not remembered; the next vote asks again", "user", d.Approver, "err", err)
		}
	}
	return after, nil
}

// PasskeyEnrolled audits a passkey registered on an enrollment link
// (passkey_enrolled): whose, its id, who vouched (or that the identity
// provider did).
func (l *Lifecycle) PasskeyEnrolled(ctx context.Context, link StepUpLink, credential, idpEmail string) {
	l.append(ctx, nil, Record{Event: EventPasskeyEnrolled, Actor: link.User,
		Data: PasskeyEvent{User: link.User, Credential: credential, VouchedBy: link.VouchedBy, Email: idpEmail}})
}

// PasskeyRevoked audits a passkey removed (passkey_revoked) by by.
func (l *Lifecycle) PasskeyRevoked(ctx context.Context, user, credential, by string) {
	l.append(ctx, nil, Record{Event: EventPasskeyRevoked, Actor: by, Data: PasskeyEvent{User: user, Credential: credential}})
}
