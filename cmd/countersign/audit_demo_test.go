package main_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/clocktest"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store"
)

// startDemoClock is startDemo (Socket Mode) with an injected clock.
func startDemoClock(t *testing.T, clock *clocktest.Clock) *main.Demo {
	t.Helper()
	return MustStartDemo(t, &main.Demo{World: demo.World{Now: clock.Now}})
}

// startDemoForCLI is startDemoClock with the environment pointed at the
// demo's Redis and audit stream, so that main.Run(ctx, {"audit", ...})
// reads what the product wrote. Setting the environment keeps the test
// serial.
func startDemoForCLI(t *testing.T, clock *clocktest.Clock) *main.Demo {
	t.Helper()
	d := startDemoClock(t, clock)
	t.Setenv("REDIS_URL", storetestURL(t, d.Redis))
	t.Setenv("COUNTERSIGN_AUDIT_STREAM", d.Main.Config.AuditStream)
	return d
}

// cardsFor returns the top-level approvals cards of tool, decided or not,
// oldest first.
func cardsFor(d *main.Demo, tool string) []slacksim.Message {
	var out []slacksim.Message
	for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
		if m.ThreadTS == "" && m.BotID != "" && strings.Contains(string(m.Blocks), tool) {
			out = append(out, m)
		}
	}
	return out
}

// waitAudit blocks until the demo's audit stream holds an entry of
// request id with event ev (reading it with XREAD BLOCK, not sleeping),
// or fails after 30 s.
func waitAudit(t *testing.T, d *main.Demo, id string, ev approval.Event) {
	t.Helper()
	waitAuditN(t, d, 1, func(e approval.Entry) bool { return (id == "" || e.RequestID == id) && e.Event == ev })
}

// errEnoughEntries ends waitAuditN's Follow once n entries matched.
var errEnoughEntries = errors.New("enough entries")

// waitAuditN blocks until n entries of the demo's audit stream match.
func waitAuditN(t *testing.T, d *main.Demo, n int, match func(approval.Entry) bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	err := audit.Follow(ctx, "0-0", func(e approval.Entry) error {
		if match(e) {
			if n--; n == 0 {
				return errEnoughEntries
			}
		}
		return nil
	})
	if !errors.Is(err, errEnoughEntries) {
		t.Fatalf("waiting for audit entries: %v", err)
	}
}

// requestOfCard is the request id a card's buttons carry.
func requestOfCard(t *testing.T, m slacksim.Message) string {
	t.Helper()
	id := regexp.MustCompile(`req_[a-z0-9]+`).FindString(string(m.Blocks))
	if id == "" {
		t.Fatalf("card %s names no request id: %s", m.TS, m.Blocks)
	}
	return id
}

// demoHistory is what the scenario left in the audit stream.
type demoHistory struct {
	entries                            []approval.Entry
	email, refund, del, expire, lookup string // request ids
}

// requestOf returns the entry of request id with event ev.
func (h demoHistory) entry(t *testing.T, id string, ev approval.Event) approval.Entry {
	t.Helper()
	for _, e := range h.entries {
		if e.RequestID == id && e.Event == ev {
			return e
		}
	}
	t.Fatalf("no %s entry for request %s", ev, id)
	return approval.Entry{}
}

const (
	demoEmailSubject = "We're sorry about your table"
	demoRejectReason = "needs a manager: over the shipping policy"
	demoThinkTime    = 40 * time.Second // how long each approver looks at a card
)

