// Package bot is Countersign's Slack adapter: it turns mentions and DMs into
// agent tasks, posts approval cards to the approvals channel, handles the
// buttons and modals approvers use, and keeps cards and task threads up to
// date. It is the only package that imports slack-go.
//
// Decisions come only from Slack interactive payloads (signed HTTP requests
// or Socket Mode envelopes), never from message text. Who may decide is
// checked at click time; the store decides state (first decision wins).
//
// Wiring (done in cmd/countersign):
//
//	b, err := bot.New(bot.Options{Slack: api, Requests: st, Runner: ag, Policy: pf, ...})
//	err = b.Start(ctx)                  // auth.test, starts the worker pool
//	b.StartSocketMode(ctx, smc)         // or http.Handle("/slack/", b.HTTPHandler())
//	defer b.Shutdown(shutdownCtx)       // stops intake, drains the pool
package bot

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// Slack is the part of the slack-go Web API client the bot uses. A
// *slack.Client satisfies it. Errors are slack-go's: *slack.RateLimitedError
// for HTTP 429, slack.SlackErrorResponse for "ok": false answers,
// slack.StatusCodeError for other HTTP failures.
type Slack interface {
	Messages
	Views
	Directory
	AuthTestContext(ctx context.Context) (*slack.AuthTestResponse, error)
}

// Messages is what the card writer and the task-thread notes use: posting,
// redrawing, finding and deleting messages.
type Messages interface {
	PostMessageContext(ctx context.Context, channelID string, options ...slack.MsgOption) (string, string, error)
	UpdateMessageContext(ctx context.Context, channelID, timestamp string, options ...slack.MsgOption) (string, string, string, error)
	PostEphemeralContext(ctx context.Context, channelID, userID string, options ...slack.MsgOption) (string, error)
	GetPermalinkContext(ctx context.Context, params *slack.PermalinkParameters) (string, error)
	GetConversationHistoryContext(ctx context.Context, params *slack.GetConversationHistoryParameters) (*slack.GetConversationHistoryResponse, error)
	DeleteMessageContext(ctx context.Context, channel, messageTimestamp string) (string, string, error)
}

// Views is what the modals (edit, reject, respond) and the App Home use.
type Views interface {
	OpenViewContext(ctx context.Context, triggerID string, view slack.ModalViewRequest) (*slack.ViewResponse, error)
	PublishViewContext(ctx context.Context, req slack.PublishViewContextRequest) (*slack.ViewResponse, error)
}

var _ Slack = (*slack.Client)(nil)

// Runner starts or continues an agent run for a task. Handle must return
// quickly (the run proceeds in the background); an error means the task was
// not accepted.
type Runner interface {
	Handle(ctx context.Context, t approval.Task) error
}

// Lifecycle is the owner of every request's transitions
// (*approval.Lifecycle): the bot hands it the decisions it has checked.
type Lifecycle interface {
	// Decide records d (record → audit → wake-up → card refresh).
	// Refusals are wrapped sentinels: *approval.DecidedError
	// (ErrAlreadyDecided or ErrExpired), ErrAlreadyVoted,
	// ErrVerdictNotAllowed, ErrStaleArgs, ErrNotFound; nothing changed. An
	// approval short of the quorum leaves the request pending with one more
	// entry in Approvals. With opts.Allow, a grant that could not be saved
	// leaves the returned request's Grant nil.
	//
	// An edit is judged as a new proposal for the edited arguments and
	// refused, nothing recorded, when invalid (ErrInvalidArgs) or refused
	// by a deny rule (*approval.DenialError); an edited call needing more
	// approvals than the request's quorum raises it, and the edit counts
	// as one of them.
	//
	// Who may decide is judged there first (MayDecide): a refusal wraps
	// ErrNotApprover, ErrSelfApproval, ErrSelfGrant or ErrGrantNotOffered.
	Decide(ctx context.Context, before *approval.Request, d approval.Decision, opts approval.DecideOptions) (*approval.Request, error)
	// MayDecide is Decide's judgement of who may decide, asked before a
	// modal opens so nobody fills one in for nothing.
	MayDecide(ctx context.Context, r *approval.Request, user string, v approval.Verdict, allow bool) error
	// DecisionRefused audits a click or form that changed nothing.
	DecisionRefused(ctx context.Context, r *approval.Request, by string, v approval.Verdict, code, team string)
	// Judge runs the checks every call takes, proposed or edited: the
	// schema (the policy's, or inputSchema for a tool the policy does not
	// declare), then the gate (deny rules, review, quorum). The Edit
	// modal asks it before answering Slack, so a problem shows on the
	// field. Errors wrap ErrInvalidArgs (a *policyfile.ArgsError lists the
	// fields) or ErrUnknownTool; a deny rule is Assessment.Denied.
	Judge(call approval.ToolCall, inputSchema json.RawMessage, requester string, external bool) (approval.Assessment, error)
	// Feedback records an approver's judgement of a final request (Mark
	// as wrong, Looks right), audits it and redraws the card. Refusals:
	// ErrNotFinal, ErrAlreadyMarked, ErrNotFound (wrapped).
	Feedback(ctx context.Context, id string, f approval.Feedback) (*approval.Request, error)
	// BindCard records, once, that c is r's card, audits card_posted the
	// first time and redraws the card when r changed meanwhile: a click
	// on a card not bound yet binds it (bindClicked). Refusals: ErrExists
	// (bound to another message), ErrNotFound.
	BindCard(ctx context.Context, r *approval.Request, c approval.CardRef) error
	// RevokeGrant ends r's pre-authorisation grantID (the Revoke button),
	// audits it and redraws the card; ErrNotFound when r has no such
	// grant.
	RevokeGrant(ctx context.Context, r *approval.Request, grantID, by string) (*approval.Grant, error)
}

