package auditweb_test

import (
	"context"
	"errors"
	"html"
	"net/http"
	"net/http/httptest"
	"net/url"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
)

var base = time.Date(2026, 11, 30, 9, 0, 0, 0, time.UTC)

// get fetches path from h with the bearer token and returns status and body.
func get(tb testing.TB, h http.Handler, path string) (int, string) {
	tb.Helper()
	req := httptest.NewRequest(http.MethodGet, path, nil)
	req.Header.Set("Authorization", "Bearer t0ken")
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, req)
	return rec.Code, rec.Body.String()
}

func fixture(tb testing.TB, configure func(*auditweb.Options)) (*fakeAudit, *auditweb.Handler) {
	tb.Helper()
	f := &fakeAudit{}
	history(f, base)
	return f, newView(tb, f, base.Add(2*time.Hour), configure)
}

func TestAuditWebNewNeedsCredentials(t *testing.T) {
	f := &fakeAudit{}
	tests := []struct {
		name string
		opts auditweb.Options
		ok   bool
	}{
		{"nothing", auditweb.Options{Entries: f, Pending: f}, false},
		{"user without password", auditweb.Options{Entries: f, Pending: f, User: "ops"}, false},
		{"password without user", auditweb.Options{Entries: f, Pending: f, Password: "x"}, false},
		{"token", auditweb.Options{Entries: f, Pending: f, Token: "x"}, true},
		{"user and password", auditweb.Options{Entries: f, Pending: f, User: "ops", Password: "x"}, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := auditweb.New(tt.opts)
			if got := err == nil; got != tt.ok {
				t.Fatalf("New(%s) error = %v, want ok %v", tt.name, err, tt.ok)
			}
			if !tt.ok && tt.opts.Entries != nil && !errors.Is(err, auditweb.ErrNoCredentials) {
				t.Errorf("New(%s) = %v, want ErrNoCredentials", tt.name, err)
			}
		})
	}
}

func TestAuditWebAuth(t *testing.T) {
	_, h := fixture(t, nil)
	tests := []struct {
		name  string
		setup func(*http.Request)
		want  int
	}{
		{"no credentials", func(*http.Request) {}, http.StatusUnauthorized},
		{"right token", func(r *http.Request) { r.Header.Set("Authorization", "Bearer t0ken") }, http.StatusOK},
		{"wrong token", func(r *http.Request) { r.Header.Set("Authorization", "Bearer t0ke") }, http.StatusUnauthorized},
		{"token as basic password", func(r *http.Request) { r.SetBasicAuth("ops", "t0ken") }, http.StatusUnauthorized},
		{"right basic", func(r *http.Request) { r.SetBasicAuth("ops", "s3cret") }, http.StatusOK},
		{"wrong password", func(r *http.Request) { r.SetBasicAuth("ops", "s3cre") }, http.StatusUnauthorized},
		{"wrong user", func(r *http.Request) { r.SetBasicAuth("opz", "s3cret") }, http.StatusUnauthorized},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, "/audit/", nil)
			tt.setup(req)
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("GET /audit/ with %s = %d, want %d", tt.name, rec.Code, tt.want)
			}
			if tt.want == http.StatusUnauthorized {
				if got := rec.Header().Get("WWW-Authenticate"); !strings.HasPrefix(got, "Basic ") {
					t.Errorf("WWW-Authenticate = %q, want a Basic challenge", got)
				}
				if strings.Contains(rec.Body.String(), "req_") {
					t.Errorf("401 body shows audit data: %q", rec.Body.String())
				}
			}
		})
	}
}

func TestAuditWebReadOnly(t *testing.T) {
	_, h := fixture(t, nil)
	for _, method := range []string{http.MethodPost, http.MethodPut, http.MethodPatch, http.MethodDelete, http.MethodOptions} {
		t.Run(method, func(t *testing.T) {
			req := httptest.NewRequest(method, "/audit/history", strings.NewReader("x=1"))
			req.Header.Set("Authorization", "Bearer t0ken")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != http.StatusMethodNotAllowed || rec.Header().Get("Allow") != "GET, HEAD" {
				t.Errorf("%s /audit/history = %d Allow %q, want 405 Allow \"GET, HEAD\"", method, rec.Code, rec.Header().Get("Allow"))
			}
		})
	}
	t.Run("HEAD", func(t *testing.T) {
		req := httptest.NewRequest(http.MethodHead, "/audit/", nil)
		req.Header.Set("Authorization", "Bearer t0ken")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK {
			t.Errorf("HEAD /audit/ = %d, want 200", rec.Code)
		}
	})
}

