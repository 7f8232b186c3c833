package auditreport

import (
	"slices"

	"github.com/countersign/countersign/approval"
)

// addWindow folds in how a review-after call's cancel window ended: run
// now or cancelled by an approver (a decision: counted for the tool and
// the approver, timed), or run when the window ended (the tool only; the
// clock decided). A cancellation by the system (a stopped run) is not a
// decision and is left out.
func (s *StatsBuilder) addWindow(e approval.Entry, tool string) {
	d := ParseEventData(e)
	v := approval.Verdict(d.Verdict)
	if e.Event == approval.EventWindowElapsed {
		s.recordFinal(e.RequestID, tool, approval.VerdictWindowElapsed, 0, false)
		return
	}
	if v != approval.VerdictRunNow && v != approval.VerdictCancel {
		return
	}
	dt, timed := d.DecisionTime(e.Time)
	s.recordFinal(e.RequestID, tool, v, dt, timed)
	key := [2]string{e.RequestID, e.Actor}
	if e.Actor == "" || e.Actor == "system" || s.voted[key] {
		return
	}
	s.voted[key] = true
	r := rowOf(s.approvers, e.Actor)
	r.Total++
	r.Counts[v]++
	if timed {
		r.Seconds = append(r.Seconds, dt.Seconds())
	}
}

// Columns are the outcome columns of a stats table (or chart) of rows:
// StatVerdicts, and WindowVerdicts when a row has one.
func Columns(rows ...StatRow) []approval.Verdict {
	for _, r := range rows {
		for _, v := range WindowVerdicts {
			if r.Counts[v] > 0 {
				return slices.Concat(StatVerdicts, WindowVerdicts)
			}
		}
	}
	return StatVerdicts
}
