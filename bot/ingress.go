package bot

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"sync"
	"time"

	"github.com/slack-go/slack/socketmode"
)

// Request signing (https://docs.slack.dev/authentication/verifying-requests-from-slack).
const (
	headerSignature = "X-Slack-Signature"
	headerTimestamp = "X-Slack-Request-Timestamp"
	maxSkew         = 5 * time.Minute
	maxBody         = 4 << 20
	// syncBudget bounds work done before answering Slack, which waits 3 s.
	syncBudget = 2 * time.Second
)

// ErrBadSignature is returned by VerifyRequest for a missing, malformed,
// wrong or stale signature.
var ErrBadSignature = errors.New("bot: bad slack request signature")

// VerifyRequest checks Slack's v0 signature over body: HMAC-SHA256 of
// "v0:{timestamp}:{body}" keyed with secret, compared in constant time, with
// the timestamp within five minutes of now. Errors wrap ErrBadSignature.
func VerifyRequest(h http.Header, body []byte, secret string, now time.Time) error {
	if err := verifyHeaders(h, secret, now); err != nil {
		return err
	}
	ts, sig := h.Get(headerTimestamp), h.Get(headerSignature)
	mac := hmac.New(sha256.New, []byte(secret))
	fmt.Fprintf(mac, "v0:%s:", ts)
	mac.Write(body)
	want := "v0=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(sig), []byte(want)) {
		return fmt.Errorf("%w: signature mismatch", ErrBadSignature)
	}
	return nil
}

// verifyHeaders is the part of VerifyRequest that needs no body: a secret,
// both headers and a timestamp within the window. A request failing it is
// refused before its body is read.
func verifyHeaders(h http.Header, secret string, now time.Time) error {
	ts, sig := h.Get(headerTimestamp), h.Get(headerSignature)
	if secret == "" {
		return fmt.Errorf("%w: no signing secret configured", ErrBadSignature)
	}
	if ts == "" || sig == "" {
		return fmt.Errorf("%w: missing headers", ErrBadSignature)
	}
	sec, err := strconv.ParseInt(ts, 10, 64)
	if err != nil {
		return fmt.Errorf("%w: malformed timestamp", ErrBadSignature)
	}
	if skew := now.Sub(time.Unix(sec, 0)).Abs(); skew > maxSkew {
		return fmt.Errorf("%w: timestamp %s off by %s", ErrBadSignature, ts, skew.Round(time.Second))
	}
	return nil
}

// HTTPHandler serves Slack's HTTP delivery: POST /slack/events,
// /slack/interactive and /slack/commands, plus GET /healthz. Every POST is
// verified with the signing secret against the injected clock; a bad,
// missing or stale signature gets 401 and nothing happens. Work is handed
// to the worker pool so Slack is answered at once; view submissions are
// validated before answering so field errors appear in the modal.
func (b *Bot) HTTPHandler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) {
		if !b.running() {
			http.Error(w, "not running", http.StatusServiceUnavailable)
			return
		}
		fmt.Fprintln(w, "ok")
	})
	mux.Handle("POST /slack/events", b.verified(func(ctx context.Context, body []byte) (any, error) {
		return b.onEvent(ctx, body)
	}))
	mux.Handle("POST /slack/interactive", b.verified(func(ctx context.Context, body []byte) (any, error) {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, errBadPayload
		}
		return b.onInteraction(ctx, []byte(form.Get("payload")))
	}))
	mux.Handle("POST /slack/commands", b.verified(func(ctx context.Context, body []byte) (any, error) {
		form, err := url.ParseQuery(string(body))
		if err != nil {
			return nil, errBadPayload
		}
		return b.onCommand(ctx, commandFromForm(form))
	}))
	return mux
}