func TestAuditWebPagesAndHeaders(t *testing.T) {
	_, h := fixture(t, nil)
	tests := []struct {
		name, path string
		want       int
		contains   []string
	}{
		{"pending", "/audit/", http.StatusOK, []string{"Pending requests"}},
		{"history", "/audit/history", http.StatusOK, []string{"req_approve", "req_edit"}},
		{"story", "/audit/requests/req_edit", http.StatusOK, []string{"partial refund only"}},
		{"unknown request", "/audit/requests/req_nope", http.StatusNotFound, []string{"No audit entries"}},
		{"charts", "/audit/charts?since=30d", http.StatusOK, []string{"<svg", "Outcomes per tool"}},
		{"chain", "/audit/chain", http.StatusOK, []string{"Intact."}},
		{"stylesheet", "/audit/style.css", http.StatusOK, []string{"font"}},
		{"unknown page", "/audit/nope", http.StatusNotFound, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			req := httptest.NewRequest(http.MethodGet, tt.path, nil)
			req.Header.Set("Authorization", "Bearer t0ken")
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			if rec.Code != tt.want {
				t.Fatalf("GET %s = %d, want %d:\n%s", tt.path, rec.Code, tt.want, rec.Body)
			}
			for _, s := range tt.contains {
				if !strings.Contains(rec.Body.String(), s) {
					t.Errorf("GET %s: body lacks %q", tt.path, s)
				}
			}
			csp := rec.Header().Get("Content-Security-Policy")
			if !strings.Contains(csp, "default-src 'none'") || strings.Contains(csp, "script-src") {
				t.Errorf("GET %s: Content-Security-Policy = %q, want default-src 'none' and no script source", tt.path, csp)
			}
		})
	}
}

// hostileTag matches markup the hostile argument would inject if it were
// not escaped.
var hostileTag = regexp.MustCompile(`(?i)<script|<img`)

func TestAuditWebEscapesHostileText(t *testing.T) {
	f, h := fixture(t, nil)
	f.SetPending(&approval.Request{ID: "req_hostile", Tool: "send_email<b>", Requester: dave,
		Args:    []byte(`{"body":"<script>alert(1)</script>","note":"<img src=x onerror=alert(1)>"}`),
		Created: base, Deadline: base.Add(3 * time.Hour), Quorum: 1, Approvers: approval.Approvers{Users: []string{alice}}})
	for _, path := range []string{"/audit/", "/audit/history", "/audit/requests/req_reject", "/audit/charts?since=90d"} {
		t.Run(path, func(t *testing.T) {
			code, body := get(t, h, path)
			if code != http.StatusOK {
				t.Fatalf("GET %s = %d", path, code)
			}
			if m := hostileTag.FindString(body); m != "" {
				t.Errorf("GET %s: body contains unescaped %q", path, m)
			}
		})
	}
	_, story := get(t, h, "/audit/requests/req_reject")
	if !strings.Contains(story, html.EscapeString("<script>alert(1)</script>")) {
		t.Errorf("story does not show the hostile argument as text")
	}
	if strings.Contains(story, "hunter2") || !strings.Contains(story, "[redacted]") {
		t.Errorf("story shows the secret argument, or not as [redacted]")
	}
	_, pending := get(t, h, "/audit/")
	if !strings.Contains(pending, html.EscapeString(`<img src=x onerror=alert(1)>`)) {
		t.Errorf("pending page does not show the hostile argument as text")
	}
}

// rowIDs returns the request ids of the history table, in order.
var rowLink = regexp.MustCompile(`href="/audit/requests/([^"?]+)(\?[^"]*)?" class="mono"`)

func rowIDs(body string) []string {
	var ids []string
	for _, m := range rowLink.FindAllStringSubmatch(body, -1) {
		ids = append(ids, m[1])
	}
	return ids
}

