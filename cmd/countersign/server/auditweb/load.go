package auditweb

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/replay"
)

// Suggester drafts rules from the approvals of a window, each replayed
// (replay.Suggest over the policy in force); cmd/countersign wires it
// when the view knows the policy. An error means the stream could not be
// read.
type Suggester func(ctx context.Context, since time.Time) (*replay.Suggestions, error)

// loadPage is the approval load: requests per tool per week, the median
// time to decide, the share approved unedited, and the suggestions.
type loadPage struct {
	Since, Until time.Time
	Window       string
	Windows      []string
	Problem      string
	Cut          bool
	Load         auditreport.LoadReport
	// Suggestions are drawn on request (?suggest=1: they read the window
	// again, once more per tool suggested for); nil when not asked, when
	// the view has no Suggester, or when the window was cut (a suggestion
	// from part of it would be a guess).
	Suggestions *replay.Suggestions
	SuggestNote string
	CanSuggest  bool
	SuggestLink string
}

func (loadPage) title() string { return "Load" }

// suggestMin is the fewest identical approvals the page suggests from.
const suggestMin = 20

func (h *Handler) serveLoad(w http.ResponseWriter, r *http.Request) {
	now := h.opts.Now()
	page := loadPage{Window: "30d", Windows: []string{"7d", "30d", "90d"}}
	if s := strings.TrimSpace(r.URL.Query().Get("since")); s != "" {
		page.Window = s
	}
	d, err := auditreport.ParseSince(page.Window)
	if err != nil {
		page.Problem = "since: " + err.Error() + "; showing 30d"
		page.Window, d = "30d", 30*24*time.Hour
	}
	page.Since, page.Until = now.Add(-d), now
	lb := auditreport.NewLoadBuilder(page.Since, page.Until)
	if page.Cut, err = h.scanWindow(r.Context(), page.Since, lb.Add); err != nil {
		h.fail(w, r, "audit stream", err)
		return
	}
	page.Load = lb.Report()
	page.CanSuggest = h.opts.Suggest != nil && !page.Cut
	page.SuggestLink = h.opts.Prefix + "load?since=" + url.QueryEscape(page.Window) + "&suggest=1"
	switch {
	case r.URL.Query().Get("suggest") == "":
	case h.opts.Suggest == nil:
		page.SuggestNote = "Suggestions need the policy in force: the view was started without it."
	case page.Cut:
		page.SuggestNote = "No suggestions: the window holds more entries than the page reads."
	default:
		s, err := h.opts.Suggest(r.Context(), page.Since)
		if err != nil {
			h.opts.Logger.Error("audit view suggestions", "path", r.URL.Path, "err", err)
			page.SuggestNote = "Suggestions could not be drawn (see the logs)."
			break
		}
		page.Suggestions = s
	}
	h.render(w, r, "load", page)
}
