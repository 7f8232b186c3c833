// Package auditreport holds the pure readers over audit entries behind
// `countersign audit` and the audit web view: they take entries one at a
// time (as the stream is paged) and build lines, request stories, export
// records and statistics. Nothing here talks to Redis; it imports only the
// standard library and approval.
package auditreport

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
)

// Clean makes untrusted text (model output, arguments, Slack text) safe for
// a terminal: control characters (escape sequences, newlines) become
// visible escapes, after s is cut to max characters by clip.Runes (its
// marker included; 0 = no limit).
func Clean(s string, max int) string {
	if max > 0 {
		s = clip.Runes(s, max)
	}
	var b strings.Builder
	for _, r := range s {
		switch {
		case r == '\n':
			b.WriteString(`\n`)
		case r == '\t':
			b.WriteString(" ")
		case r == utf8.RuneError || unicode.IsControl(r) || unicode.Is(unicode.Bidi_Control, r):
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	return b.String()
}

// CompactJSON returns raw on one line, or "" when raw is empty or null.
func CompactJSON(raw json.RawMessage) string {
	if t := bytes.TrimSpace(raw); len(t) == 0 || string(t) == "null" {
		return ""
	}
	var b bytes.Buffer
	if err := json.Compact(&b, raw); err != nil {
		return string(raw)
	}
	return b.String()
}

// ResultText renders a result that may be a JSON string or any JSON value.
func ResultText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return CompactJSON(raw)
}

// shortID keeps the first n characters of a digest.
func shortID(s string, n int) string {
	if len(s) > n {
		return s[:n]
	}
	return s
}

// FormatTime is the time format of every table and line.
func FormatTime(t time.Time) string { return t.UTC().Format("2006-01-02T15:04:05.000Z") }

// FormatStamp renders a time written as RFC 3339 text in the data (deadline,
// created) like every other time of the CLI; other text is shown cleaned.
func FormatStamp(s string) string {
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return FormatTime(t)
	}
	return Clean(s, 40)
}

// Summarize is the short data column of `audit tail`: the fields that
// matter for the event, on one line. Data of an unknown event (or of an
// unexpected shape) is shown as compact JSON, cut short.
func Summarize(e approval.Entry) string {
	d := ParseEventData(e)
	var parts []string
	Add := func(k, v string) {
		if v != "" {
			parts = append(parts, k+"="+v)
		}
	}
	quote := func(s string) string {
		if s == "" {
			return ""
		}
		return strconv.Quote(Clean(s, 60))
	}
	signals := func(ss []approval.Signal) string {
		var codes []string
		for _, s := range ss {
			codes = append(codes, s.Code)
		}
		return strings.Join(codes, ",")
	}
	// typed holds fields only a few events carry.
	typed := approval.DecodeEvent(e)
	known := true
	switch e.Event {
	case approval.EventRunStarted:
		if v, ok := typed.(*approval.RunStartedEvent); ok {
			Add("task", quote(v.Text))
		}
	case approval.EventProposed:
		Add("args", Clean(CompactJSON(d.Args), 60))
		if d.Confidence != nil {
			Add("confidence", strconv.FormatFloat(*d.Confidence, 'f', -1, 64))
		}
	case approval.EventAssessed:
		if v, ok := typed.(*approval.AssessedEvent); ok {
			Add("needs_human", strconv.FormatBool(v.NeedsHuman))
		}
		Add("signals", signals(d.Signals))
	case approval.EventAutoApproved:
	case approval.EventRemembered:
		Add("digest", shortID(d.Digest, 12))
	case approval.EventPreauthorized:
		Add("grant", d.GrantID)
		Add("granted_by", d.GrantedBy)
	case approval.EventGranted:
		Add("grant", d.GrantID)
		Add("expires", FormatStamp(d.Expires))
	case approval.EventGrantRevoked:
		Add("grant", d.GrantID)
	case approval.EventCallRefused:
		Add("error", quote(d.Error))
	case approval.EventRequested:
		Add("digest", shortID(d.Digest, 12))
		Add("signals", signals(d.Signals))
		if d.Quorum > 1 {
			Add("quorum", strconv.Itoa(d.Quorum))
		}
		if d.Deadline != "" {
			Add("deadline", FormatStamp(d.Deadline))
		}
	case approval.EventDecided, approval.EventApprovalVote:
		Add("verdict", d.Verdict)
		Add("reason", quote(d.ReasonText()))
		if len(d.OriginalArgs) > 0 {
			Add("edited", "true")
		}
		if dt, ok := d.DecisionTime(e.Time); ok {
			Add("after", duration.Format(dt))
		}
	case approval.EventDecisionRefuse:
		Add("verdict", d.Verdict)
		Add("reason", quote(d.Reason))
		if d.Code != "" && d.Code != d.Reason {
			Add("code", d.Code)
		}
	case approval.EventExpired:
		if d.Deadline != "" {
			Add("deadline", FormatStamp(d.Deadline))
		}
		Add("reason", quote(d.Reason))
	case approval.EventCancelled:
		Add("verdict", d.Verdict)
		Add("reason", quote(d.Reason))
	case approval.EventScheduled, approval.EventWindowElapsed:
		switch v := typed.(type) {
		case *approval.ScheduledEvent:
			Add("run_at", FormatStamp(v.RunAt.UTC().Format(time.RFC3339Nano)))
		case *approval.WindowElapsedEvent:
			Add("run_at", FormatStamp(v.RunAt.UTC().Format(time.RFC3339Nano)))
		}
	case approval.EventRunNow:
		if dt, ok := d.DecisionTime(e.Time); ok {
			Add("after", duration.Format(dt))
		}
	case approval.EventSampled:
		Add("status", d.Status)
		Add("result", quote(ResultText(d.Result)))
	case approval.EventSampleReviewed, approval.EventMarkedWrong:
		Add("status", d.Status)
		Add("verdict", d.Verdict)
		Add("decided_by", d.DecidedBy)
		Add("reason", quote(d.Reason))
	case approval.EventReminded:
		if v, ok := typed.(*approval.RemindedEvent); ok && v.N > 0 {
			Add("n", strconv.Itoa(v.N))
		}
		if d.Deadline != "" {
			Add("deadline", FormatStamp(d.Deadline))
		}
	case approval.EventEscalated:
		if v, ok := typed.(*approval.EscalatedEvent); ok {
			if to, err := json.Marshal(v.To); err == nil {
				Add("to", Clean(CompactJSON(to), 60))
			}
			if v.Widened {
				Add("widened", "true")
			}
		}
	case approval.EventExecuting:
		if v, ok := typed.(*approval.ExecutingEvent); ok && v.Retry {
			Add("retry", "true")
		}
	case approval.EventExecuted, approval.EventFailed:
		if d.DurationMS != nil {
			Add("duration", duration.Format(msDuration(*d.DurationMS)))
		}
		Add("error", quote(d.Error))
		Add("result", quote(ResultText(d.Result)))
	case approval.EventOutcomeUnknown:
	case approval.EventAbandoned:
		if v, ok := typed.(*approval.AbandonedEvent); ok {
			Add("approved_by", v.Approver)
			Add("claim_window", duration.Format(time.Duration(v.ClaimWindowMS)*time.Millisecond))
			Add("caller", v.Caller)
		}
	case approval.EventCardPosted:
		Add("channel", d.Channel)
		Add("ts", d.TS)
	case approval.EventRunFinished:
		v, ok := typed.(*approval.RunFinishedEvent)
		if !ok {
			break
		}
		Add("status", Clean(string(v.Status), 20))
		r := v.Result
		for _, c := range []struct {
			k string
			n int
		}{{"auto", r.AutoRun}, {"preauthorized", r.Preauthorized}, {"approved", r.Approved}, {"edited", r.Edited}, {"rejected", r.Rejected},
			{"responded", r.Responded}, {"expired", r.Expired}, {"denied", r.Denied}, {"refused", r.Refused}} {
			if c.n > 0 {
				Add(c.k, strconv.Itoa(c.n))
			}
		}
	default:
		known = false
	}
	if len(parts) > 0 || known {
		return strings.Join(parts, " ")
	}
	return Clean(CompactJSON(e.Data), 100)
}

