package auditreport

import (
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
)

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