// Requests is the part of the request store the bot uses (*store.Store):
// the roles below, which one store implements together. Each part of the
// bot holds only the role it uses, as with Slack.
type Requests interface {
	CardRecords
	HomeLists
	Deduper
}

// CardRecords is what the card writer and the click handlers read of a
// request's record. They write none of it: every change goes through the
// Lifecycle.
type CardRecords interface {
	// Request returns the request, or an error wrapping approval.ErrNotFound.
	Request(ctx context.Context, id string) (*approval.Request, error)
}

// HomeLists is what the App Home lists.
type HomeLists interface {
	// Pending returns pending requests, oldest first.
	Pending(ctx context.Context) ([]*approval.Request, error)
	// RecentByRequester returns the user's n most recent requests.
	RecentByRequester(ctx context.Context, user string, n int) ([]*approval.Request, error)
	// ActiveGrants lists the pre-authorisations in force.
	ActiveGrants(ctx context.Context) ([]*approval.Grant, error)
}

// Deduper drops the Events API's redeliveries.
type Deduper interface {
	// FirstSeen reports whether eventID is seen for the first time (across
	// every replica) and remembers it for ttl.
	FirstSeen(ctx context.Context, eventID string, ttl time.Duration) (bool, error)
}

// Options configures a Bot. Slack, Requests, Lifecycle, Runner and Policy
// are required. The bot writes no audit entry itself: its refusals are
// audited by the lifecycle (Lifecycle.DecisionRefused).
type Options struct {
	Slack     Slack
	Requests  Requests
	Lifecycle Lifecycle
	Runner    Runner
	Policy    *policyfile.File
	// Now is the clock; default time.Now.
	Now func() time.Time
	// Sleep waits d or until ctx ends; default a real timer. Tests pass one
	// that advances their clock, so rate-limit waits take no real time.
	Sleep func(ctx context.Context, d time.Duration) error
	// Logger receives operator detail; default discards.
	Logger *slog.Logger
	// Workers is the size of the worker pool; default 8.
	Workers int
	// SigningSecret verifies HTTP requests (HTTPHandler). Unused in Socket
	// Mode.
	SigningSecret string
	// MemberCacheTTL is how long usergroup and channel member lists are
	// trusted for what is not a decision (opening a modal, App Home);
	// default 30 s. A decision trusts them 2 s at most, and a membership
	// event drops the list it changes at once.
	MemberCacheTTL time.Duration
	// HTTPClient posts to the response_url of clicks; default
	// http.DefaultClient.
	HTTPClient *http.Client
	// CardWriters bounds the approval cards redrawn at once; default 16.
	CardWriters int
	// CardSettle is how long a card's redraw waits after it is first
	// asked for; the redraws asked meanwhile join it. Zero (the default)
	// draws at once. serve uses DefaultCardSettle: an approval's redraws
	// (decided, executing, finished) then make one chat.update instead of
	// three, and the redraw no longer competes with the execution it
	// follows for the process's CPU on the way to the tool call.
	CardSettle time.Duration
	// StepUp offers the link on which an approver confirms a vote that
	// needs a step-up (the step-up page); nil: such votes are refused.
	StepUp StepUpOffers
}

