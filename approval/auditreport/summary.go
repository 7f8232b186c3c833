package auditreport

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

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
