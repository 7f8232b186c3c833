package auditreport_test

import (
	"bytes"
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
)

// people names the users it knows, as Slack's users.info does.
type people map[string]string

func (p people) Name(_ context.Context, id string) string { return p[id] }

// namedLog is a refund asked by Alice (requester in the run's start),
// approved by Bob, run by the agent; Carol (unknown to the directory)
// clicked too late.
func namedLog() *memLog {
	at := func(n int) time.Time { return time.Date(2026, 12, 3, 10, n, 0, 0, time.UTC) }
	id := func(n int) string { return strconv.FormatInt(at(n).UnixMilli(), 10) + "-0" } // as Redis names them
	return &memLog{entries: []approval.Entry{
		{ID: id(1), Seq: 1, Time: at(1), Event: approval.EventRunStarted, RunID: "run_1", Actor: "U0ALICE01",
			Data: []byte(`{"origin":{"channel":"C0TASKS01","thread_ts":"1.0"},"text":"refund order 1234"}`)},
		{ID: id(2), Seq: 2, Time: at(2), Event: approval.EventRequested, RequestID: "req_a", RunID: "run_1", Tool: "refund", Actor: "agent",
			Data: []byte(`{"call_id":"c1","args":{"amount":64},"digest":"d1","deadline":"2026-12-03T11:00:00Z","quorum":1,"requester":"U0ALICE01"}`)},
		{ID: id(3), Seq: 3, Time: at(3), Event: approval.EventDecided, RequestID: "req_a", RunID: "run_1", Tool: "refund", Actor: "U0BOB0001",
			Data: []byte(`{"verdict":"approve","digest":"d1","status":"approved","created":"2026-12-03T10:02:00Z","decision_ms":60000}`)},
		{ID: id(4), Seq: 4, Time: at(4), Event: approval.EventDecisionRefuse, RequestID: "req_a", Tool: "refund", Actor: "U0CAROL01",
			Data: []byte(`{"verdict":"approve","reason":"already decided"}`)},
		{ID: id(5), Seq: 5, Time: at(5), Event: approval.EventCardPosted, RequestID: "req_a", RunID: "run_1", Tool: "refund", Actor: "bot",
			Data: []byte(`{"channel":"G0APPROV1","ts":"1796613720.890885"}`)},
	}}
}

// TestCommandsPrintNames: tail, show and stats print the names people
// know (as the audit view does) when the command has Names; an id the
// directory cannot name stays an id; without Names (--ids) every id is
// printed as recorded, and JSON output keeps ids.
func TestCommandsPrintNames(t *testing.T) {
	names := people{"U0ALICE01": "Alice Archer", "U0BOB0001": "Bob Baker", "G0APPROV1": "#approvals"}
	now := time.Date(2026, 12, 3, 12, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		cmd   auditreport.Command
		names bool
		want  []string
		never []string
	}{
		{name: "tail", cmd: auditreport.Command{Name: "tail", N: 10}, names: true,
			want: []string{"Alice Archer", "Bob Baker", "U0CAROL01", "channel=#approvals"}, never: []string{"U0ALICE01", "U0BOB0001", "G0APPROV1"}},
		{name: "show", cmd: auditreport.Command{Name: "show", RequestID: "req_a"}, names: true,
			want: []string{"Bob Baker", "U0CAROL01", "to #approvals"}, never: []string{"U0BOB0001", "G0APPROV1"}},
		{name: "stats", cmd: auditreport.Command{Name: "stats", Since: 24 * time.Hour}, names: true,
			want: []string{"Bob Baker"}, never: []string{"U0BOB0001"}},
		{name: "tail --ids", cmd: auditreport.Command{Name: "tail", N: 10},
			want: []string{"U0ALICE01", "U0BOB0001", "G0APPROV1"}, never: []string{"Alice Archer", "Bob Baker", "#approvals"}},
		{name: "show --ids", cmd: auditreport.Command{Name: "show", RequestID: "req_a"},
			want: []string{"U0BOB0001"}, never: []string{"Bob Baker"}},
		{name: "stats --ids", cmd: auditreport.Command{Name: "stats", Since: 24 * time.Hour},
			want: []string{"U0BOB0001"}, never: []string{"Bob Baker"}},
		{name: "tail --json", cmd: auditreport.Command{Name: "tail", N: 10, JSON: true}, names: true,
			want: []string{"U0ALICE01", "U0BOB0001"}, never: []string{"Bob Baker"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := tc.cmd
			if tc.names {
				c.Names = names
			}
			var out bytes.Buffer
			if _, err := c.Run(context.Background(), namedLog(), &out, now); err != nil {
				t.Fatalf("Run: %v", err)
			}
			for _, w := range tc.want {
				if !strings.Contains(out.String(), w) {
					t.Errorf("output lacks %q:\n%s", w, out.String())
				}
			}
			for _, n := range tc.never {
				if strings.Contains(out.String(), n) {
					t.Errorf("output shows %q:\n%s", n, out.String())
				}
			}
		})
	}
}
