package auditreport

import (
	"maps"
	"slices"
	"time"

	"github.com/countersign/countersign/approval"
)

// Week is the width of a column of the approval load.
const Week = 7 * 24 * time.Hour

// LoadRow is one tool's approval load: how often people were asked, how
// long they took, how often they let the call through as proposed.
type LoadRow struct {
	Tool string `json:"tool"`
	// Requests counts the requests made (requested entries); Weeks the
	// same per week of the window, Weeks[0] the week it starts.
	Requests int   `json:"requests"`
	Weeks    []int `json:"weeks"`
	// Decided counts the requests a person decided (approved, edited,
	// rejected or answered), ApprovedUnedited those approved as proposed.
	Decided          int      `json:"decided"`
	ApprovedUnedited int      `json:"approved_unedited"`
	MedianSec        *float64 `json:"median_seconds,omitempty"`

	seconds []float64
}

// UneditedShare is ApprovedUnedited / Decided, in [0,1] (0 when nothing
// was decided).
func (r LoadRow) UneditedShare() float64 {
	if r.Decided == 0 {
		return 0
	}
	return float64(r.ApprovedUnedited) / float64(r.Decided)
}

// LoadReport is the approval load of a window, per tool.
type LoadReport struct {
	Since   time.Time   `json:"since"`
	Until   time.Time   `json:"until"`
	Weeks   []time.Time `json:"weeks"` // the start of each week column
	Entries int         `json:"entries"`
	Tools   []LoadRow   `json:"tools"`
}

// LoadBuilder folds entries, oldest first, into a LoadReport. It keeps a
// count per tool and week, the time of each request not yet decided, and
// each decision's duration (for the median).
type LoadBuilder struct {
	since, until time.Time
	weeks        int
	tools        map[string]*LoadRow
	asked        map[string]time.Time // request id → requested, until decided
	entries      int
}

// NewLoadBuilder returns a builder for the window since..until.
func NewLoadBuilder(since, until time.Time) *LoadBuilder {
	return &LoadBuilder{since: since, until: until, weeks: max(int((until.Sub(since)+Week-1)/Week), 1),
		tools: map[string]*LoadRow{}, asked: map[string]time.Time{}}
}

func (b *LoadBuilder) row(tool string) *LoadRow {
	r, ok := b.tools[tool]
	if !ok {
		r = &LoadRow{Tool: tool, Weeks: make([]int, b.weeks)}
		b.tools[tool] = r
	}
	return r
}

// Add folds in one entry.
func (b *LoadBuilder) Add(e approval.Entry) {
	var br approval.Brief
	if e.Event == approval.EventDecided {
		if _, asked := b.asked[e.RequestID]; asked {
			br, _ = approval.DecodeBrief(e)
		}
	}
	b.AddBrief(e, br)
}

// AddBrief folds in one entry whose data the caller decoded already
// (approval.DecodeBrief; only a decision's is read), so that a pass
// feeding several builders decodes each entry once.
func (b *LoadBuilder) AddBrief(e approval.Entry, d approval.Brief) {
	b.entries++
	tool := orDefault(e.Tool, "unknown")
	switch e.Event {
	case approval.EventRequested:
		r := b.row(tool)
		r.Requests++
		if w := int(e.Time.Sub(b.since) / Week); w >= 0 && w < b.weeks {
			r.Weeks[w]++
		}
		b.asked[e.RequestID] = e.Time
	case approval.EventDecided:
		at, ok := b.asked[e.RequestID]
		if !ok {
			return // requested before the window
		}
		if d.Verdict == approval.VerdictExpire {
			delete(b.asked, e.RequestID)
			return
		}
		delete(b.asked, e.RequestID)
		r := b.row(tool)
		r.Decided++
		if d.Verdict == approval.VerdictApprove {
			r.ApprovedUnedited++
		}
		took := time.Duration(d.DecisionMS) * time.Millisecond
		if took <= 0 {
			took = e.Time.Sub(at)
		}
		r.seconds = append(r.seconds, max(took, 0).Seconds())
	case approval.EventExpired, approval.EventCancelled, approval.EventAbandoned, approval.EventLost:
		delete(b.asked, e.RequestID)
	}
}

// Report returns the load per tool, by name.
func (b *LoadBuilder) Report() LoadReport {
	rep := LoadReport{Since: b.since, Until: b.until, Entries: b.entries}
	for i := range b.weeks {
		rep.Weeks = append(rep.Weeks, b.since.Add(time.Duration(i)*Week))
	}
	for _, name := range slices.Sorted(maps.Keys(b.tools)) {
		r := *b.tools[name]
		if len(r.seconds) > 0 {
			s := slices.Clone(r.seconds)
			slices.Sort(s)
			m := Quantile(s, 0.5)
			r.MedianSec = &m
		}
		r.seconds = nil
		rep.Tools = append(rep.Tools, r)
	}
	return rep
}
