package api

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// A refusal is not an audit entry and a log line of its own: 800
// requests without a key, with 60 KB paths, once grew the stream, which is
// kept for ever, by 131 MB in 32 s, and 2,000 calls of a valid key past
// its rate limit by 1,388 entries (and as many WARN lines) in 1.2 s.
// Refusals are counted per source, in two tallies: without a valid key (no
// key, an unknown key, or a path that is no endpoint), per remote address
// and whether a key was presented (refusalSource); of a valid key, per key
// and refusal code (keyRefusalSource), so a flood of one kind (429s) hides
// no refusal of another (a 403 for a tool outside the key) and the metric
// per code stays exact. A source is written, and logged, at most once per
// refusalWindow: its first refusal at once (Count 1), later ones held and
// written, with their count, by the first refusal after the window or by
// FlushRefusals. Their path and message are cut to refusalText bytes.
const (
	refusalWindow = time.Minute
	// maxRefusalSources bounds the sources each tally counts at once;
	// refusals from more are counted under one source, refusalOverflow,
	// so a sender with many addresses or random keys cannot grow the
	// tally or the stream. A valid key's sources are bounded by the keys
	// of the policy file and the codes of the API, and counted apart, so
	// a flood without a key never pushes a key's refusals into the
	// overflow.
	maxRefusalSources = 1000
	refusalOverflow   = "other sources"
	// refusalText bounds the path and message of a refusal, in the audit
	// and on the log line.
	refusalText = 512
)

// refusalTally counts refusals without a valid key per source.
type refusalTally struct {
	mu      sync.Mutex // guards sources and swept
	sources map[string]*heldRefusals
	swept   time.Time // when flush last ran over every source
}

// heldRefusals is one source's refusals since its last entry.
type heldRefusals struct {
	since time.Time                // when its last entry was written
	held  int                      // refusals since, not written yet
	last  approval.APIRefusedEvent // the newest one held
}

// refusalSource names where r came from: source as refusals are counted,
// its remote host and whether it presented a key (a sender choosing
// random keys is one source); label as the entry says it, with the key's
// fingerprint (the first bytes of its SHA-256, never the key).
func refusalSource(r *http.Request) (source, label string) {
	host, _, err := net.SplitHostPort(r.RemoteAddr) // net/http's form
	if err != nil {
		host = r.RemoteAddr
	}
	host = clip.Bytes(host, approval.MaxField)
	token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok || strings.TrimSpace(token) == "" {
		return host + ", no key", host + ", no key"
	}
	sum := sha256.Sum256([]byte(strings.TrimSpace(token)))
	return host + ", a key", host + ", key sha256:" + hex.EncodeToString(sum[:4])
}

// keyRefusalSource is the source a refusal of key k with code is counted
// under: the key's name and the code.
func keyRefusalSource(k *keyState, code string) string { return k.Name + "\x00" + code }

// note counts ev (its Source set) from source at now. It returns the event to write now
// (write true): the source's first refusal, or the first after its
// window, standing for the refusals held since. due are other sources'
// held refusals whose window ended (all sources are looked at once per
// window), so a source gets at most one entry a minute.
func (t *refusalTally) note(now time.Time, source string, ev approval.APIRefusedEvent) (out approval.APIRefusedEvent, write bool, due []approval.APIRefusedEvent) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.sources == nil {
		t.sources = map[string]*heldRefusals{}
	}
	h := t.sources[source]
	if h == nil && len(t.sources) >= maxRefusalSources {
		source = refusalOverflow
		h = t.sources[source]
		ev.Source = source
	}
	switch {
	case h != nil && now.Before(h.since.Add(refusalWindow)):
		h.held++
		h.last = ev
	default:
		ev.Count = 1
		if h != nil && h.held > 0 {
			ev.Count, ev.Since = h.held+1, h.since
		}
		t.sources[source] = &heldRefusals{since: now}
		write = true
	}
	// This source's window is open now: the sweep finds nothing of it.
	if !now.Before(t.swept.Add(refusalWindow)) {
		due = t.flushLocked(now, false)
		t.swept = now
	}
	return ev, write, due
}

// flushLocked returns, and forgets, the held refusals of every source
// whose window ended at now (every source with all); sources with nothing
// held whose window ended are dropped. t.mu must be held.
func (t *refusalTally) flushLocked(now time.Time, all bool) []approval.APIRefusedEvent {
	var out []approval.APIRefusedEvent
	for src, h := range t.sources {
		ended := !now.Before(h.since.Add(refusalWindow))
		if h.held > 0 && (ended || all) {
			ev := h.last
			ev.Count, ev.Since = h.held, h.since
			out = append(out, ev)
			delete(t.sources, src)
			continue
		}
		if ended {
			delete(t.sources, src)
		}
	}
	return out
}

// FlushRefusals writes the refusals that are held (counted, not written
// yet) for sources whose minute ended; with all, for every source (at
// shutdown). Serve runs it every minute (RunRefusals); without it a
// source's last held refusals are written with its next one.
func (s *Server) FlushRefusals(ctx context.Context, all bool) {
	now := s.now()
	var due []approval.APIRefusedEvent
	for _, t := range []*refusalTally{&s.unauth, &s.keyed} {
		t.mu.Lock()
		due = append(due, t.flushLocked(now, all)...)
		t.mu.Unlock()
	}
	for _, ev := range due {
		s.writeRefusal(ctx, ev, "")
	}
}

// writeRefusal audits ev and logs it, one line standing for its Count
// refusals; requestID is the request the refused call named, if any.
func (s *Server) writeRefusal(ctx context.Context, ev approval.APIRefusedEvent, requestID string) {
	s.record(ctx, approval.Record{Event: approval.EventAPIRefused, Actor: "api", Data: ev})
	args := []any{"http_request_id", ev.HTTPReqID, "request_id", requestID, "key", ev.Key,
		"method", ev.Method, "path", ev.Path, "status", ev.Status, "code", ev.Code, "field", ev.Field,
		"reason", ev.Message, "source", ev.Source, "count", ev.Count}
	if !ev.Since.IsZero() {
		args = append(args, "since", ev.Since)
	}
	s.log.Warn("api call refused", args...)
}

// RunRefusals calls FlushRefusals every refusalWindow until ctx ends, and
// once more for every source then. It is the API's one background loop;
// it returns when ctx is done.
func (s *Server) RunRefusals(ctx context.Context) {
	tick := time.NewTicker(refusalWindow)
	defer tick.Stop()
	for {
		select {
		case <-ctx.Done():
			s.FlushRefusals(context.WithoutCancel(ctx), true)
			return
		case <-tick.C:
			s.FlushRefusals(ctx, false)
		}
	}
}