// msDuration converts fractional milliseconds.
func msDuration(ms float64) time.Duration { return time.Duration(ms * float64(time.Millisecond)) }

// Column widths of a tail line. Longer values are cut (with "…") so the
// columns stay aligned; --json has them whole.
const (
	TailSubjectWidth = 30 // request ids are "req_" + 26 characters
	TailToolWidth    = 16
	TailActorWidth   = 16 // Slack user ids; process owners ("host/agent_…") are cut
)

// TailLine is one line of `audit tail`: time, seq, event, request id (the
// run id for run-level entries), tool, actor, short data.
func TailLine(e approval.Entry) string {
	col := func(s string, width int) string {
		if s == "" {
			return "-"
		}
		return Clean(s, width-1)
	}
	subject := e.RequestID
	if subject == "" {
		subject = e.RunID
	}
	return strings.TrimRight(fmt.Sprintf("%s %6d  %-16s %-*s %-*s %-*s %s",
		FormatTime(e.Time), e.Seq, e.Event,
		TailSubjectWidth, col(subject, TailSubjectWidth+1),
		TailToolWidth, col(e.Tool, TailToolWidth),
		TailActorWidth, col(e.Actor, TailActorWidth),
		Summarize(e)), " ")
}

// Click is one button press on a card, counted or not.
type Click struct {
	At      time.Time `json:"at"`
	Actor   string    `json:"actor"`
	Verdict string    `json:"verdict,omitempty"`
	// Result is "counted" (one vote toward a quorum), "decided" (the final
	// decision) or "refused".
	Result string `json:"result"`
	Reason string `json:"reason,omitempty"`
}

// ArgChange is one difference between proposed and edited arguments.
type ArgChange approval.ArgChange

// ArgDiff lists the changes from before to after, by JSON path (a.b), with
// approval.DiffArgs.
func ArgDiff(before, after json.RawMessage) []ArgChange {
	var out []ArgChange
	for _, c := range approval.DiffArgs(before, after, 0) {
		out = append(out, ArgChange(c))
	}
	return out
}

// String renders a change as "path: before → after".
func (c ArgChange) String() string {
	p := c.Path
	if p == "" {
		p = "(arguments)"
	}
	switch {
	case c.Before == nil:
		return fmt.Sprintf("%s: added %s", p, Clean(string(c.After), 200))
	case c.After == nil:
		return fmt.Sprintf("%s: removed (was %s)", p, Clean(string(c.Before), 200))
	}
	return fmt.Sprintf("%s: %s → %s", p, Clean(string(c.Before), 200), Clean(string(c.After), 200))
}

// Trail is everything the stream says about one approval request,
// accumulated entry by entry. `audit show` prints one; `audit export`
// writes one JSON line per trail.
type Trail struct {
	ID        string
	RunID     string
	Tool      string
	Requester string
	// TraceID is the trace of the run that asked, "" when its entries
	// carry none (traces off, or written before trace ids).
	TraceID string

	RequestedAt time.Time
	Requested   *EventData // data of the requested entry, nil if not seen
	Proposed    *EventData // data of the proposed entry, if any
	// Gate is how a call that never reached a human was settled: "auto"
	// (auto_approved), "remembered" or "refused" (call_refused before a
	// request was made); GateNote says why, when the entry says.
	Gate     string
	GateAt   time.Time
	GateNote string

	CardAt  time.Time
	Card    approval.CardRef
	Clicks  []Click
	Remind  []time.Time
	Escal   []time.Time
	Decided *DecidedInfo

	ExecStart time.Time
	Exec      *ExecInfo

	// Sampled is set for a call that ran without a human and was posted
	// for review (sampled); Feedback is the approver's judgement after the
	// fact (marked_wrong, sample_reviewed), a mark as wrong winning.
	Sampled  bool
	Feedback *ExportFeedback

	Entries []approval.Entry // only when keepEntries
}

// DecidedInfo is the final decision (or expiry/cancellation).
type DecidedInfo struct {
	At           time.Time
	Actor        string
	Verdict      approval.Verdict
	Reason       string
	Digest       string
	Args         json.RawMessage
	OriginalArgs json.RawMessage
	TimeToDecide time.Duration
	HasTime      bool
}

// ExecInfo is the execution outcome.
type ExecInfo struct {
	At       time.Time
	Status   string // executed, failed, unknown
	Result   string
	Error    string
	Duration time.Duration
	HasDur   bool
}

