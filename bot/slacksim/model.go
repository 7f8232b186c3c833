package slacksim

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"time"
)

// Delivery selects how the workspace hands events and interactions to the app.
type Delivery int

const (
	// SocketMode delivers envelopes over WebSocket connections opened with
	// apps.connections.open. It is the default.
	SocketMode Delivery = iota
	// HTTP delivers signed HTTP POSTs to Options.EventsURL,
	// Options.InteractiveURL and Options.CommandsURL.
	HTTP
)

// Fixed identifiers of the simulated team and app.
const (
	TeamID    = "T0SIM0001"
	AppID     = "A0SIM0001"
	BotID     = "B0SIM0001"
	BotUserID = "U0SIMBOT1"
)

// Sentinel errors returned by the methods that act as a person.
var (
	ErrNotFound     = errors.New("slacksim: not found")
	ErrNotInChannel = errors.New("slacksim: user is not in the channel")
	ErrNoAck        = errors.New("slacksim: app did not acknowledge in time")
	ErrClosed       = errors.New("slacksim: workspace closed")
)

// RateLimit describes a rate limit on one Web API method. Calls closer
// together than Every (per channel when the call names one) answer HTTP 429
// with a Retry-After header of RetryAfter seconds.
type RateLimit struct {
	Every      time.Duration
	RetryAfter int
}

// Options configures a Workspace. The zero value is a usable Socket Mode
// workspace.
type Options struct {
	// Delivery selects Socket Mode (default) or HTTP delivery.
	Delivery Delivery
	// EventsURL, InteractiveURL and CommandsURL are the HTTP delivery targets.
	EventsURL, InteractiveURL, CommandsURL string
	// SigningSecret signs HTTP deliveries (v0 HMAC-SHA256 over "v0:ts:body").
	// The timestamp comes from Now.
	SigningSecret string
	// BotToken and AppToken are the only accepted tokens; defaults
	// "xoxb-sim" and "xapp-sim".
	BotToken, AppToken string
	// RateLimits maps a Web API method name to its limit.
	RateLimits map[string]RateLimit
	// Now is the clock for timestamps, trigger_id expiry, rate limits and
	// retry timing; default time.Now.
	Now func() time.Time
	// Logger receives diagnostics; default discards.
	Logger *slog.Logger
	// TeamName is the workspace name; default "Countersign Demo".
	TeamName string
	// BotName is the app's bot user name; default "countersign".
	BotName string
	// Events lists the app's event subscriptions; default app_mention,
	// message.im and app_home_opened. Add message.channels / message.groups
	// to receive every channel message. Manifest's bot events replace it.
	Events []string
	// Manifest is the installed app's manifest (ParseManifest of
	// manifest.yml): every Web API call needing a bot scope it does not
	// grant answers missing_scope, as Slack does, and its bot events are
	// the subscriptions. Nil grants every scope (and Events applies).
	Manifest *Manifest
	// PingInterval is how often Socket Mode connections are pinged; default
	// 10 s.
	PingInterval time.Duration
	// AckTimeout bounds how long SubmitView waits (in real time) for the app
	// to acknowledge a view_submission; default 3 s.
	AckTimeout time.Duration
}

// User is a member of the workspace.
type User struct {
	ID       string
	Name     string
	RealName string
	// Email is the profile email users.info shows (real Slack shows it
	// only to apps with users:read.email; this workspace always does).
	Email string
	IsBot bool
	// TeamID is the user's own workspace, default TeamID. Another team's
	// id makes the user an external member (Slack Connect) of the
	// channels they join: their payloads carry their own team.
	TeamID string
}

// Channel is a conversation: a public or private channel, or a DM (IsIM).
type Channel struct {
	ID        string
	Name      string
	IsPrivate bool
	IsIM      bool
	// Members are user IDs. For a DM, the two participants.
	Members []string
}

// Usergroup is a named group of users (a Slack "subteam").
type Usergroup struct {
	ID     string
	Handle string
	Name   string
	Users  []string
}

// Message is a message as the workspace stores it.
type Message struct {
	Channel  string
	TS       string
	ThreadTS string // parent ts for a reply; empty for a top-level message
	User     string // author; BotUserID for the app
	BotID    string // set when the app posted it
	Text     string
	Blocks   json.RawMessage // raw Block Kit JSON array as sent, or nil
	Metadata json.RawMessage // raw message metadata as sent, or nil
	// ReplyCount is the number of thread replies (top-level messages only).
	ReplyCount int
	// VisibleTo is set on ephemeral messages: the only user who sees it.
	VisibleTo string
}

