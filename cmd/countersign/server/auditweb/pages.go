package auditweb

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/duration"
)

// funcs are the template helpers. They return plain strings: escaping is
// html/template's job.
func (h *Handler) funcs() template.FuncMap {
	return template.FuncMap{
		"when": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		},
		"dur":     duration.Format,
		"clean":   func(s string) string { return auditreport.Clean(s, 300) },
		"fields":  argFields,
		"request": h.requestLink,
		"num":     func(n int) string { return groupDigits(strconv.Itoa(n)) },
		"pct":     func(f float64) string { return strconv.FormatFloat(100*f, 'f', 0, 64) + "%" },
		"secs":    func(s *float64) string { return duration.Format(secs(*s)) },
	}
}

// storyMargin is how far before a request's known creation time its
// story is read from: the proposal comes a moment before the request, and
// writers' clocks differ.
const storyMargin = time.Hour

// requestLink is the story page of request id. With a creation time it
// carries a hint (?after=<stream id>) so that the page reads the stream
// from shortly before then rather than from its beginning.
func (h *Handler) requestLink(id string, created ...time.Time) string {
	link := h.opts.Prefix + "requests/" + url.PathEscape(id)
	if len(created) == 1 && !created[0].IsZero() {
		if after := auditreport.StreamIDBefore(created[0].Add(-storyMargin)); after != "" {
			link += "?after=" + url.QueryEscape(after)
		}
	}
	return link
}

// name is how a person (or channel, or group) is shown: their name when
// Options.Names knows it.
func (h *Handler) name(ctx context.Context, id string) string {
	if id == "" {
		return "—"
	}
	if n := h.opts.Names.Name(ctx, id); n != "" {
		return auditreport.Clean(n, 60)
	}
	return auditreport.Clean(id, 60)
}

// groupDigits writes 100000 as 100,000.
func groupDigits(s string) string {
	if len(s) <= 3 {
		return s
	}
	var b strings.Builder
	pre := len(s) % 3
	if pre > 0 {
		b.WriteString(s[:pre])
	}
	for i := pre; i < len(s); i += 3 {
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		b.WriteString(s[i : i+3])
	}
	return b.String()
}

// cleanLines is auditreport.Clean that keeps line breaks (the page shows
// them as such) and cuts the whole text to max runes.
func cleanLines(s string, max int) string {
	lines := strings.Split(s, "\n")
	for i, l := range lines {
		lines[i] = auditreport.Clean(l, 0)
	}
	out := strings.Join(lines, "\n")
	if r := []rune(out); len(r) > max {
		out = string(r[:max]) + "…"
	}
	return out
}

// slackID matches Slack user and channel ids inside report text (a
// capital letter and at least eight capitals or digits, one a digit).
var slackID = regexp.MustCompile(`\b[UWCG][A-Z0-9]{8,}\b`)

// withNames replaces the Slack user and channel ids in s by the names
// Options.Names knows, so report text reads "edit by Bob Baker" and
// "posted to #approvals".
func (h *Handler) withNames(ctx context.Context, s string) string {
	return slackID.ReplaceAllStringFunc(s, func(id string) string {
		if !strings.ContainsAny(id[1:], "0123456789") {
			return id // a word in capitals, not an id
		}
		if n := h.opts.Names.Name(ctx, id); n != "" {
			return auditreport.Clean(n, 60)
		}
		return id
	})
}

// field is one argument as a person reads it: "amount: 4200".
type field struct{ Key, Value string }