func TestAuditWebHistoryFilters(t *testing.T) {
	_, h := fixture(t, nil)
	tests := []struct {
		name  string
		query string
		want  []string // request ids, newest first
	}{
		{"all", "", []string{"req_expire", "req_quorum", "req_quorum", "req_reject", "req_edit", "req_approve", "req_auto"}},
		{"tool", "tool=refund", []string{"req_edit", "req_approve"}},
		{"approver by name", "approver=alice", []string{"req_quorum", "req_approve"}},
		{"approver by id", "approver=" + bob, []string{"req_quorum", "req_edit"}},
		{"status", "status=rejected", []string{"req_reject"}},
		{"status vote", "status=vote", []string{"req_quorum"}},
		{"status expired", "status=expired", []string{"req_expire"}},
		{"tool and status", "tool=send_email&status=expired", []string{"req_expire"}},
		{"within 1h: only the expiry", "since=1h", []string{"req_expire"}},
		{"until before the edit", "until=" + base.Format("2006-01-02T15:04"), []string{"req_approve", "req_auto"}},
		{"nothing matches", "tool=nope", nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			code, body := get(t, h, "/audit/history?"+tt.query)
			if code != http.StatusOK {
				t.Fatalf("GET /audit/history?%s = %d", tt.query, code)
			}
			if got := rowIDs(body); strings.Join(got, ",") != strings.Join(tt.want, ",") {
				t.Errorf("history?%s rows = %v, want %v", tt.query, got, tt.want)
			}
		})
	}
}

var olderLink = regexp.MustCompile(`href="/audit/history\?([^"]+)" id="older"`)

func TestAuditWebHistoryPages(t *testing.T) {
	tests := []struct {
		name      string
		pageSize  int
		scanLimit int
		query     string
		want      int // rows over all pages
	}{
		{"two per page", 2, 0, "", 7},
		{"one per page", 1, 0, "", 7},
		{"scan limit smaller than the stream", 50, 3, "", 7},
		{"filtered, small scan limit", 50, 2, "tool=refund", 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, h := fixture(t, func(o *auditweb.Options) { o.PageSize, o.ScanLimit = tt.pageSize, tt.scanLimit })
			var all []string
			q := tt.query
			for pages := 0; ; pages++ {
				if pages > 50 {
					t.Fatal("history never ends")
				}
				_, body := get(t, h, "/audit/history?"+q)
				all = append(all, rowIDs(body)...)
				m := olderLink.FindStringSubmatch(body)
				if m == nil {
					break
				}
				q = html.UnescapeString(m[1])
				if v, _ := url.ParseQuery(q); v.Get("tool") != "" && v.Get("tool") != "refund" {
					t.Fatalf("next page lost the filter: %q", q)
				}
			}
			if len(all) != tt.want {
				t.Errorf("rows over all pages = %v (%d), want %d", all, len(all), tt.want)
			}
		})
	}
}

func TestAuditWebStoryIsAuditShow(t *testing.T) {
	f, h := fixture(t, nil)
	for _, id := range []string{"req_approve", "req_edit", "req_reject", "req_expire", "req_quorum"} {
		t.Run(id, func(t *testing.T) {
			tr, err := auditreport.ReadStory(context.Background(), f, id)
			if err != nil || tr == nil {
				t.Fatalf("ReadStory(%s) = %v, %v", id, tr, err)
			}
			_, body := get(t, h, "/audit/requests/"+id)
			for _, r := range tr.Rows() {
				if len(r.Args) > 0 {
					continue // shown as fields, checked below
				}
				want := r.Value
				for id, name := range people {
					want = strings.ReplaceAll(want, id, name) // the page names people
				}
				if !strings.Contains(body, html.EscapeString(want)) {
					t.Errorf("story page of %s lacks row %s: %q", id, r.Key, r.Value)
				}
			}
			if strings.Contains(body, `{&#34;`) {
				t.Errorf("story page of %s shows raw JSON arguments", id)
			}
		})
	}
	_, body := get(t, h, "/audit/requests/req_approve")
	if !strings.Contains(body, `href="https://acme.slack.com/archives/C0APPROVALS/p1700000000000100"`) {
		t.Errorf("story page lacks the card link")
	}
	if !strings.Contains(body, "<dt>amount</dt><dd>64</dd>") {
		t.Errorf("story page does not show the arguments as fields")
	}
}