// View is a modal or App Home view as the workspace stores it.
type View struct {
	ID              string
	User            string
	Type            string // "modal" or "home"
	CallbackID      string
	ExternalID      string
	PrivateMetadata string
	Title           string
	Submit          string
	Close           string
	Hash            string
	RootViewID      string
	PreviousViewID  string
	NotifyOnClose   bool
	Blocks          json.RawMessage
	// Errors are the field errors from the app's last response_action
	// "errors", keyed by block_id.
	Errors map[string]string
}

// ViewSubmitResult is how the app answered a view_submission.
type ViewSubmitResult struct {
	// ResponseAction is "", "errors", "update", "push" or "clear".
	ResponseAction string
	// Errors holds field errors keyed by block_id when ResponseAction is
	// "errors".
	Errors map[string]string
	// Closed reports whether the submitted view was closed.
	Closed bool
}

// Call is one recorded Web API call.
type Call struct {
	Method string
	// Params are the decoded parameters without the token. Form fields keep
	// their value; non-string JSON fields hold their JSON text.
	Params map[string]string
	// Error is the Slack error code answered, "" when ok, "ratelimited" for a 429.
	Error string
	At    time.Time
}

// channel is the stored state of a conversation. Guarded by Workspace.mu.
type channel struct {
	Channel
	messages   []*Message // top-level and replies, in post order
	ephemerals []*Message
	// The same, by timestamp, and each thread's replies by its parent's
	// timestamp (in post order): a lookup costs the same in a channel of
	// ten messages and in one of ten thousand (a benchmark's).
	byTS    map[string]*Message
	ephByTS map[string]*Message
	replies map[string][]*Message
}

// add keeps m, posted now, in the channel: in its ephemerals when
// ephemeral.
func (c *channel) add(m *Message, ephemeral bool) {
	if c.byTS == nil {
		c.byTS, c.ephByTS, c.replies = map[string]*Message{}, map[string]*Message{}, map[string][]*Message{}
	}
	if ephemeral {
		c.ephemerals = append(c.ephemerals, m)
		c.ephByTS[m.TS] = m
		return
	}
	c.messages = append(c.messages, m)
	c.byTS[m.TS] = m
	if m.ThreadTS != "" {
		c.replies[m.ThreadTS] = append(c.replies[m.ThreadTS], m)
	}
}

// remove deletes m from the channel (messages or ephemerals).
func (c *channel) remove(m *Message) {
	if c.ephByTS[m.TS] == m {
		c.ephemerals = deleteMessage(c.ephemerals, m)
		delete(c.ephByTS, m.TS)
		return
	}
	if c.byTS[m.TS] != m {
		return
	}
	c.messages = deleteMessage(c.messages, m)
	delete(c.byTS, m.TS)
	if m.ThreadTS != "" {
		if rs := deleteMessage(c.replies[m.ThreadTS], m); len(rs) > 0 {
			c.replies[m.ThreadTS] = rs
		} else {
			delete(c.replies, m.ThreadTS)
		}
	}
}

func (c *channel) isMember(user string) bool { return slices.Contains(c.Members, user) }

// Workspace is a fake Slack workspace. Its methods are safe for concurrent
// use. Create one with New and release it with Close.
type Workspace struct {
	opts Options
	log  *slog.Logger

	mu         sync.Mutex // guards every field below
	baseURL    string
	users      map[string]*User
	userOrder  []string
	channels   map[string]*channel
	chanOrder  []string
	groups     map[string]*Usergroup
	lastTS     time.Time
	seq        int
	triggers   map[string]*trigger
	views      map[string]*viewState
	stacks     map[string][]string // user -> modal view IDs, bottom first
	homes      map[string]string   // user -> home view ID
	calls      callLog
	rateLast   map[string]time.Time
	forced     map[string]forcedLimit
	holds      holds                // answers held back (HoldAnswer); its own lock
	deliveries map[string]*delivery // envelope ID -> delivery
	events     map[string]*delivery // event ID -> delivery
	responses  map[string]responseTarget
	changed    chan struct{} // closed and replaced on every change
	version    int64
	closed     bool
	server     *http.Server
	hub        hub

	wg sync.WaitGroup // tracks HTTP deliveries and socket goroutines
}

type forcedLimit struct {
	n          int
	retryAfter int
}

type trigger struct {
	user   string
	issued time.Time
	used   bool
}