// Add folds one entry of this request into t. Entries must come in stream
// order.
func (t *Trail) Add(e approval.Entry, keepEntries bool) {
	if keepEntries {
		t.Entries = append(t.Entries, e)
	}
	if t.ID == "" {
		t.ID = e.RequestID
	}
	if t.RunID == "" {
		t.RunID = e.RunID
	}
	if t.Tool == "" {
		t.Tool = e.Tool
	}
	if t.TraceID == "" {
		t.TraceID = e.TraceID
	}
	d := ParseEventData(e)
	switch e.Event {
	case approval.EventProposed:
		t.Proposed = &d
	case approval.EventRequested:
		t.RequestedAt = e.Time
		t.Requested = &d
		if d.Requester != "" {
			t.Requester = d.Requester
		}
	case approval.EventSampled:
		// What the review card showed: the call and what came of it.
		t.RequestedAt, t.Requested, t.Sampled = e.Time, &d, true
		if d.Requester != "" {
			t.Requester = d.Requester
		}
		if t.Exec == nil {
			t.Exec = &ExecInfo{At: e.Time, Status: d.Status, Result: ResultText(d.Result)}
		}
	case approval.EventMarkedWrong, approval.EventSampleReviewed:
		wrong := e.Event == approval.EventMarkedWrong
		if t.Feedback == nil || !t.Feedback.Wrong {
			t.Feedback = &ExportFeedback{Wrong: wrong, By: e.Actor, At: e.Time, Reason: d.Reason,
				Verdict: approval.Verdict(d.Verdict), DecidedBy: d.DecidedBy}
		}
	case approval.EventRunNow, approval.EventWindowElapsed:
		v := approval.VerdictRunNow
		if e.Event == approval.EventWindowElapsed {
			v = approval.VerdictWindowElapsed
		}
		di := &DecidedInfo{At: e.Time, Actor: e.Actor, Verdict: v, Digest: d.Digest}
		di.TimeToDecide, di.HasTime = d.DecisionTime(e.Time)
		t.Decided = di
		if v == approval.VerdictRunNow {
			t.Clicks = append(t.Clicks, Click{At: e.Time, Actor: e.Actor, Verdict: string(v), Result: "decided"})
		}
	case approval.EventCardPosted:
		// The first entry is when the card went out; a later one (the same
		// card recorded again) changes nothing.
		if t.CardAt.IsZero() {
			t.CardAt = e.Time
			t.Card = approval.CardRef{Channel: d.Channel, TS: d.TS}
		}
	case approval.EventAutoApproved:
		t.Gate, t.GateAt = "auto", e.Time
	case approval.EventRemembered:
		t.Gate, t.GateAt, t.GateNote = "remembered", e.Time, "an identical call was approved recently (ask-once)"
	case approval.EventPreauthorized:
		t.Gate, t.GateAt, t.GateNote = "preauthorized", e.Time, fmt.Sprintf("pre-authorised by %s (grant %s, until %s)", d.GrantedBy, d.GrantID, FormatStamp(d.Expires))
	case approval.EventCallRefused:
		if t.Requested == nil {
			t.Gate, t.GateAt, t.GateNote = "refused", e.Time, d.Error
		} else if t.Exec == nil {
			// Approved, but refused before running (an invalid edit).
			t.Exec = &ExecInfo{At: e.Time, Status: "refused", Error: d.Error}
		}
	case approval.EventApprovalVote:
		t.Clicks = append(t.Clicks, Click{At: e.Time, Actor: e.Actor, Verdict: orDefault(d.Verdict, "approve"), Result: "counted", Reason: d.ReasonText()})
	case approval.EventDecisionRefuse:
		why := d.Reason
		if d.Code != "" && d.Code != why {
			why = strings.TrimSpace(d.Code + ": " + why)
		}
		t.Clicks = append(t.Clicks, Click{At: e.Time, Actor: e.Actor, Verdict: d.Verdict, Result: "refused", Reason: why})
	case approval.EventDecided:
		v := approval.Verdict(d.Verdict)
		di := &DecidedInfo{At: e.Time, Actor: e.Actor, Verdict: v, Reason: d.ReasonText(),
			Digest: d.Digest, Args: d.Args, OriginalArgs: d.OriginalArgs}
		di.TimeToDecide, di.HasTime = d.DecisionTime(e.Time)
		if !di.HasTime && !t.RequestedAt.IsZero() {
			di.TimeToDecide, di.HasTime = e.Time.Sub(t.RequestedAt), true
		}
		t.Decided = di
		if v.Human() {
			t.Clicks = append(t.Clicks, Click{At: e.Time, Actor: e.Actor, Verdict: d.Verdict, Result: "decided", Reason: d.ReasonText()})
		}
	case approval.EventCancelled:
		if t.Decided == nil && d.Verdict == string(approval.VerdictCancel) {
			// An approver cancelled a call in its cancel window.
			di := &DecidedInfo{At: e.Time, Actor: e.Actor, Verdict: approval.VerdictCancel, Reason: d.ReasonText(), Digest: d.Digest}
			di.TimeToDecide, di.HasTime = d.DecisionTime(e.Time)
			t.Decided = di
			t.Clicks = append(t.Clicks, Click{At: e.Time, Actor: e.Actor, Verdict: d.Verdict, Result: "decided", Reason: d.ReasonText()})
			return
		}
		fallthrough
	case approval.EventExpired:
		if t.Decided == nil {
			v := approval.VerdictExpire
			if e.Event == approval.EventCancelled {
				v = approval.VerdictCancel
			}
			t.Decided = &DecidedInfo{At: e.Time, Actor: e.Actor, Verdict: v, Reason: d.ReasonText()}
			if !t.RequestedAt.IsZero() {
				t.Decided.TimeToDecide, t.Decided.HasTime = e.Time.Sub(t.RequestedAt), true
			}
		}
	case approval.EventReminded:
		t.Remind = append(t.Remind, e.Time)
	case approval.EventEscalated:
		t.Escal = append(t.Escal, e.Time)
	case approval.EventExecuting:
		t.ExecStart = e.Time
	case approval.EventAbandoned:
		// Approved, but its caller never claimed it: nothing ran.
		t.Exec = &ExecInfo{At: e.Time, Status: "abandoned", Result: "the caller had gone; nothing ran"}
	case approval.EventExecuted, approval.EventFailed, approval.EventOutcomeUnknown:
		x := &ExecInfo{At: e.Time, Status: map[approval.Event]string{
			approval.EventExecuted: "executed", approval.EventFailed: "failed", approval.EventOutcomeUnknown: "unknown",
		}[e.Event], Result: ResultText(d.Result), Error: d.Error}
		if d.DurationMS != nil {
			x.Duration, x.HasDur = msDuration(*d.DurationMS), true
		} else if !t.ExecStart.IsZero() {
			x.Duration, x.HasDur = e.Time.Sub(t.ExecStart), true
		}
		t.Exec = x
	}
}