// verified wraps a payload handler with signature verification and writes
// its answer as JSON (or an empty 200).
//
// Nothing unauthenticated costs memory or a goroutine for long: a request
// without both signature headers, or with a timestamp outside the window,
// gets 401 before its body is read; a declared body over maxBody gets 413
// at once; at most maxBodies bodies are read at a time (a request waits up
// to syncBudget for its turn, else 503), each within bodyBudget (else 400).
func (b *Bot) verified(handle func(ctx context.Context, body []byte) (any, error)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if err := verifyHeaders(r.Header, b.secret, b.now()); err != nil {
			b.log.Warn("refused unsigned slack request", "path", r.URL.Path, "err", err)
			refuseEarly(w, http.StatusUnauthorized, "invalid signature")
			return
		}
		if r.ContentLength > maxBody {
			refuseEarly(w, http.StatusRequestEntityTooLarge, "body too large")
			return
		}
		body, status := b.readBody(w, r)
		if status != 0 {
			http.Error(w, http.StatusText(status), status)
			return
		}
		if err := VerifyRequest(r.Header, body, b.secret, b.now()); err != nil {
			b.log.Warn("refused unsigned slack request", "path", r.URL.Path, "err", err)
			http.Error(w, "invalid signature", http.StatusUnauthorized)
			return
		}
		if !b.running() {
			http.Error(w, "not running", http.StatusServiceUnavailable)
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), syncBudget)
		defer cancel()
		resp, err := handle(ctx, body)
		switch {
		case errors.Is(err, errBadPayload):
			http.Error(w, "bad payload", http.StatusBadRequest)
			return
		case err != nil:
			// Not acknowledged: Slack will retry, perhaps on another replica.
			b.log.Error("slack request not handled", "path", r.URL.Path, "err", err)
			http.Error(w, "unavailable", http.StatusServiceUnavailable)
			return
		}
		if resp == nil {
			w.WriteHeader(http.StatusOK)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		if err := json.NewEncoder(w).Encode(resp); err != nil {
			b.log.Error("write slack response", "err", err)
		}
	})
}

// Bounds on reading request bodies before their signature is checked.
const (
	// maxBodies is how many bodies are read at once, at most maxBody each.
	maxBodies = 16
	// bodyBudget bounds the reading of one body: Slack sends it at once,
	// and an ack later than 3 s is worthless anyway.
	bodyBudget = 2 * time.Second
)

// readBody reads r's body, at most maxBody bytes within bodyBudget, holding
// one of the maxBodies slots meanwhile. A status other than 0 is the
// refusal to answer: 413 too large, 400 not sent in time or broken, 503 no
// slot within syncBudget.
func (b *Bot) readBody(w http.ResponseWriter, r *http.Request) ([]byte, int) {
	wait := time.NewTimer(syncBudget)
	defer wait.Stop()
	select {
	case b.bodies <- struct{}{}:
		defer func() { <-b.bodies }()
	case <-wait.C:
		return nil, http.StatusServiceUnavailable
	case <-r.Context().Done():
		return nil, http.StatusServiceUnavailable
	}
	// A network deadline: wall-clock time is what the connection lives in.
	_ = http.NewResponseController(w).SetReadDeadline(time.Now().Add(bodyBudget))
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxBody))
	var tooLarge *http.MaxBytesError
	switch {
	case errors.As(err, &tooLarge):
		return nil, http.StatusRequestEntityTooLarge
	case err != nil:
		return nil, http.StatusBadRequest
	}
	return body, 0
}

// refuseEarly answers a request whose body is not read, and closes the
// connection rather than drain the body.
func refuseEarly(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Connection", "close")
	http.Error(w, msg, status)
}

// RunSocketMode connects with client (built by the caller from the bot
// client and the xapp- token) and serves envelopes until ctx ends or the
// connection fails for good. Every envelope is acknowledged with its
// envelope_id at once, view submissions with their response_action payload
// when there are field errors. It returns nil when ctx is cancelled.
func (b *Bot) RunSocketMode(ctx context.Context, client *socketmode.Client) error {
	if !b.running() {
		return errNotRunning
	}
	// The connection outlives ctx by the envelopes being handled: when ctx
	// ends (shutdown), the envelopes in hand are still handled and acked on
	// the open socket, then the connection is closed. Nothing new is read.
	connCtx, closeConn := context.WithCancel(context.WithoutCancel(ctx))
	defer closeConn()
	runErr := make(chan error, 1)
	// Exits when closeConn is called (deferred above) or the connection fails.
	go func() { runErr <- client.RunContext(connCtx) }()
	// Envelopes are handled side by side, at most socketInflight at once,
	// so one slow envelope (Redis slow to answer the de-dup check) does not
	// hold back the acks of those behind it past Slack's 3 s.
	slots := make(chan struct{}, socketInflight)
	var handling sync.WaitGroup
	for {
		select {
		case <-ctx.Done():
			// Ack what is in hand on the open socket, unless it fails
			// meanwhile; then cancelling connCtx unblocks the acks.
			idle := make(chan struct{})
			// Exits once every envelope in hand is handled (each within
			// syncBudget, or at once when connCtx is cancelled).
			go func() { handling.Wait(); close(idle) }()
			select {
			case <-idle:
				closeConn()
				<-runErr
			case <-runErr:
				closeConn()
				<-idle
			}
			return nil
		case err := <-runErr:
			closeConn() // nothing reads acks any more: unblock the handlers
			handling.Wait()
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("socket mode: %w", err)
		case evt := <-client.Events:
			select {
			case slots <- struct{}{}:
			case <-ctx.Done():
				continue // not acked: Slack redelivers it to another socket
			}
			handling.Add(1)
			// Exits when the envelope is handled and acked: onSocketEvent
			// is bounded by syncBudget, and its ack by connCtx.
			go func() {
				defer handling.Done()
				defer func() { <-slots }()
				b.onSocketEvent(connCtx, client, evt)
			}()
		}
	}
}

