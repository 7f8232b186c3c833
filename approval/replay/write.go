package replay

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"
)

// maxNamed is how many unreplayable calls the text report names per
// reason (the JSON names them all).
const maxNamed = 10

// Write writes rep as a table per tool, then every regression, then the
// calls that could not be replayed (counted per reason, the first of
// each named).
func Write(w io.Writer, rep *Report) error {
	fmt.Fprintf(w, "replayed %d calls (%d audit entries) %s\n\n", rep.Calls, rep.Entries, period(rep.Since, rep.Until))
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "TOOL\tCALLS\tNOW auto/asked/denied\tCANDIDATE auto/asked/denied\tAPPROVALS now→cand\tPEOPLE-MIN saved/added\tGRANTS RUN OUT\tREGRESSIONS")
	for _, r := range rep.Tools {
		grants := "-"
		if r.GrantsRunOut > 0 {
			grants = fmt.Sprintf("%d (%d calls asked)", r.GrantsRunOut, r.GrantCallsAsked)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%d→%d\t%s/%s\t%s\t%d\n", r.Tool, callsText(r), countsText(r.Now), countsText(r.Candidate),
			r.Now.Approvals, r.Candidate.Approvals, minutes(r.MinutesSaved), minutes(r.MinutesAdded), grants, r.Regressions)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	if len(rep.Regressions) == 0 {
		fmt.Fprintln(w, "\nno regressions: every call a person rejected, edited or marked wrong still needs a person (or is denied)")
	} else {
		fmt.Fprintf(w, "\n%d REGRESSIONS: calls a person did not let through as proposed that the candidate runs without a person\n", len(rep.Regressions))
		for _, g := range rep.Regressions {
			by := ""
			if g.By != "" {
				by = " by " + g.By
			}
			fmt.Fprintf(w, "  %s  %s  %s%s; now %s, candidate %s\n", g.RequestID, g.Tool, g.Person, by, verdictText(g.Now), verdictText(g.Candidate))
		}
	}
	if len(rep.Unreplayable) > 0 {
		by := map[string][]Unreplayed{}
		for _, u := range rep.Unreplayable {
			by[u.Why] = append(by[u.Why], u)
		}
		fmt.Fprintf(w, "\n%d calls not replayed (never guessed):\n", len(rep.Unreplayable))
		for _, why := range slices.Sorted(maps.Keys(by)) {
			us := by[why]
			fmt.Fprintf(w, "  %s (%d): %s\n", why, len(us), whyText[why])
			for _, u := range us[:min(len(us), maxNamed)] {
				fmt.Fprintf(w, "    %s  %s\n", u.RequestID, u.Tool)
			}
			if len(us) > maxNamed {
				fmt.Fprintf(w, "    … and %d more (--json lists them all)\n", len(us)-maxNamed)
			}
		}
	}
	return nil
}

// WriteJSON writes rep as indented JSON.
func WriteJSON(w io.Writer, rep *Report) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(rep)
}

var whyText = map[string]string{
	WhyArgsMissing:      "the audit holds no arguments for the call",
	WhyArgsNotObject:    "the arguments are not a JSON object (the model's raw text)",
	WhyArgsRedacted:     "arguments redacted in the audit: a rule may read what was removed",
	WhyArgsCut:          "an argument longer than the audit keeps was cut there: a rule may read what was cut",
	WhyUnknownCurrent:   "the policy in force does not declare the tool",
	WhyUnknownCandidate: "the candidate does not declare the tool",
	WhyRequesterUnknown: "a rule reads the requester, which the audit does not name for this call",
}

func callsText(r ToolRow) string {
	if r.Replayed == r.Calls {
		return strconv.Itoa(r.Calls)
	}
	return fmt.Sprintf("%d (%d replayed)", r.Calls, r.Replayed)
}

func countsText(c Counts) string {
	s := fmt.Sprintf("%d/%d/%d", c.Auto+c.Window, c.Asked, c.Denied)
	if c.Window > 0 {
		s += fmt.Sprintf(" (%d after a cancel window)", c.Window)
	}
	return s
}

func verdictText(v Verdict) string {
	s := string(v.Outcome)
	if v.Outcome == Asked && v.Quorum > 1 {
		s += fmt.Sprintf(" (%d approvals)", v.Quorum)
	}
	if v.Why != "" {
		s += " [" + v.Why + "]"
	}
	return s
}

func minutes(m float64) string {
	if m == 0 {
		return "0"
	}
	return strconv.FormatFloat(m, 'f', 1, 64)
}

func period(since, until time.Time) string {
	switch {
	case since.IsZero() && until.IsZero():
		return "over the whole stream"
	case until.IsZero():
		return "since " + since.UTC().Format(time.RFC3339)
	case since.IsZero():
		return "until " + until.UTC().Format(time.RFC3339)
	}
	return "from " + since.UTC().Format(time.RFC3339) + " to " + until.UTC().Format(time.RFC3339)
}

// WriteSuggestions writes each suggestion as a commented YAML patch for
// the policy file path (the tool's review, to merge by hand), then the
// groups no rule is suggested for. Nothing is applied.
func WriteSuggestions(w io.Writer, s *Suggestions, path string) error {
	if len(s.Suggestions) == 0 {
		fmt.Fprintf(w, "# no suggestion: no tool was approved unedited often enough by one requester since %s\n", s.Since.UTC().Format(time.RFC3339))
	}
	for i, g := range s.Suggestions {
		fmt.Fprintf(w, "# %d. %s asked for by %s: %d approvals, all unedited, none marked wrong (%s … %s)\n", i+1, g.Tool, g.Requester,
			g.Approvals, g.First.UTC().Format(time.DateOnly), g.Last.UTC().Format(time.DateOnly))
		fmt.Fprintf(w, "#    replayed since %s: %d past calls would run without a person (%s people-minutes);\n",
			s.Since.UTC().Format(time.DateOnly), g.LetThrough, minutes(g.MinutesSaved))
		fmt.Fprintf(w, "#    %d of them a person rejected, edited or marked wrong; %d such calls of %s still ask a person.\n",
			g.Regressions, g.StillAsked, g.Tool)
		fmt.Fprintf(w, "#    Review it, then merge it into the tool's entry of %s by hand (replay it in CI first).\n", path)
		fmt.Fprintf(w, "tools:\n  - name: %s\n    review:\n      mode: auto\n      when: %s\n      reason: %s\n\n", yamlQuote(g.Tool), yamlQuote(g.When), yamlQuote(g.Reason))
	}
	for _, d := range s.NotSuggested {
		fmt.Fprintf(w, "# not suggested: %s asked for by %s (%d approvals): %s\n", d.Tool, d.Requester, d.Approvals, d.Why)
	}
	return nil
}

// WriteSuggestionsJSON writes s as indented JSON.
func WriteSuggestionsJSON(w io.Writer, s *Suggestions) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	return enc.Encode(s)
}

// yamlQuote is s as a YAML single-quoted scalar (a quote doubled).
func yamlQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", "''") + "'" }