// argFields renders arguments as key: value pairs (top-level keys in
// order; nested values as compact JSON, cut short). Anything that is not
// a JSON object is one field named "arguments".
func argFields(raw json.RawMessage) []field {
	if len(bytes.TrimSpace(raw)) == 0 {
		return nil
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var obj map[string]json.RawMessage
	if err := dec.Decode(&obj); err != nil || obj == nil {
		return []field{{Key: "arguments", Value: auditreport.Clean(auditreport.CompactJSON(raw), 500)}}
	}
	keys := make([]string, 0, len(obj))
	for k := range obj {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	out := make([]field, 0, len(keys))
	for _, k := range keys {
		v := obj[k]
		var s string
		if json.Unmarshal(v, &s) != nil {
			s = auditreport.CompactJSON(v)
		}
		out = append(out, field{Key: auditreport.Clean(k, 60), Value: cleanLines(s, 1000)})
	}
	return out
}

// ---- pending ----

type pendingPage struct {
	Requests []pendingRow
}

func (pendingPage) title() string { return "Pending requests" }

type pendingRow struct {
	ID, Tool, Requester string
	Created, Deadline   time.Time
	Age                 string
	Left                string // "in 4m" or "overdue by 3s"
	Overdue             bool
	// AtDeadline is what the deadline does to this request: a call
	// waiting for approval is rejected, a review-after call runs, a
	// question expires unanswered.
	AtDeadline        string
	Deciders          []string
	Except            string // "except the requester" under four-eyes
	Quorum            string
	CardURL, CardText string
	Escalated         bool
	Args              []field
}

func (h *Handler) servePending(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	reqs, err := h.opts.Pending.Pending(ctx)
	if err != nil {
		h.fail(w, r, "pending requests", err)
		return
	}
	now := h.opts.Now()
	page := pendingPage{Requests: make([]pendingRow, 0, len(reqs))}
	for _, q := range reqs {
		row := pendingRow{ID: q.ID, Tool: auditreport.Clean(q.Tool, 80), Requester: h.name(ctx, q.Requester),
			Created: q.Created, Deadline: q.Deadline, Age: duration.Format(now.Sub(q.Created).Round(time.Second)),
			Escalated: q.Escalated != nil, Args: argFields(q.Args)}
		row.AtDeadline = atDeadline(q)
		if left := q.Deadline.Sub(now); left >= 0 {
			row.Left = "in " + duration.Format(left.Round(time.Second))
		} else {
			row.Left, row.Overdue = "overdue by "+duration.Format((-left).Round(time.Second)), true
		}
		for _, u := range q.Approvers.Users {
			row.Deciders = append(row.Deciders, h.name(ctx, u))
		}
		for _, g := range q.Approvers.Usergroups {
			row.Deciders = append(row.Deciders, "group "+h.name(ctx, g))
		}
		if q.Approvers.ChannelMembers {
			row.Deciders = append(row.Deciders, "members of the approvals channel")
		}
		if !q.Approvers.AllowSelf && len(row.Deciders) > 0 {
			row.Except = "except the requester"
		}
		switch quorum := max(q.Quorum, 1); {
		case q.Mode == approval.ModeAfter:
			row.Quorum = "may cancel it or run it now"
		case q.Kind == approval.KindContact:
			row.Quorum = "may answer"
		default:
			row.Quorum = fmt.Sprintf("%d of %d approvals", len(q.Approvals), quorum)
		}
		row.CardURL, row.CardText = h.card(ctx, q.Card)
		page.Requests = append(page.Requests, row)
	}
	h.render(w, r, "pending", page)
}

// atDeadline says what q's deadline does when nobody acts first.
func atDeadline(q *approval.Request) string {
	switch {
	case q.Mode == approval.ModeAfter:
		return "then it runs, unless an approver cancels it"
	case q.Kind == approval.KindContact:
		return "then it expires unanswered"
	}
	return "then it is rejected, unless decided"
}

// card is the link to an approval card, and the text to show with it (or
// instead of it when no workspace URL is configured).
func (h *Handler) card(ctx context.Context, c approval.CardRef) (link, text string) {
	if c.Channel == "" || c.TS == "" {
		return "", "not posted yet"
	}
	text = "in " + h.name(ctx, c.Channel)
	if sec, err := strconv.ParseFloat(c.TS, 64); err == nil {
		text += ", posted " + time.Unix(int64(sec), 0).UTC().Format("2006-01-02 15:04:05 UTC")
	}
	if h.opts.SlackURL != "" {
		link = h.opts.SlackURL + "/archives/" + url.PathEscape(c.Channel) + "/p" + url.PathEscape(strings.ReplaceAll(c.TS, ".", ""))
	}
	return link, text
}

// ---- history ----

// statuses are the outcomes the history can be filtered by, in menu order.
var statuses = []string{"approved", "edited", "rejected", "responded", "expired", "cancelled", "vote",
	"run_now", "window_elapsed", "auto", "remembered", "preauthorized", "refused"}

// rowStatus is the status an entry settles, "" for entries that settle
// nothing (they are not history rows).
func rowStatus(e approval.Entry, d auditreport.EventData) string {
	switch e.Event {
	case approval.EventDecided:
		if v := approval.Verdict(d.Verdict); v.Human() {
			return auditreport.OutcomeOf(v)
		}
		return "" // expiry and cancellation have their own entries
	case approval.EventApprovalVote:
		return "vote"
	case approval.EventExpired:
		return "expired"
	case approval.EventCancelled:
		return "cancelled"
	case approval.EventRunNow:
		return "run_now" // an approver ran a review-after call before its window ended
	case approval.EventWindowElapsed:
		return "window_elapsed" // nobody cancelled: the call ran when its window ended
	case approval.EventAutoApproved:
		return "auto"
	case approval.EventRemembered:
		return "remembered"
	case approval.EventPreauthorized:
		return "preauthorized"
	case approval.EventCallRefused:
		return "refused"
	}
	return ""
}

// filter is a history query, read from the URL.
type filter struct {
	Tool, Approver, Status string
	Since                  string // a duration back from now: 24h, 7d
	Until                  string // a UTC time, 2006-01-02T15:04
	Before                 string // stream id cursor: rows older than it

	since, until time.Time
}

// readFilter parses the query; a bad value is reported and ignored.
func readFilter(q url.Values, now time.Time) (filter, []string) {
	f := filter{Tool: strings.TrimSpace(q.Get("tool")), Approver: strings.TrimSpace(q.Get("approver")),
		Status: q.Get("status"), Since: strings.TrimSpace(q.Get("since")), Until: strings.TrimSpace(q.Get("until")),
		Before: q.Get("before")}
	var problems []string
	if f.Status != "" && !contains(statuses, f.Status) {
		problems = append(problems, fmt.Sprintf("unknown status %q", auditreport.Clean(f.Status, 30)))
		f.Status = ""
	}
	if f.Since != "" {
		d, err := auditreport.ParseSince(f.Since)
		if err != nil {
			problems = append(problems, "since: "+err.Error())
			f.Since = ""
		} else {
			f.since = now.Add(-d)
		}
	}
	if f.Until != "" {
		t, err := time.Parse("2006-01-02T15:04", f.Until)
		if err != nil {
			problems = append(problems, fmt.Sprintf("until: want a time like 2026-01-31T17:00 (UTC), got %q", auditreport.Clean(f.Until, 30)))
			f.Until = ""
		} else {
			f.until = t.Add(time.Minute) // the whole minute given
		}
	}
	if f.Before != "" && auditreport.IDBefore(f.Before) == "" && f.Before != "0-1" {
		problems = append(problems, "bad page cursor")
		f.Before = ""
	}
	return f, problems
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// query is f as URL parameters, with the cursor set to before.
func (f filter) query(before string) string {
	v := url.Values{}
	for k, s := range map[string]string{"tool": f.Tool, "approver": f.Approver, "status": f.Status,
		"since": f.Since, "until": f.Until, "before": before} {
		if s != "" {
			v.Set(k, s)
		}
	}
	return v.Encode()
}

type historyPage struct {
	Filter   filter
	Statuses []string
	Problems []string
	Rows     []historyRow
	Scanned  int
	// Next is the link to the next (older) page; "" at the end. Every
	// value in it was encoded by url.Values.
	Next template.URL
	// Exhausted is set when the scan limit ended the page early.
	Exhausted bool
	Prefix    string
}

func (historyPage) title() string { return "History" }

type historyRow struct {
	At           time.Time
	Created      time.Time // when the request was made, when the entry says
	RequestID    string
	Tool         string
	Approver     string
	Status       string
	TimeToDecide string
	Reason       string
}

// revChunk is how many entries one RevRange of the history reads.
const revChunk = 500

func (h *Handler) serveHistory(w http.ResponseWriter, r *http.Request) {
	f, problems := readFilter(r.URL.Query(), h.opts.Now())
	page := historyPage{Filter: f, Statuses: statuses, Problems: problems, Prefix: h.opts.Prefix}
	cursor := f.Before
	if cursor == "" && !f.until.IsZero() {
		// Everything up to the end of the until minute (stream ids are in
		// ms of the Redis clock; the entry time decides below).
		cursor = strconv.FormatInt(f.until.Add(auditreport.SinceSkew).UnixMilli(), 10) + "-0"
	}
	approver := strings.ToLower(f.Approver)
	stopAt := time.Time{}
	if !f.since.IsZero() {
		stopAt = f.since.Add(-auditreport.SinceSkew)
	}
scan:
	for page.Scanned < h.opts.ScanLimit {
		chunk, err := h.opts.Entries.RevRange(r.Context(), cursor, revChunk)
		if err != nil {
			h.fail(w, r, "audit stream", err)
			return
		}
		for _, e := range chunk {
			page.Scanned++
			cursor = e.ID
			if !stopAt.IsZero() && e.Time.Before(stopAt) {
				cursor = ""
				break scan
			}
			if row, ok := h.match(r.Context(), e, f, approver); ok {
				page.Rows = append(page.Rows, row)
				if len(page.Rows) == h.opts.PageSize {
					break scan
				}
			}
		}
		if len(chunk) < revChunk {
			cursor = "" // the oldest entry was read
			break
		}
	}
	if cursor != "" {
		page.Next = template.URL(h.opts.Prefix + "history?" + f.query(cursor))
		page.Exhausted = len(page.Rows) < h.opts.PageSize
	}
	h.render(w, r, "history", page)
}

// match turns e into a history row when it settles something and passes f.
func (h *Handler) match(ctx context.Context, e approval.Entry, f filter, approver string) (historyRow, bool) {
	switch e.Event {
	case approval.EventDecided, approval.EventApprovalVote, approval.EventExpired, approval.EventCancelled,
		approval.EventRunNow, approval.EventWindowElapsed,
		approval.EventAutoApproved, approval.EventRemembered, approval.EventPreauthorized, approval.EventCallRefused:
	default:
		return historyRow{}, false
	}
	if f.Tool != "" && !strings.EqualFold(e.Tool, f.Tool) {
		return historyRow{}, false
	}
	if approver != "" && strings.ToLower(e.Actor) != approver && strings.ToLower(h.opts.Names.Name(ctx, e.Actor)) != approver {
		return historyRow{}, false
	}
	if (!f.since.IsZero() && e.Time.Before(f.since)) || (!f.until.IsZero() && !e.Time.Before(f.until)) {
		return historyRow{}, false
	}
	d := auditreport.ParseEventData(e)
	st := rowStatus(e, d)
	if st == "" || (f.Status != "" && st != f.Status) {
		return historyRow{}, false
	}
	row := historyRow{At: e.Time, RequestID: e.RequestID, Tool: auditreport.Clean(e.Tool, 60), Approver: h.name(ctx, e.Actor),
		Status: st, Reason: auditreport.Clean(d.ReasonText(), 200)}
	if e.Event == approval.EventCallRefused {
		row.Reason = auditreport.Clean(d.Error, 200)
	}
	if dt, ok := d.DecisionTime(e.Time); ok && e.Event == approval.EventWindowElapsed {
		row.Created, row.Approver = e.Time.Add(-dt), "" // the clock decided: nobody cancelled
	} else if ok {
		row.TimeToDecide = duration.Format(dt)
		row.Created = e.Time.Add(-dt)
	} else if e.Event != approval.EventExpired && e.Event != approval.EventCancelled {
		row.Created = e.Time // gate outcomes and votes come right after the request
	}
	return row, true
}

// ---- one request ----

type storyPage struct {
	ID       string
	Tool     string
	Outcome  string
	Rows     []auditreport.Row
	Entries  []entryRow
	CardURL  string
	NotFound bool
	// Partial is the link that reads the whole stream, set when only the
	// part after the request's creation (less a margin) was read.
	Partial string
}

func (p storyPage) title() string { return "Request " + p.ID }

type entryRow struct {
	At      time.Time
	Seq     int64
	Event   string
	Actor   string
	Summary string
}

// maxIDLen bounds a request id taken from the URL (real ones are 30
// characters).
const maxIDLen = 100

func (h *Handler) serveStory(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if len(id) > maxIDLen {
		http.Error(w, "no such request", http.StatusNotFound)
		return
	}
	after := r.URL.Query().Get("after")
	if after != "" && auditreport.IDBefore(after) == "" {
		after = "" // not a stream id: read everything
	}
	t, err := auditreport.ReadStoryAfter(r.Context(), h.opts.Entries, id, after)
	if err != nil {
		h.fail(w, r, "audit stream", err)
		return
	}
	page := storyPage{ID: auditreport.Clean(id, maxIDLen)}
	if after != "" {
		page.Partial = h.opts.Prefix + "requests/" + url.PathEscape(id)
	}
	if t == nil {
		page.NotFound = true
		w.WriteHeader(http.StatusNotFound)
		h.render(w, r, "story", page)
		return
	}
	page.Tool, page.Outcome, page.Rows = auditreport.Clean(t.Tool, 80), t.Outcome(), t.Rows()
	for i := range page.Rows {
		page.Rows[i].Value = h.withNames(r.Context(), page.Rows[i].Value)
	}
	page.CardURL, _ = h.card(r.Context(), t.Card)
	for _, e := range t.Entries {
		page.Entries = append(page.Entries, entryRow{At: e.Time, Seq: e.Seq, Event: string(e.Event),
			Actor: h.name(r.Context(), e.Actor), Summary: h.entrySummary(r.Context(), e)})
	}
	h.render(w, r, "story", page)
}

// entrySummary is the entry's one-line summary (as `audit tail` prints
// it) without the arguments and results, which the story's rows above the
// entries show as fields: the line stays short and free of JSON.
func (h *Handler) entrySummary(ctx context.Context, e approval.Entry) string {
	var data map[string]json.RawMessage
	if json.Unmarshal(e.Data, &data) == nil {
		cut := false
		for _, k := range []string{"args", "original_args", "result"} {
			if _, ok := data[k]; ok {
				delete(data, k)
				cut = true
			}
		}
		if cut {
			if b, err := json.Marshal(data); err == nil {
				e.Data = b
			}
		}
	}
	return h.withNames(ctx, auditreport.Summarize(e))
}

// ---- chain ----

// chainStatus is the result of one Verify.
type chainStatus struct {
	Checked  bool // false until the chain page was opened
	At       time.Time
	Took     string
	Intact   bool
	Entries  int
	Last     *entryRow // newest entry before Verify began: covered by it
	LastID   string
	Break    *approval.ChainError
	BadEntry *entryRow
	Err      string // Redis failed: nothing is known
}

func (h *Handler) chainNow() chainStatus {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.chain
}

func (h *Handler) serveChain(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	h.mu.Lock()
	startedBefore := h.verifies
	h.mu.Unlock()
	select {
	case h.verifying <- struct{}{}:
	case <-ctx.Done():
		return // the client went away while another verification ran
	}
	defer func() { <-h.verifying }()
	h.mu.Lock()
	if h.verifies > startedBefore && h.chain.Err == "" {
		// A verification that started after this request arrived finished
		// while it waited: its answer is as fresh as a new one.
		last := h.chain
		h.mu.Unlock()
		h.render(w, r, "chain", last)
		return
	}
	h.verifies++
	h.mu.Unlock()
	start := h.opts.Now()
	st := chainStatus{Checked: true, At: start}
	// The newest entry before Verify starts is one Verify must reach.
	last, err := h.opts.Entries.RevRange(ctx, "", 1)
	if err == nil && len(last) == 1 {
		e := last[0]
		st.Last, st.LastID = &entryRow{At: e.Time, Seq: e.Seq, Event: string(e.Event), Actor: h.name(ctx, e.Actor), Summary: h.withNames(ctx, auditreport.Summarize(e))}, e.ID
	}
	n, verr := h.opts.Entries.Verify(ctx)
	if err == nil {
		err = verr
	}
	var ce *approval.ChainError
	switch {
	case errors.As(verr, &ce):
		st.Entries, st.Break = n, ce
		if ce.ID != "" {
			if page, rerr := h.opts.Entries.Range(ctx, auditreport.IDBefore(ce.ID), 1); rerr == nil && len(page) == 1 && page[0].ID == ce.ID {
				e := page[0]
				st.BadEntry = &entryRow{At: e.Time, Seq: e.Seq, Event: string(e.Event), Actor: h.name(ctx, e.Actor), Summary: h.withNames(ctx, auditreport.Summarize(e))}
			}
		}
	case err != nil:
		h.opts.Logger.Error("audit view verify", "err", err)
		st.Err = "the audit stream could not be read; see the logs"
	default:
		st.Intact, st.Entries = true, n
	}
	if took := h.opts.Now().Sub(start); took > 0 {
		st.Took = duration.Format(took)
	}
	h.mu.Lock()
	h.chain = st
	h.mu.Unlock()
	h.render(w, r, "chain", st)
}

func (chainStatus) title() string { return "Audit chain" }