// rawEventsRequest is the Events API envelope inside a message slack-go
// could not parse, if it is one.
func rawEventsRequest(evt socketmode.Event) (*socketmode.Request, bool) {
	bad, ok := evt.Data.(*socketmode.ErrorBadMessage)
	if !ok {
		return nil, false
	}
	var req socketmode.Request
	if json.Unmarshal(bad.Message, &req) != nil || req.Type != socketmode.RequestTypeEventsAPI || req.EnvelopeID == "" {
		return nil, false
	}
	return &req, true
}

// socketInflight bounds the Socket Mode envelopes handled at once. Each
// holds its slot at most syncBudget.
const socketInflight = 64

func (b *Bot) onSocketEvent(ctx context.Context, client *socketmode.Client, evt socketmode.Event) {
	switch evt.Type {
	case socketmode.EventTypeConnected:
		b.log.Info("socket mode connected")
		return
	case socketmode.EventTypeErrorBadMessage:
		// slack-go's typed parser refuses some events as Slack sends them
		// (subteam_members_changed's counts are strings in Slack's
		// reference, numbers in slack-go); the bot reads its events' JSON
		// itself, so the envelope is handled from its raw request.
		req, ok := rawEventsRequest(evt)
		if !ok {
			b.log.Warn("socket mode trouble", "type", evt.Type, "data", fmt.Sprint(evt.Data))
			return
		}
		evt = socketmode.Event{Type: socketmode.EventTypeEventsAPI, Request: req}
	case socketmode.EventTypeConnectionError, socketmode.EventTypeIncomingError:
		b.log.Warn("socket mode trouble", "type", evt.Type, "data", fmt.Sprint(evt.Data))
		return
	case socketmode.EventTypeEventsAPI, socketmode.EventTypeInteractive, socketmode.EventTypeSlashCommand:
	default:
		return
	}
	req := evt.Request
	if req == nil || req.EnvelopeID == "" {
		return
	}
	sctx, cancel := context.WithTimeout(ctx, syncBudget)
	defer cancel()
	var (
		resp any
		err  error
	)
	switch evt.Type {
	case socketmode.EventTypeEventsAPI:
		resp, err = b.onEvent(sctx, req.Payload)
	case socketmode.EventTypeInteractive:
		resp, err = b.onInteraction(sctx, req.Payload)
	case socketmode.EventTypeSlashCommand:
		var cmd command
		if jerr := json.Unmarshal(req.Payload, &cmd); jerr != nil {
			err = errBadPayload
			break
		}
		resp, err = b.onCommand(sctx, cmd)
	}
	if err != nil && !errors.Is(err, errBadPayload) {
		// Not acknowledged: Slack redelivers, perhaps to another socket.
		b.log.Error("socket mode envelope not handled", "type", evt.Type, "envelope_id", req.EnvelopeID, "err", err)
		return
	}
	if resp == nil {
		err = client.AckCtx(ctx, req.EnvelopeID, nil)
	} else {
		err = client.AckCtx(ctx, req.EnvelopeID, resp)
	}
	if err != nil {
		b.log.Error("socket mode ack", "envelope_id", req.EnvelopeID, "err", err)
	}
}

func commandFromForm(f url.Values) command {
	return command{
		Command: f.Get("command"), Text: f.Get("text"), UserID: f.Get("user_id"),
		ChannelID: f.Get("channel_id"), TeamID: f.Get("team_id"), TriggerID: f.Get("trigger_id"),
		EnterpriseID: f.Get("enterprise_id"), UserTeamID: f.Get("user_team_id"),
	}
}