// New returns a workspace with its app installed: a bot user BotUserID
// named Options.BotName.
func New(opts Options) *Workspace {
	if opts.BotToken == "" {
		opts.BotToken = "xoxb-sim"
	}
	if opts.AppToken == "" {
		opts.AppToken = "xapp-sim"
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.NewTextHandler(io.Discard, nil))
	}
	if opts.TeamName == "" {
		opts.TeamName = "Countersign Demo"
	}
	if opts.BotName == "" {
		opts.BotName = "countersign"
	}
	if opts.Manifest != nil {
		opts.Events = slices.Clone(opts.Manifest.Events)
	}
	if opts.Events == nil {
		opts.Events = []string{"app_mention", "message.im", "app_home_opened"}
	}
	if opts.PingInterval <= 0 {
		opts.PingInterval = 10 * time.Second
	}
	if opts.AckTimeout <= 0 {
		opts.AckTimeout = 3 * time.Second
	}
	w := &Workspace{
		opts:       opts,
		log:        opts.Logger,
		users:      map[string]*User{},
		channels:   map[string]*channel{},
		groups:     map[string]*Usergroup{},
		triggers:   map[string]*trigger{},
		views:      map[string]*viewState{},
		stacks:     map[string][]string{},
		homes:      map[string]string{},
		rateLast:   map[string]time.Time{},
		forced:     map[string]forcedLimit{},
		deliveries: map[string]*delivery{},
		events:     map[string]*delivery{},
		responses:  map[string]responseTarget{},
		changed:    make(chan struct{}),
	}
	w.hub.init()
	w.AddUser(User{ID: BotUserID, Name: opts.BotName, RealName: opts.BotName, IsBot: true})
	return w
}

// Start serves the workspace on addr (for example "127.0.0.1:0") and returns
// its base URL, such as "http://127.0.0.1:41234". Close stops the server.
func (w *Workspace) Start(addr string) (string, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return "", fmt.Errorf("slacksim listen %s: %w", addr, err)
	}
	base := "http://" + ln.Addr().String()
	srv := &http.Server{Handler: w.Handler(), ReadHeaderTimeout: 10 * time.Second}
	w.mu.Lock()
	w.baseURL = base
	w.server = srv
	w.mu.Unlock()
	w.wg.Add(1)
	go func() { // exits when Close shuts the server down
		defer w.wg.Done()
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			w.log.Error("slacksim serve", "err", err)
		}
	}()
	return base, nil
}

// SetBaseURL tells the workspace where it is served when the caller serves
// Handler itself (for example with httptest.NewServer). Without it, URLs
// are derived from each request's Host.
func (w *Workspace) SetBaseURL(base string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.baseURL = strings.TrimSuffix(base, "/")
}

// BaseURL returns the URL the workspace is served at, or "" if unknown.
func (w *Workspace) BaseURL() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.baseURL
}

// APIURL returns the Web API base URL with its trailing slash, for
// slack.OptionAPIURL.
func (w *Workspace) APIURL() string { return w.BaseURL() + "/api/" }

// Close stops the server started by Start, drops Socket Mode connections
// and waits for in-flight deliveries to finish.
func (w *Workspace) Close() {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return
	}
	w.closed = true
	srv := w.server
	w.bumpLocked()
	w.mu.Unlock()
	w.holds.releaseAll()
	w.hub.closeAll()
	if srv != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = srv.Shutdown(ctx)
		cancel()
	}
	w.wg.Wait()
}

// now returns the injected time.
func (w *Workspace) now() time.Time { return w.opts.Now() }

// bumpLocked wakes every WaitFor and UI subscriber. Caller holds w.mu.
func (w *Workspace) bumpLocked() {
	w.version++
	close(w.changed)
	w.changed = make(chan struct{})
}

// Changed returns a channel that is closed at the next change of workspace
// state, and the current version number.
func (w *Workspace) Changed() (<-chan struct{}, int64) {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.changed, w.version
}

// WaitFor blocks until cond returns true or ctx is done. cond is evaluated
// after every change to the workspace (a message posted, a view opened, an
// envelope acknowledged, an API call recorded); it may call the
// workspace's inspection methods.
func (w *Workspace) WaitFor(ctx context.Context, cond func() bool) error {
	for {
		ch, _ := w.Changed()
		if cond() {
			return nil
		}
		select {
		case <-ch:
		case <-ctx.Done():
			return fmt.Errorf("slacksim wait: %w", ctx.Err())
		}
	}
}

// nextTSLocked returns a fresh, strictly increasing message timestamp.
func (w *Workspace) nextTSLocked() string {
	t := w.now().Truncate(time.Microsecond)
	if !t.After(w.lastTS) {
		t = w.lastTS.Add(time.Microsecond)
	}
	w.lastTS = t
	return fmt.Sprintf("%d.%06d", t.Unix(), t.Nanosecond()/1000)
}