func TestAuditWebStoryHint(t *testing.T) {
	f, h := fixture(t, nil)
	_, hist := get(t, h, "/audit/history")
	var links []string
	for _, m := range rowLink.FindAllStringSubmatch(hist, -1) {
		if m[2] == "" && m[1] != "req_expire" {
			t.Errorf("history links %s without a hint", m[1])
		}
		links = append(links, "/audit/requests/"+m[1]+html.UnescapeString(m[2]))
	}
	for _, link := range links {
		id, _, _ := strings.Cut(strings.TrimPrefix(link, "/audit/requests/"), "?")
		if id == "req_auto" {
			continue // a gate outcome: no request entry of its own
		}
		tr, err := auditreport.ReadStory(context.Background(), f, id)
		if err != nil || tr == nil {
			t.Fatalf("ReadStory(%s) = %v", id, err)
		}
		_, whole := get(t, h, "/audit/requests/"+id)
		_, hinted := get(t, h, link)
		strip := regexp.MustCompile(`(?s)<p class="muted">Read from.*?</p>`)
		if got, want := strip.ReplaceAllString(hinted, ""), whole; got != want {
			t.Errorf("story of %s through the history's link %s differs from the whole-stream story", id, link)
		}
	}
	// A hint later than the request: nothing found, and a way to the rest.
	code, body := get(t, h, "/audit/requests/req_edit?after=9999999999999-0")
	if code != http.StatusNotFound || !strings.Contains(body, `href="/audit/requests/req_edit">read the whole stream`) {
		t.Errorf("story with a late hint = %d, want 404 with a link to the whole stream:\n%s", code, body)
	}
}

func TestAuditWebPending(t *testing.T) {
	f, h := fixture(t, nil)
	now := base.Add(2 * time.Hour)
	f.SetPending(
		&approval.Request{ID: "req_wait", Tool: "refund", Requester: dave, Args: []byte(`{"amount":12}`), Created: now.Add(-90 * time.Second),
			Deadline: now.Add(10 * time.Minute), Quorum: 2, Approvals: []approval.Decision{{Approver: bob}},
			Approvers: approval.Approvers{Users: []string{alice, bob}, Usergroups: []string{"S0LEADS"}},
			Card:      approval.CardRef{Channel: "C0APPROVALS", TS: "1700000000.000200"}},
		&approval.Request{ID: "req_late", Tool: "deploy", Requester: dave, Created: now.Add(-2 * time.Hour), Deadline: now.Add(-5 * time.Second),
			Approvers: approval.Approvers{ChannelMembers: true, AllowSelf: true}},
		&approval.Request{ID: "req_after", Tool: "set_priority", Requester: dave, Mode: approval.ModeAfter, Created: now.Add(-time.Minute),
			Deadline: now.Add(time.Minute), Approvers: approval.Approvers{ChannelMembers: true}},
		&approval.Request{ID: "req_ask", Tool: "ask", Kind: approval.KindContact, Requester: dave, Created: now.Add(-time.Minute),
			Deadline: now.Add(time.Hour), Approvers: approval.Approvers{ChannelMembers: true}},
	)
	_, body := get(t, h, "/audit/")
	for _, want := range []string{"req_wait", "1m30s", "in 10m", "alice, bob, group S0LEADS", "(except the requester)", "1 of 2 approvals",
		`href="https://acme.slack.com/archives/C0APPROVALS/p1700000000000200"`, "dave",
		"req_late", "overdue by 5s", "members of the approvals channel", "not posted yet"} {
		if !strings.Contains(body, html.EscapeString(want)) && !strings.Contains(body, want) {
			t.Errorf("pending page lacks %q", want)
		}
	}
	// What each deadline does, said on its row: never "a deadline passing
	// is a rejection" above a call that runs at its deadline.
	if strings.Contains(body, "A deadline passing is a rejection") {
		t.Errorf("pending page says every deadline is a rejection, above a review-after call that runs at its deadline")
	}
	rows := pendingRows(body)
	for id, want := range map[string][]string{
		"req_wait":  {"then it is rejected, unless decided", "1 of 2 approvals"},
		"req_late":  {"then it is rejected, unless decided"},
		"req_after": {"then it runs, unless an approver cancels it", "may cancel it or run it now"},
		"req_ask":   {"then it expires unanswered", "may answer"},
	} {
		row, ok := rows[id]
		if !ok {
			t.Errorf("pending page has no row of %s", id)
			continue
		}
		for _, w := range want {
			if !strings.Contains(row, w) {
				t.Errorf("pending row of %s lacks %q:\n%s", id, w, row)
			}
		}
		if id != "req_wait" && id != "req_late" && strings.Contains(row, "rejected") {
			t.Errorf("pending row of %s says it is rejected at its deadline:\n%s", id, row)
		}
	}
}

