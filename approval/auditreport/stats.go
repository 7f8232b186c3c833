package auditreport

import (
	"fmt"
	"io"
	"math"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

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
