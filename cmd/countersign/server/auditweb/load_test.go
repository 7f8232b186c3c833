package auditweb_test

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/replay"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
)

// mailLoad records n requests of send_email by api:mailer, each decided
// 20 s after it was asked: approved unedited, but every fifth rejected
// (and about another recipient), one request a minute from start.
func mailLoad(f *fakeAudit, start time.Time, n int) {
	for i := range n {
		at := start.Add(time.Duration(i) * time.Minute)
		id := fmt.Sprintf("req_mail%06d", i)
		to, verdict := "ops@example.com", approval.VerdictApprove
		if i%5 == 4 {
			to, verdict = "boss@evil.example", approval.VerdictReject
		}
		f.Append(at, approval.Record{Event: approval.EventRequested, RequestID: id, Actor: "api:mailer", Tool: "send_email",
			Data: approval.RequestedEvent{CallID: id, Args: []byte(fmt.Sprintf(`{"to":%q,"subject":"Nightly report %d"}`, to, i%50)), Quorum: 1, Requester: "api:mailer"}})
		f.Append(at.Add(20*time.Second), approval.Record{Event: approval.EventDecided, RequestID: id, Actor: "U0ANN", Tool: "send_email",
			Data: approval.DecidedEvent{Verdict: verdict, DecisionMS: 20000}})
	}
}

func mailSuggester(f *fakeAudit) auditweb.Suggester {
	p := replay.Policy{Policy: approval.Policy{Version: 1, Tools: map[string]approval.ToolPolicy{
		"send_email": {Review: approval.ReviewAlways, Decisions: []approval.Verdict{approval.VerdictApprove, approval.VerdictReject}},
		"lookup":     {Review: approval.ReviewAlways},
	}}}
	return func(since time.Time) (*replay.Suggester, error) {
		return replay.NewSuggester(replay.SuggestOptions{Current: p, Since: since, Min: 20})
	}
}

// TestLoadPage: requests per tool per week, the median time to decide,
// the share approved unedited, and the suggestion with its replay.
func TestLoadPage(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	f := &fakeAudit{}
	mailLoad(f, now.Add(-10*24*time.Hour), 30) // week 3 of the 30-day window (days 20–27)
	tests := []struct {
		name    string
		suggest bool
		want    []string
		lacks   []string
	}{
		{"with the policy", true, []string{
			`<tr><td>send_email</td><td>30</td><td>0</td><td>0</td><td>30</td><td>0</td><td>0</td><td>20s</td><td>80% of 30</td></tr>`,
			"send_email</b> asked for by api:mailer: 24 approvals unedited",
			"24 past calls would run without a person, 0 of them declined by a person, 6 declined calls still asked",
			"mode: auto",
			`args[&#34;to&#34;] == &#34;ops@example.com&#34;`,
		}, nil},
		{"without it", false, []string{"<td>80% of 30</td>", "Suggestions need the policy in force"}, []string{"mode: auto", "Draw suggestions"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			h := newView(t, f, now, func(o *auditweb.Options) {
				if tc.suggest {
					o.Suggest = mailSuggester(f)
				}
			})
			code, body := get(t, h, "/audit/load?since=30d&suggest=1")
			if code != http.StatusOK {
				t.Fatalf("GET /audit/load = %d\n%s", code, body)
			}
			for _, w := range tc.want {
				if !strings.Contains(body, w) {
					t.Errorf("load page lacks %q\n%s", w, body)
				}
			}
			for _, b := range tc.lacks {
				if strings.Contains(body, b) {
					t.Errorf("load page has %q", b)
				}
			}
		})
	}
}

// BenchmarkLoadPage100K serves the load page over 100,000 entries (50,000
// requests of one tool, each decided, ≈ 35 days) with its suggestion drawn
// and replayed, as the page always shows it; figures in
// docs/performance.md.
//
//	go test ./cmd/countersign/server/auditweb -run '^$' -bench LoadPage100K -benchtime 5x
func BenchmarkLoadPage100K(b *testing.B) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	f := &fakeAudit{}
	mailLoad(f, now.Add(-35*24*time.Hour), 50_000)
	h := newView(b, f, now, func(o *auditweb.Options) { o.Suggest = mailSuggester(f) })
	const path, want = "/audit/load?since=90d", "40,000 past calls would run without a person"
	b.ReportAllocs()
	// Building the 100,000 entries (hashing each) is not the page's time.
	b.ResetTimer()
	for range b.N {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		req.Header.Set("Authorization", "Bearer t0ken")
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
			b.Fatalf("GET %s = %d, lacks %q\n%s", path, rec.Code, want, rec.Body.String())
		}
	}
}

// readCounter counts the entries the view reads forward (Range).
type readCounter struct {
	*fakeAudit
	read int
}

func (c *readCounter) Range(ctx context.Context, afterID string, count int64) ([]approval.Entry, error) {
	es, err := c.fakeAudit.Range(ctx, afterID, count)
	c.read += len(es)
	return es, err
}

// TestLoadPageSuggestsInTwoPasses: the page shows its suggestions without
// being asked, and reads the window twice whatever the number of rules it
// suggests (one pass for the load and the drafting, one to replay every
// rule), not once more per rule.
func TestLoadPageSuggestsInTwoPasses(t *testing.T) {
	now := time.Date(2026, 12, 7, 12, 0, 0, 0, time.UTC)
	f := &fakeAudit{}
	start := now.Add(-10 * 24 * time.Hour)
	mailLoad(f, start, 30)
	for i := range 25 {
		at := start.Add(time.Duration(i)*time.Minute + 30*time.Second)
		id := fmt.Sprintf("req_look%06d", i)
		f.Append(at, approval.Record{Event: approval.EventRequested, RequestID: id, Actor: "api:reader", Tool: "lookup",
			Data: approval.RequestedEvent{CallID: id, Args: []byte(fmt.Sprintf(`{"order_id":"ORD-%04d"}`, i)), Quorum: 1, Requester: "api:reader"}})
		f.Append(at.Add(5*time.Second), approval.Record{Event: approval.EventDecided, RequestID: id, Actor: "U0BOB", Tool: "lookup",
			Data: approval.DecidedEvent{Verdict: approval.VerdictApprove, DecisionMS: 5000}})
	}
	entries := &readCounter{fakeAudit: f}
	h := newView(t, f, now, func(o *auditweb.Options) {
		o.Entries = entries
		o.Suggest = mailSuggester(f)
	})
	code, body := get(t, h, "/audit/load?since=30d")
	for _, w := range []string{
		"send_email</b> asked for by api:mailer: 24 approvals unedited",
		"lookup</b> asked for by api:reader: 25 approvals unedited",
		`args[&#34;order_id&#34;].matches(r&#34;^ORD-00[0-9]{2,2}$&#34;)`,
	} {
		if !strings.Contains(body, w) {
			t.Errorf("GET /audit/load lacks %q\n%s", w, body)
		}
	}
	// The window's entries twice, and the replay's look at the stream's
	// first entry (is it whole?).
	if n := len(f.entries); code != http.StatusOK || entries.read != 2*n+1 {
		t.Errorf("GET /audit/load = %d and read %d entries; want 200 and %d (the %d entries twice, and the first once more)", code, entries.read, 2*n+1, n)
	}
}