// pendingRows is the pending table's rows by the request id each names.
func pendingRows(body string) map[string]string {
	rows := map[string]string{}
	for _, tr := range strings.Split(body, "<tr>")[1:] {
		tr, _, _ = strings.Cut(tr, "</tr>")
		if id := regexp.MustCompile(`req_[a-z]+`).FindString(tr); id != "" {
			rows[id] = tr
		}
	}
	return rows
}

func TestAuditWebChain(t *testing.T) {
	f, h := fixture(t, nil)
	_, body := get(t, h, "/audit/chain")
	if !strings.Contains(body, "<strong>Intact.</strong> 15 entries") || !strings.Contains(body, "Last verified entry") {
		t.Fatalf("chain page of an intact stream:\n%s", body)
	}
	_, pending := get(t, h, "/audit/")
	if !strings.Contains(pending, "chain intact") {
		t.Errorf("pages do not show the last verification")
	}
	f.Tamper(4, `{"verdict":"reject"}`)
	_, body = get(t, h, "/audit/chain")
	if !strings.Contains(body, "<strong>BROKEN</strong> after 4 intact entries") || !strings.Contains(body, "entry edited") {
		t.Errorf("chain page of a tampered stream:\n%s", body)
	}
}

func TestAuditWebReadFailure(t *testing.T) {
	f, h := fixture(t, nil)
	f.failRead = errors.New("redis: connection refused at 10.0.0.7")
	for _, path := range []string{"/audit/", "/audit/history", "/audit/requests/req_edit", "/audit/charts"} {
		code, body := get(t, h, path)
		if code != http.StatusBadGateway || strings.Contains(body, "10.0.0.7") {
			t.Errorf("GET %s with Redis down = %d %q, want 502 without the detail", path, code, body)
		}
	}
}

func TestAuditWebCharts(t *testing.T) {
	_, h := fixture(t, nil)
	_, body := get(t, h, "/audit/charts?since=30d")
	for _, want := range []string{`<title>edited: 1 of 2 (50%)</title>`, `<title>rejected: 1 of 1 (100%)</title>`,
		`>alice</text>`, `>carol</text>`, `id="chart-review"`, "4 decisions"} {
		if !strings.Contains(body, want) {
			t.Errorf("charts page lacks %q", want)
		}
	}
	_, body = get(t, h, "/audit/charts?since=bogus")
	if !strings.Contains(body, "showing 7d") {
		t.Errorf("charts page with a bad window does not say so")
	}
}

func TestAuditWebNoExternalResources(t *testing.T) {
	_, h := fixture(t, nil)
	ext := regexp.MustCompile(`(?i)(src|href)="(https?:)?//`)
	for _, path := range []string{"/audit/", "/audit/history", "/audit/charts", "/audit/chain"} {
		_, body := get(t, h, path)
		for _, m := range ext.FindAllString(body, -1) {
			if !strings.Contains(m, "href") {
				t.Errorf("GET %s loads %s", path, m)
			}
		}
		if strings.Contains(body, "<script") {
			t.Errorf("GET %s has a script", path)
		}
	}
}

// countingEntries is a fakeAudit whose Verify records how many run at once.
type countingEntries struct {
	*fakeAudit
	inFlight, most, calls atomic.Int32
}

func (c *countingEntries) Verify(ctx context.Context) (int, error) {
	n := c.inFlight.Add(1)
	defer c.inFlight.Add(-1)
	c.calls.Add(1)
	for {
		m := c.most.Load()
		if n <= m || c.most.CompareAndSwap(m, n) {
			break
		}
	}
	return c.fakeAudit.Verify(ctx)
}

func TestAuditWebChainOneVerifyAtATime(t *testing.T) {
	f := &fakeAudit{}
	history(f, base)
	c := &countingEntries{fakeAudit: f}
	h := newView(t, f, base, func(o *auditweb.Options) { o.Entries = c })
	var wg sync.WaitGroup
	const requests = 16
	for range requests {
		wg.Go(func() {
			if code, body := get(t, h, "/audit/chain"); code != http.StatusOK || !strings.Contains(body, "Intact.") {
				t.Errorf("GET /audit/chain = %d", code)
			}
		})
	}
	wg.Wait()
	if m := c.most.Load(); m != 1 {
		t.Errorf("%d verifications ran at once, want 1", m)
	}
	if n := c.calls.Load(); n < 1 || n > requests {
		t.Errorf("Verify ran %d times for %d requests", n, requests)
	}
}