// RefusalWords explains the refusal codes the bot records.
var RefusalWords = map[string]string{
	"self_approval":       "the requester may not approve their own request",
	"not_approver":        "not an approver for this tool",
	"already_voted":       "already voted",
	"already_decided":     "the request was already decided",
	"expired":             "the deadline had passed",
	"stale_args":          "the arguments changed since the card was drawn",
	"verdict_not_allowed": "that decision is not allowed for this tool",
	"invalid_args":        "the edited arguments are invalid",
	"denied":              "a deny rule refuses the edited arguments",
	"unknown_tool":        "the tool is no longer in the policy",
	"not_found":           "no such request",
	"already_marked":      "the request was already marked wrong (or reviewed)",
	"not_final":           "the request was not settled by a person or a sample",
	"internal_error":      "Countersign failed; see the logs",
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

// ModelReason is the model's stated reason and confidence: from the
// requested entry, else from the proposed one.
func (t *Trail) ModelReason() (string, *float64) {
	var reason string
	var conf *float64
	for _, d := range []*EventData{t.Requested, t.Proposed} {
		if d == nil {
			continue
		}
		if reason == "" {
			reason = d.Reason
		}
		if conf == nil {
			conf = d.Confidence
		}
	}
	return reason, conf
}

// BeforeEdit is the arguments an edit replaced: original_args from the
// decision, else the arguments of the request.
func (t *Trail) BeforeEdit() json.RawMessage {
	if t.Decided == nil || t.Decided.Verdict != approval.VerdictEdit {
		return nil
	}
	if len(t.Decided.OriginalArgs) > 0 {
		return t.Decided.OriginalArgs
	}
	if t.Requested != nil {
		return t.Requested.Args
	}
	return nil
}

// Outcome names how the request ended: approved, edited, rejected,
// responded, expired, cancelled, or pending.
func (t *Trail) Outcome() string {
	if t.Sampled {
		return "sampled"
	}
	if t.Decided == nil {
		if t.Requested == nil && t.Gate != "" {
			return t.Gate
		}
		return "pending"
	}
	return OutcomeOf(t.Decided.Verdict)
}

// Changes is the edit diff, nil when the arguments were not edited.
func (t *Trail) Changes() []ArgChange {
	before := t.BeforeEdit()
	if len(before) == 0 || len(t.Decided.Args) == 0 {
		return nil
	}
	return ArgDiff(before, t.Decided.Args)
}

// Row is one line of a request's story: a label and its text, cleaned of
// control characters and cut to length. Args is set on the rows that show
// arguments (and on a result that is a JSON object), for readers that
// render them as fields rather than JSON.
type Row struct {
	Key   string
	Value string
	Args  json.RawMessage
}

// WriteStory prints the whole story of one request for people: its Rows
// as a table, then its entries (when kept) one line each.
func WriteStory(w io.Writer, t *Trail) error {
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
	for _, r := range t.Rows() {
		fmt.Fprintf(tw, "%s\t%s\n", r.Key, r.Value)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(t.Entries) > 0 {
		fmt.Fprintf(w, "\nentries (%d):\n", len(t.Entries))
		for _, e := range t.Entries {
			if _, err := fmt.Fprintln(w, "  "+TailLine(e)); err != nil {
				return err
			}
		}
	}
	return nil
}

// Rows is the story of one request, in the order `countersign audit show`
// prints it: the proposal, what the approver was shown (preview, signals,
// choices, deadline), the model's stated reason, the card, reminders,
// clicks and votes, the decision, the execution and the timings.
func (t *Trail) Rows() []Row {
	var rows []Row
	row := func(k, format string, a ...any) { rows = append(rows, Row{Key: k, Value: fmt.Sprintf(format, a...)}) }
	argsRow := func(k string, args json.RawMessage) {
		row(k, "%s", Clean(CompactJSON(args), 500))
		rows[len(rows)-1].Args = args
	}
	row("request", "%s", t.ID)
	row("tool", "%s", Clean(t.Tool, 80))
	if t.RunID != "" {
		row("run", "%s", t.RunID)
	}
	row("outcome", "%s", t.Outcome())
	if r := t.Requested; r != nil {
		row("requested", "%s by %s", FormatTime(t.RequestedAt), orDefault(Clean(t.Requester, 40), "-"))
		argsRow("arguments", r.Args)
		row("digest", "%s", r.Digest)
		previewErr := r.PreviewError
		if p := r.Preview; p != nil {
			if previewErr == "" {
				previewErr = p.Error
			}
			if p.Summary != "" || len(p.Facts) > 0 {
				row("preview", "%s", orDefault(Clean(p.Summary, 300), "(facts only)"))
			}
			for _, f := range p.Facts {
				row("  fact", "%s: %s", Clean(f.Label, 60), Clean(f.Value, 200))
			}
			if p.Source != "" && (p.Summary != "" || len(p.Facts) > 0) {
				row("  source", "%s", Clean(p.Source, 100))
			}
		}
		if previewErr != "" {
			row("preview error", "%s", Clean(previewErr, 200))
		}
		for _, s := range r.Signals {
			row("signal", "%s — %s", Clean(s.Code, 40), Clean(s.Text, 200))
		}
		if len(r.Decisions) > 0 {
			row("choices", "%s", strings.Join(r.Decisions, ", "))
		}
		if r.Quorum > 0 {
			row("quorum", "%d", r.Quorum)
		}
		if r.Deadline != "" {
			row("deadline", "%s", FormatStamp(r.Deadline))
		}
		reason, conf := t.ModelReason()
		if reason != "" {
			row("model's reason", "%q (unverified, written by the model)", Clean(reason, 300))
		}
		if conf != nil {
			row("model's confidence", "%.2f (self-reported)", *conf)
		}
	} else if t.Gate != "" {
		// No human was asked: show what the model proposed and how the
		// gate settled it.
		if t.Proposed != nil {
			row("proposed", "%s by %s", FormatTime(t.GateAt), orDefault(Clean(t.Requester, 40), "-"))
			argsRow("arguments", t.Proposed.Args)
		}
		gate := map[string]string{"auto": "run without asking anyone (the policy needs no human for it)",
			"remembered": "run without asking anyone", "preauthorized": "run without a card, under an approver's pre-authorisation",
			"refused": "refused before anyone was asked; never executed"}[t.Gate]
		row("gate", "%s at %s", gate, FormatTime(t.GateAt))
		if t.GateNote != "" {
			row("  why", "%s", Clean(t.GateNote, 300))
		}
		reason, conf := t.ModelReason()
		if reason != "" {
			row("model's reason", "%q (unverified, written by the model)", Clean(reason, 300))
		}
		if conf != nil {
			row("model's confidence", "%.2f (self-reported)", *conf)
		}
	} else {
		row("requested", "(no requested entry found: trimmed from the stream?)")
	}
	if !t.CardAt.IsZero() {
		row("card", "posted %s to %s (ts %s)", FormatTime(t.CardAt), orDefault(t.Card.Channel, "?"), orDefault(t.Card.TS, "?"))
	}
	for _, at := range t.Remind {
		row("reminded", "%s", FormatTime(at))
	}
	for _, at := range t.Escal {
		row("escalated", "%s", FormatTime(at))
	}
	for _, c := range t.Clicks {
		detail := c.Result
		if c.Reason != "" {
			if c.Result == "refused" {
				detail += ": " + Clean(c.Reason, 200)
				if why := RefusalWords[c.Reason]; why != "" {
					detail += " (" + why + ")"
				}
			} else {
				detail += fmt.Sprintf(" (%q)", Clean(c.Reason, 200))
			}
		}
		row("click", "%s %s %s — %s", FormatTime(c.At), orDefault(Clean(c.Actor, 40), "-"), orDefault(c.Verdict, "?"), detail)
	}
	if d := t.Decided; d != nil {
		by := ""
		if d.Actor != "" {
			by = " by " + Clean(d.Actor, 40)
		}
		switch d.Verdict {
		case approval.VerdictExpire:
			dl := ""
			if t.Requested != nil && t.Requested.Deadline != "" {
				dl = " (deadline " + FormatStamp(t.Requested.Deadline) + "): a rejection, nothing ran"
			}
			row("decision", "expired at %s%s", FormatTime(d.At), dl)
		case approval.VerdictCancel:
			row("decision", "cancelled%s at %s: nothing ran", by, FormatTime(d.At))
		case approval.VerdictWindowElapsed:
			row("decision", "the cancel window ended at %s with no cancel: it ran", FormatTime(d.At))
		case approval.VerdictRunNow:
			row("decision", "run now%s at %s, before its cancel window ended", by, FormatTime(d.At))
		default:
			row("decision", "%s%s at %s", d.Verdict, by, FormatTime(d.At))
		}
		if d.Reason != "" {
			row("  reason", "%q", Clean(d.Reason, 500))
		}
		if d.Digest != "" && t.Requested != nil && d.Digest != t.Requested.Digest && d.Verdict != approval.VerdictEdit {
			row("  digest", "%s (differs from the request's %s)", d.Digest, t.Requested.Digest)
		}
		for _, c := range t.Changes() {
			row("  edit", "%s", c)
		}
		if d.Verdict == approval.VerdictEdit && len(d.Args) > 0 {
			argsRow("  edited args", d.Args)
		}
	}
	if t.Sampled {
		row("review", "ran without a human and was sampled for review")
	}
	if f := t.Feedback; f != nil {
		if f.Wrong {
			row("feedback", "marked wrong by %s at %s", orDefault(Clean(f.By, 40), "-"), FormatTime(f.At))
			row("  why", "%q", Clean(f.Reason, 500))
		} else {
			row("feedback", "looks right to %s at %s", orDefault(Clean(f.By, 40), "-"), FormatTime(f.At))
		}
	}
	if x := t.Exec; x != nil {
		s := fmt.Sprintf("%s at %s", x.Status, FormatTime(x.At))
		if x.HasDur {
			s += " in " + duration.Format(x.Duration)
		}
		row("execution", "%s", s)
		if x.Error != "" {
			row("  error", "%s", Clean(x.Error, 500))
		}
		if x.Result != "" {
			row("  result", "%s", Clean(x.Result, 500))
			if r := strings.TrimSpace(x.Result); strings.HasPrefix(r, "{") && json.Valid([]byte(r)) {
				rows[len(rows)-1].Args = json.RawMessage(r)
			}
		}
	}
	var timings []string
	if d := t.Decided; d != nil && d.HasTime {
		label := "to decision "
		switch d.Verdict {
		case approval.VerdictExpire:
			label = "to expiry "
		case approval.VerdictCancel:
			label = "to cancellation "
		}
		timings = append(timings, label+duration.Format(d.TimeToDecide))
	}
	if x := t.Exec; x != nil && x.HasDur {
		timings = append(timings, "to execute "+duration.Format(x.Duration))
	}
	if x := t.Exec; x != nil && !t.RequestedAt.IsZero() {
		timings = append(timings, "request to result "+duration.Format(x.At.Sub(t.RequestedAt)))
	}
	if len(timings) > 0 {
		row("timings", "%s", strings.Join(timings, "; "))
	}
	return rows
}

// Story is `audit show --json`.
type Story struct {
	ExportRecord
	Reminded  []time.Time      `json:"reminded,omitempty"`
	Escalated []time.Time      `json:"escalated,omitempty"`
	Entries   []approval.Entry `json:"entries"`
}

// ExportRecord is one line of `audit export`: a request as an eval case.
type ExportRecord struct {
	RequestID   string     `json:"request_id"`
	RunID       string     `json:"run_id,omitempty"`
	TraceID     string     `json:"trace_id,omitempty"`
	Tool        string     `json:"tool"`
	Requester   string     `json:"requester,omitempty"`
	Outcome     string     `json:"outcome"`
	RequestedAt *time.Time `json:"requested_at,omitempty"`
	DecidedAt   *time.Time `json:"decided_at,omitempty"`
	// Proposed is what the model asked for, as audited (secrets redacted).
	Proposed ExportProposed `json:"proposed"`
	// Shown is what the approver saw on the card.
	Shown    *ExportShown    `json:"shown,omitempty"`
	Decision *ExportDecision `json:"decision,omitempty"`
	Clicks   []Click         `json:"clicks,omitempty"`
	// Execution is the tool's outcome, when it ran.
	Execution *ExportExecution `json:"execution,omitempty"`
	// Feedback is an approver's judgement after the fact: marked wrong (an
	// error that slipped through, the eval case), or a sampled call found
	// right.
	Feedback *ExportFeedback `json:"feedback,omitempty"`
}

// ExportFeedback is an approver's judgement of a request after the fact.
type ExportFeedback struct {
	Wrong  bool      `json:"wrong"`
	By     string    `json:"by"`
	At     time.Time `json:"at"`
	Reason string    `json:"reason,omitempty"`
	// Verdict and DecidedBy are the decision judged; empty for a sampled
	// call, which nobody decided.
	Verdict   approval.Verdict `json:"verdict,omitempty"`
	DecidedBy string           `json:"decided_by,omitempty"`
}

// ExportProposed is what the model asked for.
type ExportProposed struct {
	Args        json.RawMessage `json:"args,omitempty"`
	Digest      string          `json:"digest,omitempty"`
	ModelReason string          `json:"model_reason,omitempty"`
	Confidence  *float64        `json:"confidence,omitempty"`
}

// ExportShown is what the approver saw on the card.
type ExportShown struct {
	Digest       string            `json:"digest,omitempty"`
	Preview      *approval.Preview `json:"preview,omitempty"`
	PreviewError string            `json:"preview_error,omitempty"`
	Signals      []approval.Signal `json:"signals,omitempty"`
	Decisions    []string          `json:"decisions,omitempty"`
	Quorum       int               `json:"quorum,omitempty"`
	Deadline     string            `json:"deadline,omitempty"`
	CardAt       *time.Time        `json:"card_posted_at,omitempty"`
}

// ExportDecision is the final decision of a request.
type ExportDecision struct {
	Verdict        approval.Verdict `json:"verdict"`
	Approver       string           `json:"approver,omitempty"`
	Reason         string           `json:"reason,omitempty"`
	Digest         string           `json:"digest,omitempty"`
	Args           json.RawMessage  `json:"args,omitempty"`
	OriginalArgs   json.RawMessage  `json:"original_args,omitempty"`
	Changes        []ArgChange      `json:"changes,omitempty"`
	TimeToDecideMS *int64           `json:"time_to_decide_ms,omitempty"`
}

// ExportExecution is the outcome of running the tool.
type ExportExecution struct {
	Status     string `json:"status"`
	Result     string `json:"result,omitempty"`
	Error      string `json:"error,omitempty"`
	DurationMS *int64 `json:"duration_ms,omitempty"`
}

// ExportRecord turns t into its export form.
func (t *Trail) ExportRecord() ExportRecord {
	r := ExportRecord{RequestID: t.ID, RunID: t.RunID, TraceID: t.TraceID, Tool: t.Tool, Requester: t.Requester,
		Outcome: t.Outcome(), Clicks: t.Clicks, Feedback: t.Feedback}
	if !t.RequestedAt.IsZero() {
		at := t.RequestedAt
		r.RequestedAt = &at
	}
	if q := t.Requested; q != nil {
		r.Proposed = ExportProposed{Args: q.Args, Digest: q.Digest}
		r.Shown = &ExportShown{Digest: q.Digest, Preview: q.Preview, PreviewError: q.PreviewError, Signals: q.Signals,
			Decisions: q.Decisions, Quorum: q.Quorum, Deadline: q.Deadline}
		if !t.CardAt.IsZero() {
			at := t.CardAt
			r.Shown.CardAt = &at
		}
	}
	r.Proposed.ModelReason, r.Proposed.Confidence = t.ModelReason()
	if d := t.Decided; d != nil {
		at := d.At
		r.DecidedAt = &at
		r.Decision = &ExportDecision{Verdict: d.Verdict, Approver: d.Actor, Reason: d.Reason, Digest: d.Digest,
			Args: d.Args, OriginalArgs: t.BeforeEdit(), Changes: t.Changes()}
		if d.HasTime {
			ms := d.TimeToDecide.Milliseconds()
			r.Decision.TimeToDecideMS = &ms
		}
		if len(r.Proposed.Args) == 0 && len(d.OriginalArgs) > 0 {
			r.Proposed.Args = d.OriginalArgs
		}
	}
	if x := t.Exec; x != nil {
		r.Execution = &ExportExecution{Status: x.Status, Result: x.Result, Error: x.Error}
		if x.HasDur {
			ms := x.Duration.Milliseconds()
			r.Execution.DurationMS = &ms
		}
	}
	return r
}

// Exporter collects the trails of requests made in the window, in order of
// their first entry. Entries of requests whose requested entry is not in
// the window are ignored: export selects requests by when they were asked.
type Exporter struct {
	trails     map[string]*Trail
	order      []string
	requesters map[string]string // run id → requester, from run_started
	// proposed holds the latest proposed entries (the model's reason and
	// confidence) until their requested entry arrives; most proposals are
	// never requested (auto-approved), so only maxProposed are kept.
	proposed      map[string]approval.Entry
	proposedOrder []string
}

// maxProposed bounds exporter.proposed. A requested entry follows its
// proposed entry within the same batch of tool calls.
const maxProposed = 1024

// NewExporter returns an empty Exporter.
func NewExporter() *Exporter {
	return &Exporter{trails: map[string]*Trail{}, requesters: map[string]string{}, proposed: map[string]approval.Entry{}}
}

// Add folds one entry in.
func (x *Exporter) Add(e approval.Entry) {
	if e.Event == approval.EventRunStarted && e.RunID != "" && e.Actor != "" {
		x.requesters[e.RunID] = e.Actor
	}
	if e.RequestID == "" {
		return
	}
	t, ok := x.trails[e.RequestID]
	if !ok {
		switch e.Event {
		case approval.EventProposed:
			if len(x.proposedOrder) >= maxProposed {
				delete(x.proposed, x.proposedOrder[0])
				x.proposedOrder = x.proposedOrder[1:]
			}
			x.proposed[e.RequestID] = e
			x.proposedOrder = append(x.proposedOrder, e.RequestID)
			return
		case approval.EventRequested, approval.EventSampled:
		default:
			return
		}
		t = &Trail{}
		x.trails[e.RequestID] = t
		x.order = append(x.order, e.RequestID)
		if p, ok := x.proposed[e.RequestID]; ok {
			t.Add(p, false)
			delete(x.proposed, e.RequestID) // its slot in proposedOrder ages out
		}
	}
	t.Add(e, false)
}

// Records returns the export records whose outcome is in only (all when
// only is empty), in request order.
func (x *Exporter) Records(only map[string]bool) []ExportRecord {
	var out []ExportRecord
	for _, id := range x.order {
		t := x.trails[id]
		if t.Requester == "" {
			t.Requester = x.requesters[t.RunID]
		}
		r := t.ExportRecord()
		wrong := r.Feedback != nil && r.Feedback.Wrong
		if len(only) > 0 && !only[r.Outcome] && !(only[OnlyMarkedWrong] && wrong) {
			continue
		}
		out = append(out, r)
	}
	return out
}

// OnlyMarkedWrong selects, in --only, the requests an approver marked
// wrong, whatever their outcome.
const OnlyMarkedWrong = "marked_wrong"

// ParseOnly reads --only: a comma-separated list of outcomes; verbs
// (approve, edit, reject, respond, expire, cancel) are accepted too.
func ParseOnly(s string) (map[string]bool, error) {
	if strings.TrimSpace(s) == "" {
		return nil, nil
	}
	valid := map[string]string{}
	for _, v := range []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject,
		approval.VerdictRespond, approval.VerdictExpire, approval.VerdictCancel, approval.VerdictRunNow, approval.VerdictWindowElapsed} {
		valid[string(v)] = OutcomeOf(v)
		valid[OutcomeOf(v)] = OutcomeOf(v)
	}
	valid["pending"] = "pending"
	valid["sampled"] = "sampled"
	valid[OnlyMarkedWrong], valid["wrong"] = OnlyMarkedWrong, OnlyMarkedWrong
	only := map[string]bool{}
	for _, p := range strings.Split(s, ",") {
		p = strings.ToLower(strings.TrimSpace(p))
		if p == "" {
			continue
		}
		o, ok := valid[p]
		if !ok {
			return nil, fmt.Errorf("--only: unknown outcome %q (want approved, edited, rejected, responded, expired, cancelled, pending, run_now, window_elapsed, sampled, marked_wrong)", p)
		}
		only[o] = true
	}
	return only, nil
}

// rubberStampUnder is the median time to decide under which an approver is
// flagged, and rubberStampMin the fewest decisions that make a median
// meaningful.
const (
	rubberStampUnder = 5 * time.Second
	rubberStampMin   = 3
)

// StatVerdicts are the outcomes counted by `audit stats`, in column order.
var StatVerdicts = []approval.Verdict{approval.VerdictApprove, approval.VerdictEdit, approval.VerdictReject,
	approval.VerdictRespond, approval.VerdictExpire}

// WindowVerdicts are the outcomes of review-after calls (a cancel window)
// counted by `audit stats` after StatVerdicts: run now by an approver,
// run when the window ended, cancelled by an approver. Their columns are
// shown when a row has one.
var WindowVerdicts = []approval.Verdict{approval.VerdictRunNow, approval.VerdictWindowElapsed, approval.VerdictCancel}

// StatRow is one tool's or one approver's numbers.
type StatRow struct {
	Name   string                   `json:"name"`
	Total  int                      `json:"total"`
	Counts map[approval.Verdict]int `json:"counts"`
	// Rates are Counts / Total, in [0,1].
	Rates map[approval.Verdict]float64 `json:"rates"`
	// Timed is how many decisions had a known time to decide.
	Timed       int      `json:"timed"`
	MedianSec   *float64 `json:"median_seconds,omitempty"`
	P90Sec      *float64 `json:"p90_seconds,omitempty"`
	RubberStamp bool     `json:"rubber_stamp,omitempty"`
	// MarkedWrong counts the requests marked wrong after the fact (per
	// tool: all of them; per approver: those they decided), and
	// ApprovedWrong those of them whose call ran — approved (edited, run
	// now, let run by a cancel window) or sampled — "approved then marked
	// wrong".
	MarkedWrong   int `json:"marked_wrong"`
	ApprovedWrong int `json:"approved_then_marked_wrong"`
	// Sampled counts the calls of a tool posted for review after running
	// without a human; SampledRight and SampledWrong how approvers judged
	// them (the rest were not judged).
	Sampled      int `json:"sampled,omitempty"`
	SampledRight int `json:"sampled_right,omitempty"`
	SampledWrong int `json:"sampled_wrong,omitempty"`

	// Seconds are the times to decide, sorted (for distributions; not in
	// the JSON output).
	Seconds []float64 `json:"-"`
}

// StatsReport is `audit stats` output.
type StatsReport struct {
	Since     time.Time `json:"since"`
	Until     time.Time `json:"until"`
	Entries   int       `json:"entries"`
	Tools     []StatRow `json:"tools"`
	Approvers []StatRow `json:"approvers"`
	Warnings  []string  `json:"warnings,omitempty"`
}

// StatsBuilder counts final outcomes per tool and human decisions per
// approver. A request counts once per tool (its final decision or expiry);
// an approver counts once per request they voted on or decided.
type StatsBuilder struct {
	tools     map[string]*StatRow
	approvers map[string]*StatRow
	final     map[string]bool      // request ids already counted per tool
	voted     map[[2]string]bool   // (request id, approver) already counted
	requested map[string]time.Time // request id → requested time, for decisions without timing data
	judged    map[string]bool      // request ids whose feedback is counted (a mark as wrong counts once)
	entries   int
}

// NewStatsBuilder returns an empty StatsBuilder.
func NewStatsBuilder() *StatsBuilder {
	return &StatsBuilder{tools: map[string]*StatRow{}, approvers: map[string]*StatRow{},
		final: map[string]bool{}, voted: map[[2]string]bool{}, requested: map[string]time.Time{}, judged: map[string]bool{}}
}

func rowOf(m map[string]*StatRow, name string) *StatRow {
	r, ok := m[name]
	if !ok {
		r = &StatRow{Name: name, Counts: map[approval.Verdict]int{}}
		m[name] = r
	}
	return r
}

// Add folds one entry in.
func (s *StatsBuilder) Add(e approval.Entry) {
	s.entries++
	tool := orDefault(e.Tool, "unknown")
	switch e.Event {
	case approval.EventRequested:
		s.requested[e.RequestID] = e.Time
	case approval.EventDecided, approval.EventApprovalVote:
		d := ParseEventData(e)
		v := approval.Verdict(d.Verdict)
		if e.Event == approval.EventApprovalVote && v == "" {
			v = approval.VerdictApprove
		}
		if v == approval.VerdictExpire {
			s.recordFinal(e.RequestID, tool, v, 0, false)
			return
		}
		if !v.Human() {
			return
		}
		dt, timed := d.DecisionTime(e.Time)
		if !timed {
			if at, ok := s.requested[e.RequestID]; ok && !e.Time.Before(at) {
				dt, timed = e.Time.Sub(at), true
			}
		}
		if e.Event == approval.EventDecided {
			s.recordFinal(e.RequestID, tool, v, dt, timed)
		}
		key := [2]string{e.RequestID, e.Actor}
		if e.Actor != "" && !s.voted[key] {
			s.voted[key] = true
			r := rowOf(s.approvers, e.Actor)
			r.Total++
			r.Counts[v]++
			if timed {
				r.Seconds = append(r.Seconds, dt.Seconds())
			}
		}
	case approval.EventExpired:
		s.recordFinal(e.RequestID, tool, approval.VerdictExpire, 0, false)
	case approval.EventRunNow, approval.EventWindowElapsed, approval.EventCancelled:
		s.addWindow(e, tool)
	case approval.EventSampled:
		rowOf(s.tools, tool).Sampled++
	case approval.EventSampleReviewed:
		if !s.judged[e.RequestID+"|right"] {
			s.judged[e.RequestID+"|right"] = true
			rowOf(s.tools, tool).SampledRight++
		}
	case approval.EventMarkedWrong:
		if s.judged[e.RequestID] {
			return
		}
		s.judged[e.RequestID] = true
		d := ParseEventData(e)
		ran := d.Sampled || approval.Verdict(d.Verdict).Runs()
		r := rowOf(s.tools, tool)
		r.MarkedWrong++
		if ran {
			r.ApprovedWrong++
		}
		if d.Sampled {
			r.SampledWrong++
			if s.judged[e.RequestID+"|right"] {
				r.SampledRight-- // "looks right" overruled
			}
		}
		if d.DecidedBy != "" && d.DecidedBy != "system" {
			a := rowOf(s.approvers, d.DecidedBy)
			a.MarkedWrong++
			if ran {
				a.ApprovedWrong++
			}
		}
	}
}

func (s *StatsBuilder) recordFinal(id, tool string, v approval.Verdict, dt time.Duration, timed bool) {
	if id != "" {
		if s.final[id] {
			return
		}
		s.final[id] = true
	}
	r := rowOf(s.tools, tool)
	r.Total++
	r.Counts[v]++
	if timed {
		r.Seconds = append(r.Seconds, dt.Seconds())
	}
}

// Report computes rates and percentiles.
func (s *StatsBuilder) Report(since, until time.Time) StatsReport {
	rep := StatsReport{Since: since, Until: until, Entries: s.entries, Tools: []StatRow{}, Approvers: []StatRow{}}
	finish := func(m map[string]*StatRow, approver bool) []StatRow {
		rows := make([]StatRow, 0, len(m))
		for _, r := range m {
			r.Rates = map[approval.Verdict]float64{}
			for _, k := range slices.Concat(StatVerdicts, WindowVerdicts) {
				if r.Total > 0 {
					r.Rates[k] = float64(r.Counts[k]) / float64(r.Total)
				}
			}
			slices.Sort(r.Seconds)
			r.Timed = len(r.Seconds)
			if len(r.Seconds) > 0 {
				med, p90 := Quantile(r.Seconds, 0.5), Quantile(r.Seconds, 0.9)
				r.MedianSec, r.P90Sec = &med, &p90
				if approver && len(r.Seconds) >= rubberStampMin && med < rubberStampUnder.Seconds() {
					r.RubberStamp = true
					rep.Warnings = append(rep.Warnings, fmt.Sprintf(
						"approver %s decides in a median of %s over %d decisions (under %s): rubber-stamping?",
						Clean(r.Name, 40), duration.Format(secDuration(med)), len(r.Seconds), rubberStampUnder))
				}
			}
			rows = append(rows, *r)
		}
		sort.Slice(rows, func(i, j int) bool {
			if rows[i].Total != rows[j].Total {
				return rows[i].Total > rows[j].Total
			}
			return rows[i].Name < rows[j].Name
		})
		return rows
	}
	rep.Tools = finish(s.tools, false)
	rep.Approvers = finish(s.approvers, true)
	sort.Strings(rep.Warnings)
	return rep
}

// sampledText is a tool's sampled review outcomes, as counts and rates of
// the sampled calls: "20 (15% right, 5% wrong)"; "-" when none.
func sampledText(r StatRow) string {
	if r.Sampled == 0 {
		return "-"
	}
	pct := func(n int) float64 { return 100 * float64(n) / float64(r.Sampled) }
	return fmt.Sprintf("%d (%.0f%% right, %.0f%% wrong)", r.Sampled, pct(r.SampledRight), pct(r.SampledWrong))
}

func secDuration(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// Quantile is the q-quantile of sorted values with linear interpolation
// between closest ranks (the median of an even count is the mean of the
// middle two).
func Quantile(sorted []float64, q float64) float64 {
	if len(sorted) == 0 {
		return math.NaN()
	}
	pos := q * float64(len(sorted)-1)
	lo := int(math.Floor(pos))
	hi := int(math.Ceil(pos))
	return sorted[lo] + (sorted[hi]-sorted[lo])*(pos-float64(lo))
}

// WriteStats prints the report as two tables and the warnings. The
// columns of WindowVerdicts are there when some row has one.
func WriteStats(w io.Writer, rep StatsReport) error {
	fmt.Fprintf(w, "audit stats %s → %s (%d entries)\n\n", FormatTime(rep.Since), FormatTime(rep.Until), rep.Entries)
	verdicts := Columns(slices.Concat(rep.Tools, rep.Approvers)...)
	table := func(title string, rows []StatRow) error {
		tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', 0)
		fmt.Fprintf(tw, "%s\tTOTAL", title)
		for _, k := range verdicts {
			fmt.Fprintf(tw, "\t%s", strings.ToUpper(string(k)))
		}
		fmt.Fprint(tw, "\tMEDIAN\tP90\tAPPROVED→WRONG")
		if title == "TOOL" {
			fmt.Fprint(tw, "\tSAMPLED (RIGHT, WRONG)")
		}
		fmt.Fprint(tw, "\t\n")
		for _, r := range rows {
			fmt.Fprintf(tw, "%s\t%d", Clean(r.Name, 40), r.Total)
			for _, k := range verdicts {
				fmt.Fprintf(tw, "\t%d (%.0f%%)", r.Counts[k], 100*r.Rates[k])
			}
			med, p90 := "-", "-"
			if r.MedianSec != nil {
				med, p90 = duration.Format(secDuration(*r.MedianSec)), duration.Format(secDuration(*r.P90Sec))
			}
			flag := ""
			if r.RubberStamp {
				flag = "!"
			}
			fmt.Fprintf(tw, "\t%s\t%s\t%d", med, p90, r.ApprovedWrong)
			if title == "TOOL" {
				fmt.Fprintf(tw, "\t%s", sampledText(r))
			}
			fmt.Fprintf(tw, "\t%s\n", flag)
		}
		if len(rows) == 0 {
			fmt.Fprintln(tw, "(none)\t")
		}
		return tw.Flush()
	}
	if err := table("TOOL", rep.Tools); err != nil {
		return err
	}
	fmt.Fprintln(w)
	if err := table("APPROVER", rep.Approvers); err != nil {
		return err
	}
	if len(rep.Warnings) > 0 {
		fmt.Fprintln(w)
		for _, s := range rep.Warnings {
			fmt.Fprintln(w, "warning: "+s)
		}
	}
	return nil
}

// ParseSince reads --since: a positive duration as duration.Parse reads
// it (24h, 7d, 1d12h, 1.5d).
func ParseSince(s string) (time.Duration, error) {
	d, err := duration.Parse(s)
	if err != nil {
		return 0, err
	}
	if d <= 0 {
		return 0, fmt.Errorf("duration %q must be positive", s)
	}
	return d, nil
}
