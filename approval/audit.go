package approval

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"sync"
	"time"
)

// Event names an audit entry.
type Event string

// Audit events, in roughly the order a request meets them.
const (
	EventRunStarted     Event = "run_started"
	EventProposed       Event = "proposed"
	EventCallRefused    Event = "call_refused" // unknown tool, bad JSON, schema violation: never executed
	EventAssessed       Event = "assessed"
	EventAutoApproved   Event = "auto_approved"
	EventRemembered     Event = "remembered"    // ask-once memory let an identical call through
	EventGranted        Event = "grant_created" // an approver pre-authorised similar calls
	EventGrantRevoked   Event = "grant_revoked"
	EventPreauthorized  Event = "preauthorized" // a call ran under a grant, without a card
	EventRequested      Event = "requested"
	EventCardPosted     Event = "card_posted"
	EventApprovalVote   Event = "approval_counted" // one approval toward a quorum
	EventDecided        Event = "decided"
	EventDecisionRefuse Event = "decision_refused" // a click that changed nothing, with why
	EventExpired        Event = "expired"
	EventCancelled      Event = "cancelled"
	EventReminded       Event = "reminded"
	EventEscalated      Event = "escalated"
	EventExecuting      Event = "executing"
	EventExecuted       Event = "executed"
	EventFailed         Event = "failed"
	EventOutcomeUnknown Event = "outcome_unknown"
	EventLost           Event = "lost"            // the request's record vanished from the store; nothing ran
	EventAbandoned      Event = "abandoned"       // approved, but nobody claimed it within its claim window; nothing ran
	EventReopened       Event = "reopened"        // approved, but the policy in force asks more approvals at its claim: pending again
	EventScheduled      Event = "scheduled"       // a review-after call's cancel window started
	EventRunNow         Event = "run_now"         // an approver ran a review-after call before its window ended
	EventWindowElapsed  Event = "window_elapsed"  // a review-after call's window ended uncancelled: it runs
	EventSampled        Event = "sampled"         // a call that ran without a human was posted for review
	EventSampleReviewed Event = "sample_reviewed" // an approver found a sampled call right
	EventMarkedWrong    Event = "marked_wrong"    // an approver marked a final request wrong (an eval case)
	EventRunFinished    Event = "run_finished"
	EventAPIRefused     Event = "api_refused"       // an HTTP API call refused (no key, out of scope, bad input, rate limit)
	EventWebhookSent    Event = "webhook_delivered" // a final decision delivered to a webhook endpoint
	EventWebhookFailed  Event = "webhook_failed"    // a webhook attempt failed (GaveUp on the last)

	// Step-up votes (approval/stepup.go).
	EventStepUpOffered   Event = "step_up_offered"            // a vote waits for its confirmation: a link was sent
	EventStepUpVerified  Event = "step_up_verified"           // a vote was confirmed (passkey, single sign-on) and decided
	EventStepUpRefused   Event = "step_up_refused"            // a confirmation failed: nothing counted
	EventPasskeyOffered  Event = "passkey_enrollment_offered" // an enrollment link was given
	EventPasskeyEnrolled Event = "passkey_enrolled"
	EventPasskeyRefused  Event = "passkey_enrollment_refused"
	EventPasskeyRevoked  Event = "passkey_revoked"
)

// Record is what a component asks to be audited. Data is marshalled to JSON
// and redacted before it reaches the stream.
type Record struct {
	Event     Event
	RequestID string
	RunID     string
	Actor     string
	Tool      string
	Data      any
	// Secret lists argument property names whose values must be redacted
	// wherever they appear in Data (schema properties marked secret).
	Secret []string
	// TraceID is the trace (W3C, 32 hex digits) of the run the entry
	// belongs to, "" when traces are off or the entry has none.
	TraceID string
}

// Entry is one audit stream entry as stored. Hash = SHA-256(PrevHash ‖
// Canonical()).
type Entry struct {
	// ID is the stream entry id assigned by the store (not hashed).
	ID        string          `json:"id,omitempty"`
	Seq       int64           `json:"seq"`
	Time      time.Time       `json:"time"`
	Event     Event           `json:"event"`
	RequestID string          `json:"request_id,omitempty"`
	RunID     string          `json:"run_id,omitempty"`
	Actor     string          `json:"actor,omitempty"`
	Tool      string          `json:"tool,omitempty"`
	Data      json.RawMessage `json:"data,omitempty"`
	// TraceID links the entry to its run's trace (see Record.TraceID).
	TraceID  string `json:"trace_id,omitempty"`
	PrevHash string `json:"prev_hash"`
	Hash     string `json:"hash"`
}