// newIDLocked returns a fresh identifier with the given prefix.
func (w *Workspace) newIDLocked(prefix string) string {
	w.seq++
	return fmt.Sprintf("%s%07d", prefix, w.seq)
}

// AddUser adds or replaces a user. An empty ID is generated.
func (w *Workspace) AddUser(u User) User {
	w.mu.Lock()
	defer w.mu.Unlock()
	if u.ID == "" {
		u.ID = w.newIDLocked("U")
	}
	if u.Name == "" {
		u.Name = strings.ToLower(u.ID)
	}
	if u.RealName == "" {
		u.RealName = u.Name
	}
	if _, ok := w.users[u.ID]; !ok {
		w.userOrder = append(w.userOrder, u.ID)
	}
	w.users[u.ID] = &u
	w.bumpLocked()
	return u
}

// AddChannel adds or replaces a channel. An empty ID is generated (C… for
// channels, G… for private ones, D… for DMs).
func (w *Workspace) AddChannel(c Channel) Channel {
	w.mu.Lock()
	defer w.mu.Unlock()
	if c.ID == "" {
		switch {
		case c.IsIM:
			c.ID = w.newIDLocked("D")
		case c.IsPrivate:
			c.ID = w.newIDLocked("G")
		default:
			c.ID = w.newIDLocked("C")
		}
	}
	c.Members = slices.Clone(c.Members)
	if old, ok := w.channels[c.ID]; ok {
		old.Channel = c
	} else {
		w.channels[c.ID] = &channel{Channel: c}
		w.chanOrder = append(w.chanOrder, c.ID)
	}
	w.bumpLocked()
	return c
}

// AddUsergroup adds or replaces a user group. An empty ID is generated.
func (w *Workspace) AddUsergroup(g Usergroup) Usergroup {
	w.mu.Lock()
	defer w.mu.Unlock()
	if g.ID == "" {
		g.ID = w.newIDLocked("S")
	}
	g.Users = slices.Clone(g.Users)
	w.groups[g.ID] = &g
	w.bumpLocked()
	return g
}

// DM returns the ID of the direct-message channel between user and the
// bot, creating it if needed.
func (w *Workspace) DM(user string) string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.dmLocked(user)
}

func (w *Workspace) dmLocked(user string) string {
	for _, id := range w.chanOrder {
		c := w.channels[id]
		if c.IsIM && c.isMember(user) && c.isMember(BotUserID) && (user != BotUserID || len(c.Members) == 1) {
			return id
		}
	}
	id := w.newIDLocked("D")
	members := []string{user, BotUserID}
	if user == BotUserID {
		members = []string{BotUserID}
	}
	w.channels[id] = &channel{Channel: Channel{ID: id, Name: user, IsIM: true, Members: members}}
	w.chanOrder = append(w.chanOrder, id)
	w.bumpLocked()
	return id
}

// Users returns every user in the order added.
func (w *Workspace) Users() []User {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]User, 0, len(w.userOrder))
	for _, id := range w.userOrder {
		out = append(out, *w.users[id])
	}
	return out
}

// User returns one user.
func (w *Workspace) User(id string) (User, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	u, ok := w.users[id]
	if !ok {
		return User{}, false
	}
	return *u, true
}

// Channels returns every conversation in the order added.
func (w *Workspace) Channels() []Channel {
	w.mu.Lock()
	defer w.mu.Unlock()
	out := make([]Channel, 0, len(w.chanOrder))
	for _, id := range w.chanOrder {
		c := w.channels[id].Channel
		c.Members = slices.Clone(c.Members)
		out = append(out, c)
	}
	return out
}

// ChannelByName returns the channel with the given name (without "#").
func (w *Workspace) ChannelByName(name string) (Channel, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, id := range w.chanOrder {
		if c := w.channels[id]; c.Name == name && !c.IsIM {
			cc := c.Channel
			cc.Members = slices.Clone(cc.Members)
			return cc, true
		}
	}
	return Channel{}, false
}

// Messages returns the top-level messages of a channel, oldest first.
// Thread replies are in Replies. Like the other inspection methods it takes
// a channel ID, a channel name, or a user ID for that user's DM with the bot.
func (w *Workspace) Messages(channelRef string) []Message {
	return w.MessagesAfter(channelRef, "")
}

