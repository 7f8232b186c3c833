// Package auditweb is the read-only audit view in the browser: pending
// requests, one request's story, decision rates and review times as
// charts, the state of the hash chain, a filtered, paged history of
// decisions, and who has passkeys (from the audit stream alone). It reads the audit stream and the pending requests through the
// small interfaces below (cmd/countersign wires *store.Audit and
// *store.Store) and builds every page with html/template from the pure
// readers of approval/auditreport, so the stories read as `countersign
// audit show` prints them.
//
// The view never writes: it answers GET and HEAD only (405 otherwise), and
// every page needs a bearer token or basic-auth credentials, compared in
// constant time. Audit data is hostile input (model output, tool
// arguments, Slack text): it is escaped by html/template everywhere, and
// the pages carry a Content-Security-Policy without any script source, so
// nothing on them can run. Charts are inline SVG drawn on the server;
// nothing is fetched from elsewhere.
//
// The package imports only the standard library and approval packages.
package auditweb

import (
	"cmp"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"log/slog"
	"math"
	"net/http"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/option"
)

// Entries reads the audit stream; *store.Audit provides it.
type Entries interface {
	// Range returns up to count entries after the stream id afterID ("" =
	// the beginning), oldest first. An error means Redis failed.
	Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error)
	// RevRange returns up to count entries before the stream id beforeID
	// ("" = the newest), newest first. An error means Redis failed.
	RevRange(ctx context.Context, beforeID string, count int64) ([]approval.Entry, error)
	// Verify checks the whole hash chain: the number of intact entries
	// and nil, or the number before the break and a *approval.ChainError.
	// Any other error means nothing is known.
	Verify(ctx context.Context) (int, error)
}

// Names turns Slack ids into what people read; *bot.Bot provides it
// (users.info, conversations.info, usergroups.list, cached).
type Names interface {
	// Name returns the name of a user, channel or user group id, "" when
	// it is unknown or cannot be looked up now (the page then shows the
	// id). Pages call it while they are built, once per id they show: it
	// must answer from a cache or within a short bound.
	Name(ctx context.Context, id string) string
}

// Pending lists the requests waiting for a decision; *store.Store
// provides it.
type Pending interface {
	// Pending returns the pending requests, oldest first. An error means
	// the store could not be read.
	Pending(ctx context.Context) ([]*approval.Request, error)
}

// Options configures the view. Entries and Pending are required, and so
// are credentials: a Token, or a User and a Password, or both.
type Options struct {
	Entries Entries
	Pending Pending

	// Token is accepted as "Authorization: Bearer <token>".
	Token string
	// User and Password are accepted as HTTP basic auth (a browser asks
	// for them).
	User, Password string

	// Prefix is the path the view is mounted under, default "/audit/".
	Prefix string
	// SlackURL is the workspace's base URL (https://acme.slack.com); when
	// set, cards link to SlackURL/archives/<channel>/p<ts>.
	SlackURL string
	// Names names the Slack users, channels and groups on the pages; nil
	// shows ids.
	Names Names

	// PageSize is the number of rows of a history page, default 50.
	PageSize int
	// ScanLimit bounds how many entries one history page reads looking for
	// matches (default 20,000); past it the page ends with a link that
	// continues the search further back.
	ScanLimit int
	// StatsLimit bounds how many entries the charts read (default
	// 500,000); a window holding more is charted from its first
	// StatsLimit entries, and the page says so.
	StatsLimit int

	// Suggest, when set, drafts the rules the load page suggests (the
	// policy in force, replayed); nil leaves them out.
	Suggest Suggester

	// TrustedProxies are the reverse proxies in front of the view
	// (ParseTrustedProxies): a request whose peer is one of them is
	// counted, for the login throttle, under the address its
	// X-Forwarded-For names before them. X-Forwarded-For from any other
	// peer is ignored.
	TrustedProxies []netip.Prefix

	Now    func() time.Time
	Logger *slog.Logger
}

// noNames shows ids.
type noNames struct{}

func (noNames) Name(context.Context, string) string { return "" }

// Handler serves the view. It is safe for concurrent use.
type Handler struct {
	opts  Options
	mux   *http.ServeMux
	pages *template.Template
	token [sha256.Size]byte
	user  [sha256.Size]byte
	pass  [sha256.Size]byte

	// verifying lets one Verify run at a time (a one-slot semaphore, so
	// waiting honours the request's ctx): reloading the chain page does not
	// stack full-stream reads.
	verifying chan struct{}

	// logins throttles failed logins per source and for the login
	// (throttle.go).
	logins *loginThrottle

	mu sync.Mutex // guards chain and verifies
	// chain is the result of the latest Verify, shown on every page; zero
	// until the chain page is first opened.
	chain chainStatus
	// verifies counts the verifications started.
	verifies int
}