// runDemoHistory plays the seeds' scenario through the workspace: the
// lookup runs by itself; the email is edited (a schema error first) and
// approved; the refund is rejected with a reason; a delete is refused for
// a non-lead and approved by the lead; one more email is left to expire.
// Approvers take demoThinkTime over each card.
func runDemoHistory(t *testing.T, d *main.Demo, clock *clocktest.Clock) demoHistory {
	t.Helper()
	ws, cast := d.Workspace, d.Cast
	alice, bob, carol := cast.Requester.ID, cast.Approver.ID, cast.SecondApprover.ID

	task := "<@" + slacksim.BotUserID + "> order 1234 arrived damaged — look it up, email an apology, refund the shipping"
	root, err := ws.PostMessage(alice, cast.Tasks.ID, task, "")
	if err != nil {
		t.Fatalf("PostMessage: %v", err)
	}
	waitWS(t, d, "email and refund cards", func() bool {
		return len(cardsFor(d, "send_email")) == 1 && len(cardsFor(d, "issue_refund")) == 1
	})
	email, refund := cardsFor(d, "send_email")[0], cardsFor(d, "issue_refund")[0]
	emailID, refundID := requestOfCard(t, email), requestOfCard(t, refund)
	// Both cards are recorded as posted before anyone looks at them.
	waitAudit(t, d, emailID, approval.EventCardPosted)
	waitAudit(t, d, refundID, approval.EventCardPosted)

	clock.Advance(demoThinkTime)
	if err := ws.Click(bob, cast.Approvals.ID, email.TS, "cs_edit"); err != nil {
		t.Fatalf("Click(edit): %v", err)
	}
	v := openModal(t, d, bob)
	res, err := ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "Hi"}})
	if err != nil || res.ResponseAction != "errors" {
		t.Fatalf("SubmitView(short subject) = %+v, %v; want a field error", res, err)
	}
	res, err = ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": demoEmailSubject}})
	if err != nil || !res.Closed {
		t.Fatalf("SubmitView(valid subject) = %+v, %v; want closed", res, err)
	}
	waitAudit(t, d, emailID, approval.EventDecided)
	// The email runs before the clock moves on, so its timings are its own.
	waitAudit(t, d, emailID, approval.EventExecuted)

	clock.Advance(demoThinkTime)
	if err := ws.Click(carol, cast.Approvals.ID, refund.TS, "cs_reject"); err != nil {
		t.Fatalf("Click(reject): %v", err)
	}
	rv := openModal(t, d, carol)
	if res, err := ws.SubmitView(carol, rv.ID, map[string]map[string]any{"reason": {"text": demoRejectReason}}); err != nil || !res.Closed {
		t.Fatalf("SubmitView(reason) = %+v, %v; want closed", res, err)
	}
	waitAudit(t, d, refundID, approval.EventDecided)
	waitBotReply(t, d, "the first run's answer", root, func() bool { return len(d.SoR.Emails()) == 1 }, demoRejectReason)

	// A delete: bob (an approver, not a lead) is refused; carol (a lead)
	// approves.
	delRoot, err := ws.PostMessage(bob, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> please delete customer C-300, they asked us to", "")
	if err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the delete card", func() bool { return len(cardsFor(d, "delete_customer")) == 1 })
	del := cardsFor(d, "delete_customer")[0]
	delID := requestOfCard(t, del)
	waitAudit(t, d, delID, approval.EventCardPosted)
	clock.Advance(demoThinkTime)
	if err := ws.Click(bob, cast.Approvals.ID, del.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(bob approve): %v", err)
	}
	waitWS(t, d, "bob's refusal", func() bool { return len(ws.Ephemerals(bob)) > 0 })
	waitAudit(t, d, delID, approval.EventDecisionRefuse)
	clock.Advance(demoThinkTime)
	freshStepUp(t, d, carol) // delete_customer asks a passkey (TestBrowserStepUp)
	if err := ws.Click(carol, cast.Approvals.ID, del.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(carol approve): %v", err)
	}
	waitBotReply(t, d, "the delete run's answer", delRoot, func() bool { return len(d.SoR.Deleted()) == 1 }, "C-300")

	// An email nobody answers: its 24 h deadline passes on the clock and
	// the sweeper expires it.
	expRoot, err := ws.PostMessage(alice, cast.Tasks.ID, "<@"+slacksim.BotUserID+"> order 9012 is late, email the customer an apology", "")
	if err != nil {
		t.Fatal(err)
	}
	waitWS(t, d, "the second email card", func() bool { return len(cardsFor(d, "send_email")) == 2 })
	waitAudit(t, d, requestOfCard(t, cardsFor(d, "send_email")[1]), approval.EventCardPosted)
	clock.Advance(24*time.Hour + time.Minute)
	waitBotReply(t, d, "the expiry told in the task thread", expRoot, nil, "expired")

	// All three runs have finished: nothing more will be appended.
	waitAuditN(t, d, 3, func(e approval.Entry) bool { return e.Event == approval.EventRunFinished })
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	var h demoHistory
	// The expired entry is appended by the sweeper before it updates the
	// card and wakes the run, so it is in the stream by now.
	if err := auditreport.Scan(context.Background(), audit, "", func(e approval.Entry) error {
		h.entries = append(h.entries, e)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	var emails []string
	for _, e := range h.entries {
		switch {
		case e.Event == approval.EventRequested && e.Tool == "send_email":
			emails = append(emails, e.RequestID)
		case e.Event == approval.EventRequested && e.Tool == "issue_refund":
			h.refund = e.RequestID
		case e.Event == approval.EventRequested && e.Tool == "delete_customer":
			h.del = e.RequestID
		case e.Event == approval.EventAutoApproved && e.Tool == "lookup_order" && h.lookup == "":
			h.lookup = e.RequestID
		}
	}
	if len(emails) != 2 || h.refund == "" || h.del == "" || h.lookup == "" {
		t.Fatalf("requests in the audit: emails %v, refund %q, delete %q, lookup %q", emails, h.refund, h.del, h.lookup)
	}
	h.email, h.expire = emails[0], emails[1]
	return h
}

// TestAuditOnDemoHistory runs every audit command on what the product
// itself wrote during the seeds' scenario, and checks that the output
// tells the true story.
func TestAuditOnDemoHistory(t *testing.T) {
	clock := clocktest.New(clocktest.Opts{Start: time.Now().UTC()})
	d := startDemoForCLI(t, clock)
	h := runDemoHistory(t, d, clock)
	ctx := t.Context()

	cli := func(args ...string) string {
		t.Helper()
		code, out, errOut := runCLI(ctx, args...)
		if code != 0 {
			t.Fatalf("%s = exit %d, stderr %q", strings.Join(args, " "), code, errOut)
		}
		return out
	}
	tail := cli("audit", "tail", "-n", "200")
	showEmail := cli("audit", "show", h.email)
	showRefund := cli("audit", "show", h.refund)
	showDelete := cli("audit", "show", h.del)
	showExpire := cli("audit", "show", h.expire)
	verify := cli("audit", "verify")
	export := cli("audit", "export", "--since", "24h", "--only", "rejected,edited")
	stats := cli("audit", "stats", "--since", "7d")
	showLookup := cli("audit", "show", h.lookup)
	t.Logf("audit tail:\n%s", tail)
	t.Logf("audit show (edited email):\n%s", showEmail)
	t.Logf("audit show (rejected refund):\n%s", showRefund)
	t.Logf("audit show (delete):\n%s", showDelete)
	t.Logf("audit show (expired email):\n%s", showExpire)
	t.Logf("audit show (auto lookup):\n%s", showLookup)
	t.Logf("audit verify:\n%s", verify)
	t.Logf("audit stats:\n%s", stats)

	contains := func(what, out string, wants ...string) {
		t.Helper()
		for _, w := range wants {
			if !strings.Contains(out, w) {
				t.Errorf("%s lacks %q", what, w)
			}
		}
	}
	lacks := func(what, out string, bad ...string) {
		t.Helper()
		for _, b := range bad {
			if strings.Contains(out, b) {
				t.Errorf("%s contains %q", what, b)
			}
		}
	}

	// tail: one aligned line per entry, times in UTC, data summarised
	// rather than dumped.
	lines := strings.Split(strings.TrimRight(tail, "\n"), "\n")
	if len(lines) != len(h.entries) {
		t.Errorf("audit tail -n 200 printed %d lines, want %d", len(lines), len(h.entries))
	}
	dataCol := len("2006-01-02T15:04:05.000Z") + 1 + 6 + 2 + 16 + 1 + auditreport.TailSubjectWidth + 1 + auditreport.TailToolWidth + 1 + auditreport.TailActorWidth + 1
	for i, l := range lines {
		if i >= len(h.entries) {
			break
		}
		e := h.entries[i]
		if !strings.HasPrefix(l, auditreport.FormatTime(e.Time)) || !strings.HasSuffix(auditreport.FormatTime(e.Time), "Z") {
			t.Errorf("tail line %d = %q, want it to start with the UTC time %s", i, l, auditreport.FormatTime(e.Time))
		}
		if r := []rune(l); len(r) > dataCol && r[dataCol-1] != ' ' {
			t.Errorf("tail line %d is not aligned (column %d is %q): %q", i, dataCol, r[dataCol-1], l)
		}
		if strings.Contains(l, `"call_id"`) || strings.Contains(l, `"origin"`) {
			t.Errorf("tail line %d dumps raw data: %q", i, l)
		}
	}
	contains("audit tail", tail,
		`verdict=edit edited=true after=40s`,
		`verdict=reject reason="`+demoRejectReason+`" after=1m20s`,
		`verdict=approve reason="self_approval"`,
		`task="please delete customer C-300, they asked us to"`,
		`needs_human=true signals=review_always,sensitive_capability`)

	// show: the whole story of each request.
	emailReq := h.entry(t, h.email, approval.EventRequested)
	var req struct {
		Digest string `json:"digest"`
	}
	_ = json.Unmarshal(emailReq.Data, &req)
	contains("audit show (email)", showEmail,
		"outcome             edited",
		"requested           "+auditreport.FormatTime(emailReq.Time)+" by "+d.Cast.Requester.ID,
		`"subject":"About your order 1234"`,
		"digest              "+req.Digest,
		"preview             Email Dana Whitfield <dana@example.com>",
		"fact              Tier: gold",
		"signal              sensitive_capability — it can send email (a sensitive capability)",
		`model's reason      "The task asks to write to the customer." (unverified, written by the model)`,
		"model's confidence  0.90 (self-reported)",
		"decision            edit by "+d.Cast.Approver.ID,
		`edit              subject: "About your order 1234" → "`+demoEmailSubject+`"`,
		"execution           executed at",
		`"idempotency_key":"`+h.email+`"`,
		"timings             to decision 40s; to execute 0s; request to result")
	contains("audit show (refund)", showRefund,
		"outcome             rejected",
		`"amount":64`,
		"fact              Shipping paid: $64.00",
		"signal              when_rule — refund above $50",
		"reject — decided (\""+demoRejectReason+"\")",
		"decision            reject by "+d.Cast.SecondApprover.ID,
		"  reason            \""+demoRejectReason+"\"",
		"timings             to decision 1m20s")
	lacks("audit show (refund)", showRefund, "execution ")
	contains("audit show (delete)", showDelete,
		"outcome             approved",
		d.Cast.Approver.ID+" approve — refused: self_approval (the requester may not approve their own request)",
		d.Cast.SecondApprover.ID+" approve — decided",
		"decision            approve by "+d.Cast.SecondApprover.ID,
		`result            {"deleted":"C-300"}`,
		"to decision 1m20s")
	contains("audit show (expired)", showExpire,
		"outcome             expired",
		"decision            expired at",
		"to expiry 24h1m",
		": a rejection, nothing ran",
		"preview error       preview unavailable:")
	lacks("audit show (expired)", showExpire, "execution ", "expire by system")
	if strings.Count(showExpire, "preview unavailable") != 1 {
		t.Errorf("audit show (expired) repeats the preview error:\n%s", showExpire)
	}
	contains("audit show (lookup)", showLookup,
		"outcome             auto",
		"gate                run without asking anyone",
		`arguments           {"order_id":"1234"}`,
		"execution           executed at")
	lacks("audit show (lookup)", showLookup, "no requested entry found")

	// The card time is when it was first posted, before any click.
	cardAt := h.entry(t, h.del, approval.EventCardPosted).Time
	contains("audit show (delete)", showDelete, "card                posted "+auditreport.FormatTime(cardAt))

	// verify: the chain the product wrote is intact.
	if want := fmt.Sprintf("audit chain intact: %d entries\n", len(h.entries)); verify != want {
		t.Errorf("audit verify = %q, want %q", verify, want)
	}

	// export: the edited email and the rejected refund, with what the
	// approver saw and what they decided.
	recs := decodeExport(t, export)
	if len(recs) != 2 {
		t.Fatalf("audit export --only rejected,edited gave %d records, want 2:\n%s", len(recs), export)
	}
	byID := map[string]auditreport.ExportRecord{}
	for _, r := range recs {
		byID[r.RequestID] = r
	}
	em, rf := byID[h.email], byID[h.refund]
	if em.Outcome != "edited" || em.Shown == nil || em.Shown.Digest != req.Digest || em.Shown.Preview == nil ||
		len(em.Shown.Preview.Facts) != 3 || len(em.Shown.Signals) != 2 || em.Shown.CardAt == nil {
		t.Errorf("export of the email = %+v, want edited with the card's digest, 3 facts and 2 signals", em)
	}
	if em.Decision == nil || em.Decision.Approver != d.Cast.Approver.ID || len(em.Decision.Changes) != 1 ||
		em.Decision.Changes[0].Path != "subject" || string(em.Decision.Changes[0].After) != strconv.Quote(demoEmailSubject) ||
		em.Decision.TimeToDecideMS == nil || *em.Decision.TimeToDecideMS != demoThinkTime.Milliseconds() {
		t.Errorf("export of the email decision = %+v, want bob's edit of the subject after 40 s", em.Decision)
	}
	if em.Requester != d.Cast.Requester.ID || em.Proposed.ModelReason == "" || em.Execution == nil || em.Execution.Status != "executed" {
		t.Errorf("export of the email = %+v, want alice's request, the model's reason and the execution", em)
	}
	if rf.Outcome != "rejected" || rf.Decision == nil || rf.Decision.Reason != demoRejectReason ||
		rf.Decision.Approver != d.Cast.SecondApprover.ID || rf.Shown == nil || len(rf.Shown.Preview.Facts) != 5 || rf.Execution != nil {
		t.Errorf("export of the refund = %+v, want carol's rejection with her reason verbatim and the 5 facts", rf)
	}

	// stats: per tool and per approver.
	var rep auditreport.StatsReport
	if err := json.Unmarshal([]byte(cli("audit", "stats", "--since", "7d", "--json")), &rep); err != nil {
		t.Fatal(err)
	}
	rows := func(rs []auditreport.StatRow) map[string]auditreport.StatRow {
		m := map[string]auditreport.StatRow{}
		for _, r := range rs {
			m[r.Name] = r
		}
		return m
	}
	tools, approvers := rows(rep.Tools), rows(rep.Approvers)
	for _, c := range []struct {
		name   string
		row    auditreport.StatRow
		total  int
		counts map[approval.Verdict]int
		median float64
	}{
		{"send_email", tools["send_email"], 2, map[approval.Verdict]int{approval.VerdictEdit: 1, approval.VerdictExpire: 1}, 40},
		{"issue_refund", tools["issue_refund"], 1, map[approval.Verdict]int{approval.VerdictReject: 1}, 80},
		{"delete_customer", tools["delete_customer"], 1, map[approval.Verdict]int{approval.VerdictApprove: 1}, 80},
		{"bob", approvers[d.Cast.Approver.ID], 1, map[approval.Verdict]int{approval.VerdictEdit: 1}, 40},
		{"carol", approvers[d.Cast.SecondApprover.ID], 2, map[approval.Verdict]int{approval.VerdictReject: 1, approval.VerdictApprove: 1}, 80},
	} {
		got := map[approval.Verdict]int{}
		for k, v := range c.row.Counts {
			if v != 0 {
				got[k] = v
			}
		}
		if c.row.Total != c.total || fmt.Sprint(got) != fmt.Sprint(c.counts) || c.row.MedianSec == nil || *c.row.MedianSec != c.median {
			t.Errorf("stats %s = total %d counts %v median %v, want %d %v %vs", c.name, c.row.Total, got, deref(c.row.MedianSec), c.total, c.counts, c.median)
		}
	}
	if len(rep.Tools) != 3 || len(rep.Approvers) != 2 || len(rep.Warnings) != 0 {
		t.Errorf("stats = %d tools, %d approvers, warnings %v; want 3, 2 and none", len(rep.Tools), len(rep.Approvers), rep.Warnings)
	}
	contains("audit stats", stats, "send_email       2      0 (0%)    1 (50%)")

	// --json forms parse and are complete.
	if n := len(decodeJSONLines(t, cli("audit", "tail", "-n", "200", "--json"))); n != len(h.entries) {
		t.Errorf("audit tail --json printed %d entries, want %d", n, len(h.entries))
	}
	var story auditreport.Story
	if err := json.Unmarshal([]byte(cli("audit", "show", "--json", h.email)), &story); err != nil {
		t.Fatal(err)
	}
	if story.Outcome != "edited" || story.Decision == nil || len(story.Decision.Changes) != 1 || len(story.Entries) == 0 {
		t.Errorf("audit show --json = %+v, want the edit and its entries", story.ExportRecord)
	}

	// No token of the process in any output.
	for name, out := range map[string]string{"tail": tail, "show": showEmail + showRefund + showDelete + showExpire + showLookup, "export": export, "stats": stats} {
		lacks("audit "+name, out, "xoxb-", "xapp-", "demo-signing-secret")
	}
}

// decodeExport reads audit export output.
func decodeExport(t *testing.T, out string) []auditreport.ExportRecord {
	t.Helper()
	var recs []auditreport.ExportRecord
	for _, l := range strings.Split(strings.TrimSpace(out), "\n") {
		if l == "" {
			continue
		}
		var r auditreport.ExportRecord
		if err := json.Unmarshal([]byte(l), &r); err != nil {
			t.Fatalf("export line %q: %v", l, err)
		}
		recs = append(recs, r)
	}
	return recs
}
