package auditweb

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/duration"
)

// Charts are drawn as inline SVG from numbers computed here; the
// templates only place rectangles and text.

// verdictColour is the fill of each outcome in every chart (a palette that
// stays readable for the common colour-vision deficiencies).
var verdictColour = map[approval.Verdict]string{
	approval.VerdictApprove: "#1a9850",
	approval.VerdictEdit:    "#4575b4",
	approval.VerdictReject:  "#d73027",
	approval.VerdictRespond: "#984ea3",
	approval.VerdictExpire:  "#999999",
	// A cancel window's outcomes (auditreport.WindowVerdicts).
	approval.VerdictRunNow:        "#91bfdb",
	approval.VerdictWindowElapsed: "#a6d96a",
	approval.VerdictCancel:        "#fdae61",
}

// Geometry of the rate charts, in SVG user units (= CSS pixels).
const (
	chartWidth  = 1000
	labelWidth  = 190
	barWidth    = 420
	barHeight   = 22
	barGap      = 10
	chartTop    = 8
	maxBarsShow = 20
)

type rateChart struct {
	Title  string
	Width  int
	Height int
	LabelX int
	NoteX  int
	Bars   []rateBar
	// Legend is laid out by the page, not placed in the SVG: an outcome's
	// name (window_elapsed) is as long as it is, and the items wrap rather
	// than run into each other.
	Legend []legendItem
	Hidden int // rows beyond maxBarsShow
}

type rateBar struct {
	Label  string
	Y      int
	TextY  int
	Total  string
	Note   string
	Warn   bool
	Pieces []barPiece
}

type barPiece struct {
	X, W  int
	Fill  string
	Title string
	Text  string // the count, when the piece is wide enough to hold it
	TextX int
}

type legendItem struct {
	Fill  string
	Label string
}

// newRateChart draws one horizontal stacked bar per row: the share of each
// outcome, with the total and the median review time beside it.
func (h *Handler) newRateChart(ctx context.Context, title string, rows []auditreport.StatRow, approvers bool) rateChart {
	c := rateChart{Title: title, Width: chartWidth, LabelX: labelWidth - 8, NoteX: labelWidth + barWidth + 10}
	if len(rows) > maxBarsShow {
		c.Hidden = len(rows) - maxBarsShow
		rows = rows[:maxBarsShow]
	}
	verdicts := auditreport.Columns(rows...)
	for i, r := range rows {
		y := chartTop + i*(barHeight+barGap)
		label := auditreport.Clean(r.Name, 28)
		if approvers {
			label = auditreport.Clean(h.name(ctx, r.Name), 28)
		}
		b := rateBar{Label: label, Y: y, TextY: y + barHeight/2 + 5, Total: fmt.Sprintf("%d", r.Total), Warn: r.RubberStamp}
		if r.MedianSec != nil {
			b.Note = fmt.Sprintf("%d · median %s · p90 %s", r.Total,
				duration.Format(secs(*r.MedianSec)), duration.Format(secs(*r.P90Sec)))
		} else {
			b.Note = fmt.Sprintf("%d · no review times", r.Total)
		}
		x := labelWidth
		for j, v := range verdicts {
			n := r.Counts[v]
			if n == 0 || r.Total == 0 {
				continue
			}
			w := n * barWidth / r.Total
			if j == len(verdicts)-1 || x+w > labelWidth+barWidth {
				w = labelWidth + barWidth - x
			}
			p := barPiece{X: x, W: max(w, 1), Fill: verdictColour[v],
				Title: fmt.Sprintf("%s: %d of %d (%.0f%%)", auditreport.OutcomeOf(v), n, r.Total, 100*r.Rates[v])}
			if w >= 26 {
				p.Text, p.TextX = fmt.Sprintf("%d", n), x+w/2
			}
			b.Pieces = append(b.Pieces, p)
			x += w
		}
		c.Bars = append(c.Bars, b)
	}
	c.Height = chartTop + len(c.Bars)*(barHeight+barGap)
	for _, v := range verdicts {
		c.Legend = append(c.Legend, legendItem{Fill: verdictColour[v], Label: auditreport.OutcomeOf(v)})
	}
	return c
}

func secs(s float64) time.Duration { return time.Duration(s * float64(time.Second)) }

// reviewBuckets are the upper bounds of the review-time histogram.
var reviewBuckets = []struct {
	upTo  time.Duration
	label string
}{
	{5 * time.Second, "< 5 s"},
	{30 * time.Second, "5–30 s"},
	{time.Minute, "30 s–1 min"},
	{5 * time.Minute, "1–5 min"},
	{30 * time.Minute, "5–30 min"},
	{time.Hour, "30 min–1 h"},
	{4 * time.Hour, "1–4 h"},
	{24 * time.Hour, "4–24 h"},
	{1<<63 - 1, "> 1 day"},
}