var _ http.Handler = (*Handler)(nil)

// ErrNoCredentials is returned by New when Options names neither a token
// nor a user and password: the view is never served without
// authentication.
var ErrNoCredentials = errors.New("audit view: no credentials configured (set a token, or a user and a password)")

// CheckSettings checks the view's settings before anything is built: when
// it is on (enabled) it needs a token, or a user and a password (it is
// never served without authentication); slackURL, when set, must be the
// workspace's http(s) URL; trustedProxies, when set, addresses and CIDR
// prefixes (ParseTrustedProxies). Each error names the environment
// variable the setting is read from (COUNTERSIGN_AUDIT_VIEW*,
// COUNTERSIGN_SLACK_WORKSPACE_URL).
func CheckSettings(enabled bool, token, user, password, slackURL, trustedProxies string) []error {
	var errs []error
	if enabled {
		switch {
		case user != "" && password == "":
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_VIEW_PASSWORD: required with COUNTERSIGN_AUDIT_VIEW_USER"))
		case user == "" && password != "":
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_VIEW_USER: required with COUNTERSIGN_AUDIT_VIEW_PASSWORD"))
		case token == "" && user == "":
			errs = append(errs, errors.New("COUNTERSIGN_AUDIT_VIEW: set COUNTERSIGN_AUDIT_VIEW_TOKEN, or COUNTERSIGN_AUDIT_VIEW_USER and COUNTERSIGN_AUDIT_VIEW_PASSWORD (the view is never served without authentication)"))
		}
	}
	if slackURL != "" {
		if u, err := url.Parse(slackURL); err != nil || u.Scheme != "https" && u.Scheme != "http" || u.Host == "" {
			errs = append(errs, fmt.Errorf("COUNTERSIGN_SLACK_WORKSPACE_URL: not a URL: %q (want e.g. https://acme.slack.com)", slackURL))
		}
	}
	if _, err := ParseTrustedProxies(trustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES: %w", err))
	}
	return errs
}

//go:embed templates/*.html static/*
var assets embed.FS

// New returns the view, or ErrNoCredentials.
func New(opts Options) (*Handler, error) {
	if opts.Entries == nil || opts.Pending == nil {
		return nil, errors.New("audit view: Entries and Pending are required")
	}
	if opts.Token == "" && (opts.User == "" || opts.Password == "") {
		return nil, ErrNoCredentials
	}
	opts.Prefix = cmp.Or(opts.Prefix, "/audit/")
	if !strings.HasPrefix(opts.Prefix, "/") || !strings.HasSuffix(opts.Prefix, "/") {
		return nil, fmt.Errorf("audit view: prefix %q must start and end with /", opts.Prefix)
	}
	for _, p := range opts.TrustedProxies {
		if !p.IsValid() || p.Bits() == 0 {
			return nil, fmt.Errorf("audit view: trusted proxy %q: want an address or a prefix narrower than every address", p)
		}
	}
	opts.SlackURL = strings.TrimRight(opts.SlackURL, "/")
	opts.Names = cmp.Or[Names](opts.Names, noNames{})
	opts.PageSize = option.PositiveOr(opts.PageSize, 50)
	opts.ScanLimit = option.PositiveOr(opts.ScanLimit, 20000)
	opts.StatsLimit = option.PositiveOr(opts.StatsLimit, 500000)
	opts.Now = option.FuncOr(opts.Now, time.Now)
	opts.Logger = cmp.Or(opts.Logger, slog.New(slog.DiscardHandler))
	h := &Handler{opts: opts, mux: http.NewServeMux(), verifying: make(chan struct{}, 1), logins: newLoginThrottle(opts.Now, opts.Logger)}
	if opts.Token != "" {
		h.token = sha256.Sum256([]byte(opts.Token))
	}
	if opts.User != "" {
		h.user, h.pass = sha256.Sum256([]byte(opts.User)), sha256.Sum256([]byte(opts.Password))
	}
	t, err := template.New("").Funcs(h.funcs()).ParseFS(assets, "templates/*.html")
	if err != nil {
		return nil, fmt.Errorf("audit view templates: %w", err)
	}
	h.pages = t
	p := opts.Prefix
	h.mux.HandleFunc("GET "+p+"{$}", h.servePending)
	h.mux.HandleFunc("GET "+p+"history", h.serveHistory)
	h.mux.HandleFunc("GET "+p+"requests/{id}", h.serveStory)
	h.mux.HandleFunc("GET "+p+"charts", h.serveCharts)
	h.mux.HandleFunc("GET "+p+"load", h.serveLoad)
	h.mux.HandleFunc("GET "+p+"passkeys", h.servePasskeys)
	h.mux.HandleFunc("GET "+p+"chain", h.serveChain)
	h.mux.HandleFunc("GET "+p+"style.css", h.serveCSS)
	return h, nil
}

