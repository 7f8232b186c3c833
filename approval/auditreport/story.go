// Package auditreport holds the pure readers over audit entries behind
// `countersign audit` and the audit web view: they take entries one at a
// time (as the stream is paged) and build lines, request stories, export
// records and statistics. Nothing here talks to Redis; it imports only the
// standard library and approval.
package auditreport

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

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
