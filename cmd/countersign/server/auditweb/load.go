package auditweb

import (
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/replay"
)

// Suggester starts drafting rules from the approvals of a window that
// begins at since, under the policy in force (replay.NewSuggester);
// cmd/countersign wires it when the view knows the policy. The page hands
// the returned drafter the window's entries in its own pass, then has it
// replay every drafted rule in one more pass. An error means the policy
// in force does not compile.
type Suggester func(since time.Time) (*replay.Suggester, error)

// loadPage is the approval load: requests per tool per week, the median
// time to decide, the share approved unedited, and the suggestions.
type loadPage struct {
	Since, Until time.Time
	Window       string
	Windows      []string
	Problem      string
	Cut          bool
	Load         auditreport.LoadReport
	// Suggestions are drawn with the page (one pass for the load and the
	// drafting, one more to replay every drafted rule); nil when the view
	// has no Suggester, when the window was cut (a suggestion from part
	// of it would be a guess), or when they could not be drawn
	// (SuggestNote says which).
	Suggestions *replay.Suggestions
	SuggestNote string
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
	var sg *replay.Suggester
	if h.opts.Suggest == nil {
		page.SuggestNote = "Suggestions need the policy in force: the view was started without it."
	} else if sg, err = h.opts.Suggest(page.Since); err != nil {
		h.opts.Logger.Error("audit view suggestions", "path", r.URL.Path, "err", err)
		page.SuggestNote = "Suggestions could not be drawn (see the logs)."
	}
	lb := auditreport.NewLoadBuilder(page.Since, page.Until)
	add := lb.Add
	if sg != nil {
		// Each entry's data is decoded once for both (its Brief).
		add = func(e approval.Entry) {
			b, _ := approval.DecodeBrief(e)
			lb.AddBrief(e, b)
			sg.AddBrief(e, b)
		}
	}
	if page.Cut, err = h.scanWindow(r.Context(), page.Since, add); err != nil {
		h.fail(w, r, "audit stream", err)
		return
	}
	page.Load = lb.Report()
	switch {
	case sg == nil:
	case page.Cut:
		page.SuggestNote = "No suggestions: the window holds more entries than the page reads."
	default:
		s, err := sg.Suggestions(r.Context(), h.opts.Entries)
		switch {
		case errors.Is(err, replay.ErrEmpty):
			s = &replay.Suggestions{Since: page.Since} // nothing recorded yet: nothing to suggest
		case errors.Is(err, replay.ErrTrimmed):
			page.SuggestNote = "No suggestions: the audit stream no longer holds the whole window (trimmed); choose a shorter one."
			s = nil
		case err != nil:
			h.opts.Logger.Error("audit view suggestions", "path", r.URL.Path, "err", err)
			page.SuggestNote = "Suggestions could not be drawn (see the logs)."
			s = nil
		}
		page.Suggestions = s
	}
	h.render(w, r, "load", page)
}