// MessagesAfter returns the top-level messages of a channel posted after
// the message with timestamp ts (every one when ts is empty), oldest
// first: what a poller has not seen yet, without copying what it has.
func (w *Workspace) MessagesAfter(channelRef, ts string) []Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.resolveChannelLocked(channelRef)
	if c == nil {
		return nil
	}
	first := 0
	if ts != "" {
		first = len(c.messages) // kept in the order of their timestamps
		for first > 0 && tsAfter(c.messages[first-1].TS, ts) {
			first--
		}
	}
	var out []Message
	for _, m := range c.messages[first:] {
		if m.ThreadTS == "" {
			out = append(out, cloneMessage(m))
		}
	}
	return out
}

// Replies returns the replies in the thread under parentTS, oldest first,
// without the parent.
func (w *Workspace) Replies(channelRef, parentTS string) []Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.resolveChannelLocked(channelRef)
	if c == nil {
		return nil
	}
	var out []Message
	for _, m := range c.messages {
		if m.ThreadTS == parentTS {
			out = append(out, cloneMessage(m))
		}
	}
	return out
}

// Message returns one message (top-level or reply) by its ts.
func (w *Workspace) Message(channelRef, ts string) (Message, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	c := w.resolveChannelLocked(channelRef)
	if c == nil {
		return Message{}, false
	}
	m := w.findMessageLocked(c.ID, ts)
	if m == nil {
		return Message{}, false
	}
	return cloneMessage(m), true
}

// Ephemerals returns the ephemeral messages shown to user, oldest first,
// across all channels.
func (w *Workspace) Ephemerals(user string) []Message {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Message
	for _, id := range w.chanOrder {
		for _, m := range w.channels[id].ephemerals {
			if m.VisibleTo == user {
				out = append(out, cloneMessage(m))
			}
		}
	}
	return out
}

// OpenViews returns the modal stack of user, bottom first.
func (w *Workspace) OpenViews(user string) []View {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []View
	for _, id := range w.stacks[user] {
		out = append(out, w.views[id].export())
	}
	return out
}

// Home returns the App Home view published for user, if any.
func (w *Workspace) Home(user string) (View, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	id, ok := w.homes[user]
	if !ok {
		return View{}, false
	}
	return w.views[id].export(), true
}

// Calls returns how many times method was called (including failed calls),
// since the workspace started: counted, not limited to CallLog's window.
func (w *Workspace) Calls(method string) int {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.calls.counts[method]
}

// CallLog returns the recorded Web API calls, oldest first: every call, or
// the last CallLogLimit of them in a workspace that has answered more.
func (w *Workspace) CallLog() []Call {
	w.mu.Lock()
	defer w.mu.Unlock()
	recent := w.calls.window()
	out := make([]Call, len(recent))
	for i, c := range recent {
		c.Params = maps.Clone(c.Params)
		out[i] = c
	}
	return out
}

// CallLogLimit is how many calls CallLog keeps: a workspace that runs for
// days (the demo's) must not keep every call it ever answered.
const CallLogLimit = 1_000

// callLog is the workspace's record of Web API calls: the last
// CallLogLimit in full, and how many of each method since the start.
type callLog struct {
	recent []Call // the last calls, between CallLogLimit and twice that once full
	counts map[string]int
}

func (l *callLog) add(c Call) {
	if l.counts == nil {
		l.counts = make(map[string]int)
	}
	l.counts[c.Method]++
	l.recent = append(l.recent, c)
	if len(l.recent) >= 2*CallLogLimit { // a copy, so the old calls are freed
		l.recent = slices.Clone(l.recent[len(l.recent)-CallLogLimit:])
	}
}

// window is the last CallLogLimit calls (shared: the caller copies).
func (l *callLog) window() []Call {
	return l.recent[max(0, len(l.recent)-CallLogLimit):]
}

// ForceRateLimit makes the next n calls of method answer HTTP 429 with
// Retry-After retryAfter seconds.
func (w *Workspace) ForceRateLimit(method string, n, retryAfter int) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.forced[method] = forcedLimit{n: n, retryAfter: retryAfter}
}

func (w *Workspace) findMessageLocked(channelID, ts string) *Message {
	c, ok := w.channels[channelID]
	if !ok {
		return nil
	}
	if m := c.byTS[ts]; m != nil {
		return m
	}
	return c.ephByTS[ts]
}

func cloneMessage(m *Message) Message {
	c := *m
	c.Blocks = slices.Clone(m.Blocks)
	c.Metadata = slices.Clone(m.Metadata)
	return c
}

// subscribed reports whether the app subscribed to the event name.
func (w *Workspace) subscribed(name string) bool { return slices.Contains(w.opts.Events, name) }