// Canonical is the byte form of e that the chain hashes: the fields in a
// fixed order, time in RFC 3339 with nanoseconds (UTC), data canonicalised.
// The string fields are quoted (Go syntax) so that no text in one field can
// pass for a field boundary: moving a newline from Actor into Tool changes
// the hash. A trace id, when there is one, follows the data on a line of
// its own (canonical JSON has no raw line breaks), so entries written
// before trace ids existed hash as they always did.
func (e Entry) Canonical() []byte { return e.appendCanonical(nil) }

// appendCanonical appends Canonical() to b.
func (e Entry) appendCanonical(b []byte) []byte {
	b = strconv.AppendInt(b, e.Seq, 10)
	b = append(b, '\n')
	b = e.Time.UTC().AppendFormat(b, time.RFC3339Nano)
	b = fmt.Appendf(b, "\n%q\n%q\n%q\n%q\n%q\n", string(e.Event), e.RequestID, e.RunID, e.Actor, e.Tool)
	if c, err := appendCanonicalJSON(b, e.Data); err == nil {
		b = c
	} else {
		b = append(b, e.Data...) // hash what is stored; the verifier recomputes the same way
	}
	if e.TraceID != "" {
		b = fmt.Appendf(b, "\ntrace_id %q", e.TraceID)
	}
	return b
}

// hashBufs holds the buffers ChainHash builds canonical forms in: nothing
// keeps one after it is hashed, so the next hash reuses it.
var hashBufs = sync.Pool{New: func() any { return new([]byte) }}

// maxHashBuf is the largest buffer hashBufs keeps: a rare large entry's
// is left to the collector.
const maxHashBuf = 64 << 10

// ChainHash returns the hash of e chained to prev: SHA-256(prev ‖
// e.Canonical()), hashed in one piece from a reused buffer.
func ChainHash(prev string, e Entry) string {
	bp := hashBufs.Get().(*[]byte)
	b := e.appendCanonical(append((*bp)[:0], prev...))
	sum := sha256.Sum256(b)
	if cap(b) <= maxHashBuf {
		*bp = b
		hashBufs.Put(bp)
	}
	var h [2 * sha256.Size]byte
	hex.Encode(h[:], sum[:])
	return string(h[:])
}

// ChainError names the first entry where an audit chain breaks.
type ChainError struct {
	Index int    // position in the stream, from 0
	ID    string // stream entry id
	Seq   int64
	Why   string
}

// Error says where the chain breaks and why.
func (e *ChainError) Error() string {
	return fmt.Sprintf("audit chain broken at entry %d (id %s, seq %d): %s", e.Index, e.ID, e.Seq, e.Why)
}

// ChainVerifier checks entries one at a time, in stream order, so that a
// stream of any size can be verified page by page.
type ChainVerifier struct {
	n        int
	prevHash string
	prevSeq  int64
}

// Next checks e against the entries seen so far. It returns a *ChainError
// for an edited, deleted, inserted or reordered entry.
func (v *ChainVerifier) Next(e Entry) error {
	idx := v.n
	v.n++
	fail := func(why string) error { return &ChainError{Index: idx, ID: e.ID, Seq: e.Seq, Why: why} }
	if idx == 0 {
		// A stream trimmed by MAXLEN starts part-way through the chain, so the
		// first entry may have any seq >= 1; it must then carry a prev hash.
		switch {
		case e.Seq < 1:
			return fail(fmt.Sprintf("first entry has seq %d", e.Seq))
		case e.Seq != 1 && e.PrevHash == "":
			return fail(fmt.Sprintf("first entry has seq %d and no previous hash", e.Seq))
		case e.Seq == 1 && e.PrevHash != "":
			return fail("entry with seq 1 has a previous hash")
		}
	} else {
		if e.Seq != v.prevSeq+1 {
			return fail(fmt.Sprintf("sequence %d follows %d (entry missing or reordered)", e.Seq, v.prevSeq))
		}
		if e.PrevHash != v.prevHash {
			return fail("prev_hash does not match the previous entry's hash")
		}
	}
	if got := ChainHash(e.PrevHash, e); got != e.Hash {
		return fail("hash does not match the entry's content (entry edited)")
	}
	v.prevHash, v.prevSeq = e.Hash, e.Seq
	return nil
}

// Checked is the number of entries verified so far.
func (v *ChainVerifier) Checked() int { return v.n }