// Path is where the view is mounted (Options.Prefix).
func (h *Handler) Path() string { return h.opts.Prefix }

// ServeHTTP checks the credentials, refuses anything but GET and HEAD, and
// serves the page.
func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	hdr := w.Header()
	hdr.Set("Cache-Control", "no-store")
	hdr.Set("X-Content-Type-Options", "nosniff")
	hdr.Set("X-Frame-Options", "DENY")
	hdr.Set("Referrer-Policy", "no-referrer")
	// No script source at all: even markup that slipped through could not
	// run. Styles come from the view's own stylesheet; SVG charts use
	// presentation attributes, which the policy does not restrict.
	hdr.Set("Content-Security-Policy", "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")
	source := loginSource(r, h.opts.TrustedProxies)
	if wait := h.logins.wait(source); wait > 0 {
		h.throttled(w, wait)
		return
	}
	if !h.authorized(r) {
		if r.Header.Get("Authorization") != "" {
			if wait := h.logins.failed(source); wait > 0 {
				h.throttled(w, wait)
				return
			}
		}
		if h.opts.User != "" {
			hdr.Set("WWW-Authenticate", `Basic realm="Countersign audit", charset="UTF-8"`)
		} else {
			hdr.Set("WWW-Authenticate", `Bearer realm="Countersign audit"`)
		}
		http.Error(w, "authentication required", http.StatusUnauthorized)
		return
	}
	h.logins.succeeded(source)
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		hdr.Set("Allow", "GET, HEAD")
		http.Error(w, "the audit view is read-only", http.StatusMethodNotAllowed)
		return
	}
	h.mux.ServeHTTP(w, r)
}

// throttled answers a source that must wait 429 with the seconds left.
func (h *Handler) throttled(w http.ResponseWriter, wait time.Duration) {
	w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(wait.Seconds()))))
	http.Error(w, "too many failed logins; retry later", http.StatusTooManyRequests)
}

// authorized reports whether r carries the configured token or user and
// password. Values are hashed before the constant-time comparison, so
// neither their content nor their length shows in the timing.
func (h *Handler) authorized(r *http.Request) bool {
	auth := r.Header.Get("Authorization")
	if h.opts.Token != "" {
		if tok, ok := strings.CutPrefix(auth, "Bearer "); ok {
			got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
			if subtle.ConstantTimeCompare(got[:], h.token[:]) == 1 {
				return true
			}
		}
	}
	if h.opts.User != "" {
		if u, p, ok := r.BasicAuth(); ok {
			gu, gp := sha256.Sum256([]byte(u)), sha256.Sum256([]byte(p))
			userOK := subtle.ConstantTimeCompare(gu[:], h.user[:])
			passOK := subtle.ConstantTimeCompare(gp[:], h.pass[:])
			if userOK&passOK == 1 {
				return true
			}
		}
	}
	return false
}

// render executes the page template name with data inside the layout.
func (h *Handler) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	var b strings.Builder
	page := layout{Title: name, Prefix: h.opts.Prefix, Chain: h.chainNow(), Now: h.opts.Now(), Body: data}
	if t, ok := data.(interface{ title() string }); ok {
		page.Title = t.title()
	}
	if err := h.pages.ExecuteTemplate(&b, name+".html", page); err != nil {
		h.opts.Logger.Error("audit view render", "page", name, "path", r.URL.Path, "err", err)
		http.Error(w, "Internal error.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	_, _ = w.Write([]byte(b.String()))
}

// fail answers a failed read: the detail goes to the log, the person gets
// a short message.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, what string, err error) {
	h.opts.Logger.Error("audit view "+what, "path", r.URL.Path, "err", err)
	http.Error(w, "Internal error: could not read the "+what+" (see the logs).", http.StatusBadGateway)
}

func (h *Handler) serveCSS(w http.ResponseWriter, _ *http.Request) {
	b, err := assets.ReadFile("static/style.css")
	if err != nil {
		http.Error(w, "Internal error.", http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "text/css; charset=utf-8")
	w.Header().Set("Cache-Control", "max-age=300")
	_, _ = w.Write(b)
}

// layout is what every page template gets: the page's own data in Body.
type layout struct {
	Title  string
	Prefix string
	Chain  chainStatus
	Now    time.Time
	Body   any
}