type histogram struct {
	Width, Height int
	BaseY         int
	Bars          []histBar
	Total         int
	Median, P90   string
}

type histBar struct {
	X, Y, W, H   int
	Label, Count string
	LabelX       int
	CountY       int
	Title        string
}

// newHistogram draws how long humans took to decide (seconds, sorted or
// not), one column per bucket.
func newHistogram(seconds []float64) histogram {
	const (
		colW   = 76
		colGap = 8
		plotH  = 160
		top    = 20
	)
	counts := make([]int, len(reviewBuckets))
	for _, s := range seconds {
		d := secs(s)
		for i, b := range reviewBuckets {
			if d < b.upTo {
				counts[i]++
				break
			}
		}
	}
	most := 1
	for _, n := range counts {
		most = max(most, n)
	}
	g := histogram{Width: len(reviewBuckets)*(colW+colGap) + 20, Height: top + plotH + 40, BaseY: top + plotH, Total: len(seconds)}
	for i, b := range reviewBuckets {
		hgt := counts[i] * plotH / most
		if counts[i] > 0 {
			hgt = max(hgt, 2)
		}
		x := 10 + i*(colW+colGap)
		g.Bars = append(g.Bars, histBar{X: x, Y: top + plotH - hgt, W: colW, H: hgt, Label: b.label, Count: fmt.Sprintf("%d", counts[i]),
			LabelX: x + colW/2, CountY: top + plotH - hgt - 5, Title: fmt.Sprintf("%s: %d decisions", b.label, counts[i])})
	}
	return g
}

type chartsPage struct {
	Since, Until time.Time
	Window       string
	Windows      []string
	Problem      string
	Entries      int
	Cut          bool
	Tools        rateChart
	Approvers    rateChart
	Review       histogram
	Warnings     []string
}

func (chartsPage) title() string { return "Charts" }

// errStatsLimit ends a window's scan at Options.StatsLimit entries.
var errStatsLimit = errors.New("stats limit reached")

// scanWindow hands add every entry from since on, at most
// Options.StatsLimit of them (the charts' and the load page's window);
// cut says the window held more.
func (h *Handler) scanWindow(ctx context.Context, since time.Time, add func(approval.Entry)) (cut bool, err error) {
	n := 0
	err = auditreport.ScanSince(ctx, h.opts.Entries, since, func(e approval.Entry) error {
		if n++; n > h.opts.StatsLimit {
			return errStatsLimit
		}
		add(e)
		return nil
	})
	if errors.Is(err, errStatsLimit) {
		return true, nil
	}
	return false, err
}

func (h *Handler) serveCharts(w http.ResponseWriter, r *http.Request) {
	now := h.opts.Now()
	page := chartsPage{Window: "7d", Windows: []string{"1h", "24h", "7d", "30d", "90d"}}
	if s := strings.TrimSpace(r.URL.Query().Get("since")); s != "" {
		page.Window = s
	}
	d, err := auditreport.ParseSince(page.Window)
	if err != nil {
		page.Problem = "since: " + err.Error() + "; showing 7d"
		page.Window, d = "7d", 7*24*time.Hour
	}
	page.Since, page.Until = now.Add(-d), now
	// At most StatsLimit entries, from the window's start; the page says
	// when the window held more.
	sb := auditreport.NewStatsBuilder()
	if page.Cut, err = h.scanWindow(r.Context(), page.Since, sb.Add); err != nil {
		h.fail(w, r, "audit stream", err)
		return
	}
	rep := sb.Report(page.Since, page.Until)
	page.Entries = rep.Entries
	page.Tools = h.newRateChart(r.Context(), "Outcomes per tool", rep.Tools, false)
	page.Approvers = h.newRateChart(r.Context(), "Decisions per approver", rep.Approvers, true)
	var all []float64
	for _, t := range rep.Tools {
		all = append(all, t.Seconds...)
	}
	page.Review = newHistogram(all)
	if len(all) > 0 {
		sorted := append([]float64(nil), all...)
		slices.Sort(sorted)
		page.Review.Median = duration.Format(secs(auditreport.Quantile(sorted, 0.5)))
		page.Review.P90 = duration.Format(secs(auditreport.Quantile(sorted, 0.9)))
	}
	page.Warnings = rep.Warnings
	h.render(w, r, "charts", page)
}
