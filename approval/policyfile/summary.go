package policyfile

import (
	"fmt"
	"io"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

// WriteSummary writes one line per tool (what `countersign check` prints): review mode and rule, risk,
// quorum, decisions, approvers, timeout, and the shortcuts around a human
// (remember, preauthorize) and the refusals (deny).
func (f *File) WriteSummary(w io.Writer) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tREVIEW\tRISK\tQUORUM\tDECISIONS\tAPPROVERS\tTIMEOUT\tALSO")
	for _, t := range f.Tools {
		tp := f.Policy.Tools[t.Name]
		review := string(tp.Review)
		if tp.Review == approval.ReviewAfter {
			review += " a " + duration.Format(tp.CancelWindow) + " cancel window"
		}
		if tp.When != "" {
			review += " when " + tp.When
			if tp.Review == approval.ReviewAfter {
				review = string(tp.Review) + " a " + duration.Format(tp.CancelWindow) + " cancel window; before when " + tp.When
			}
		}
		quorum := strconv.Itoa(max(tp.Quorum, 1))
		for _, q := range tp.QuorumWhen {
			quorum += fmt.Sprintf(", %d when %s", q.Quorum, q.When)
		}
		var decisions []string
		for _, d := range tp.Decisions {
			decisions = append(decisions, string(d))
		}
		var also []string
		for _, c := range tp.Capabilities {
			if slices.Contains(f.Policy.SensitiveCapabilities, c) {
				also = append(also, "sensitive "+c)
			}
		}
		if tp.Remember > 0 {
			also = append(also, "remember "+duration.Format(tp.Remember))
		}
		if tp.Preauthorize > 0 {
			also = append(also, "preauthorize "+duration.Format(tp.Preauthorize))
		}
		for _, d := range tp.Deny {
			also = append(also, "deny when "+d.When)
		}
		if tp.Sample > 0 {
			also = append(also, fmt.Sprintf("sample %s of unreviewed calls afterwards", strconv.FormatFloat(tp.Sample*100, 'f', -1, 64)+"%"))
		}
		timeout, approvers, decided := "-", "-", "-"
		switch tp.Review {
		case approval.ReviewNever:
			quorum = "-"
		case approval.ReviewAfter:
			// Decisions before the window apply to calls a rule sends to a
			// human first; in the window it is cancel or run now.
			timeout, approvers, decided = duration.Format(tp.Timeout), approversText(tp.Approvers), "cancel,run_now"
			if tp.When != "" {
				decided += "; " + strings.Join(decisions, ",")
			}
		default:
			timeout, approvers, decided = duration.Format(tp.Timeout), approversText(tp.Approvers), strings.Join(decisions, ",")
		}
		notes := strings.Join(also, "; ")
		if notes == "" {
			notes = "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", t.Name, review, tp.Risk, quorum, decided, approvers, timeout, notes)
	}
	return tw.Flush()
}

// approversText names who may decide, for the summary.
func approversText(a approval.Approvers) string {
	var parts []string
	if len(a.Users) > 0 {
		parts = append(parts, "users "+strings.Join(a.Users, ","))
	}
	if len(a.Usergroups) > 0 {
		parts = append(parts, "groups "+strings.Join(a.Usergroups, ","))
	}
	if a.ChannelMembers || len(parts) == 0 {
		parts = append(parts, "approvals channel")
	}
	s := strings.Join(parts, " + ")
	if a.AllowSelf {
		s += " (self allowed)"
	}
	return s
}