// StepUpOffers makes the one-time links of the step-up page (over
// Lifecycle.OfferStepUp and OfferEnrollment): a vote waiting for its
// confirmation, the URL the approver opens; a passkey enrollment vouched
// for by a colleague (ErrSelfApproval when vouchedBy is the user). An
// error means no link could be made.
type StepUpOffers interface {
	OfferStepUp(ctx context.Context, r *approval.Request, d approval.Decision, allow bool) (string, error)
	OfferEnrollment(ctx context.Context, user, vouchedBy string) (string, error)
	// PasskeyIDs lists user's passkeys; RevokePasskey removes one
	// (audited), false when user has no such passkey.
	PasskeyIDs(ctx context.Context, user string) ([]string, error)
	RevokePasskey(ctx context.Context, user, id, by string) (bool, error)
	// OfferOIDCEnrollment makes an enrollment link that a login at the
	// identity provider as user unlocks, no colleague needed; "" when no
	// identity provider is configured.
	OfferOIDCEnrollment(ctx context.Context, user string) (string, error)
}

// DefaultCardSettle is the CardSettle serve uses: far below what a person
// notices on a card, above the claim and a fast tool call.
const DefaultCardSettle = 50 * time.Millisecond

// dedupeTTL is how long an event id is remembered. Slack retries for about
// five minutes.
const dedupeTTL = 15 * time.Minute

// Bot is the Slack front end. Create it with New, call Start, then feed it
// with HTTPHandler or StartSocketMode (RunSocketMode), and stop it with
// Shutdown (or Close). Its methods are safe for concurrent use.
type Bot struct {
	api       Slack // only auth.test at Start; everything else goes through a role below
	messages  Messages
	views     Views
	directory Directory
	records   CardRecords
	home      HomeLists
	dedupe    Deduper
	lifecycle Lifecycle
	stepUp    StepUpOffers // nil: votes that need a step-up are refused
	runner    Runner
	policy    *policyfile.File
	now       func() time.Time
	sleep     func(ctx context.Context, d time.Duration) error
	log       *slog.Logger
	workers   int
	secret    string
	members   *memberCache
	names     *Names
	limits    *rateLimits
	http      *http.Client
	cards     *cardWriter
	// bodies holds a token per request body being read (verified): at
	// most maxBodies unauthenticated bodies in memory at once.
	bodies chan struct{}

	self atomic.Pointer[identity] // set once by Start

	// queueMu guards started, closed and jobs. Only submit, Start and Close
	// take it, never a worker, so Close waiting for a blocked submit cannot
	// deadlock with the workers draining the queue.
	queueMu sync.RWMutex
	started bool
	closed  bool
	jobs    chan func(context.Context)
	wg      sync.WaitGroup // counts worker goroutines

	intakeMu   sync.Mutex         // guards stopIntake and intakeDone
	stopIntake context.CancelFunc // stops Socket Mode intake; set by StartSocketMode
	intakeDone chan struct{}      // closed when the Socket Mode loop has returned

	notedMu sync.Mutex        // guards noted
	noted   map[string]string // request id → last status announced in the task thread
	// waitingNotes: request id → ts of its waiting note in the task thread
	// (posted by this process), removed once the decision is posted.
	waitingNotes map[string]string
}

// identity is who the bot is in the workspace, learnt from auth.test.
type identity struct {
	UserID       string
	BotID        string
	TeamID       string
	EnterpriseID string
	// URL is the workspace's address as auth.test gives it
	// ("https://acme.slack.com/"): a message's permalink is built on it.
	URL string
}

// errNotRunning is returned when work arrives before Start or after Close.
var errNotRunning = errors.New("bot: not running")

// submit queues job for the pool. It blocks while the queue is full, until
// ctx ends.
func (b *Bot) submit(ctx context.Context, job func(context.Context)) error {
	b.queueMu.RLock()
	defer b.queueMu.RUnlock() // Close waits for in-flight submits before closing jobs
	if !b.started || b.closed {
		return errNotRunning
	}
	// A free slot takes the job whatever ctx says, so the answer does not
	// depend on which of two ready cases select picks.
	select {
	case b.jobs <- job:
		return nil
	default:
	}
	select {
	case b.jobs <- job:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// identity returns who the bot is; zero before Start.
func (b *Bot) identity() identity {
	if id := b.self.Load(); id != nil {
		return *id
	}
	return identity{}
}

func (b *Bot) running() bool {
	b.queueMu.RLock()
	defer b.queueMu.RUnlock()
	return b.started && !b.closed
}
