package main_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/scripted"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
	"github.com/countersign/countersign/store"
	"github.com/countersign/countersign/store/storetest"
)

// Tests of issue 12 (hardening under faults and hostile input), each
// against the production wiring (the demo's Main over signed HTTP).

// signedPost posts body to the process's path, signed with the demo's
// signing secret at the process clock, and returns the answer's status.
func signedPost(t *testing.T, d *main.Demo, path, contentType string, body []byte) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, "http://"+d.Main.Addr()+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	ts := time.Now().Unix()
	req.Header.Set("Content-Type", contentType)
	req.Header.Set("X-Slack-Request-Timestamp", strconv.FormatInt(ts, 10))
	req.Header.Set("X-Slack-Signature", slacksim.Sign(d.Main.Config.SlackSigningSecret, ts, body))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("POST %s: %v", path, err)
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// auditEntries reads the demo's whole audit stream.
func auditEntries(t *testing.T, d *main.Demo) []approval.Entry {
	t.Helper()
	a := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := a.Range(context.Background(), "", 10000)
	if err != nil {
		t.Fatalf("audit Range: %v", err)
	}
	return entries
}

// startCards starts the demo task over signed HTTP and returns the demo
// and the email card once it is bound (its approvers: channel_members).
func startCards(t *testing.T) (*main.Demo, slacksim.Message, string) {
	t.Helper()
	d := startDemo(t, true)
	task := "<@" + slacksim.BotUserID + "> order 1234 arrived damaged — look it up, email an apology, refund the shipping"
	if _, err := d.Workspace.PostMessage(d.Cast.Requester.ID, d.Cast.Tasks.ID, task, ""); err != nil {
		t.Fatalf("PostMessage: %v", err)
	}
	var card slacksim.Message
	waitWS(t, d, "the email card", func() bool {
		var ok bool
		card, ok = cardFor(d, "send_email")
		return ok
	})
	id := buttonValue.FindStringSubmatch(string(card.Blocks))[1]
	return d, card, id
}

// TestBotUserNeverApproves (issue 12, point 5): a signed Approve click
// from the installation's own bot user — a member of the approvals
// channel, so an approver under channel_members — is refused and audited;
// the request stays pending and nothing runs.
func TestBotUserNeverApproves(t *testing.T) {
	t.Parallel()
	d, card, id := startCards(t)
	if err := d.Workspace.Click(slacksim.BotUserID, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(approve as the bot user): %v", err)
	}
	waitWS(t, d, "the bot user's click refused in the audit", func() bool {
		for _, e := range auditEntries(t, d) {
			if e.RequestID == id && e.Actor == slacksim.BotUserID &&
				(e.Event == approval.EventDecisionRefuse || e.Event == approval.EventDecided || e.Event == approval.EventApprovalVote) {
				return true
			}
		}
		return false
	})
	for _, e := range auditEntries(t, d) {
		if e.RequestID == id && e.Actor == slacksim.BotUserID && e.Event != approval.EventDecisionRefuse {
			t.Errorf("audit has %s by the bot user on %s, want only decision_refused", e.Event, id)
		}
	}
	r, err := d.Main.Store.Request(context.Background(), id)
	if err != nil || r.Status != approval.StatusPending || len(r.Approvals) != 0 {
		t.Fatalf("request after the bot user's click: status %v, %d approvals, err %v; want pending with none", statusOf(r), len(r.Approvals), err)
	}
	if n := len(d.SoR.Emails()); n != 0 {
		t.Errorf("emails sent = %d, want 0", n)
	}
}

func statusOf(r *approval.Request) approval.Status {
	if r == nil {
		return ""
	}
	return r.Status
}

// logSink collects a process's log lines and lets a test wait for one.
type logSink struct {
	mu      sync.Mutex // guards lines, changed
	lines   []string
	changed chan struct{} // closed and replaced on every line
}

func newLogSink() *logSink { return &logSink{changed: make(chan struct{})} }

func (l *logSink) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, string(p))
	close(l.changed)
	l.changed = make(chan struct{})
	return len(p), nil
}

// await blocks until n lines contain want (or fails after 30 s).
func (l *logSink) await(t *testing.T, want string, n int) {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		l.mu.Lock()
		got, ch := 0, l.changed
		for _, line := range l.lines {
			if strings.Contains(line, want) {
				got++
			}
		}
		l.mu.Unlock()
		if got >= n {
			return
		}
		select {
		case <-ch:
		case <-timeout:
			t.Fatalf("log has %d lines with %q, want %d", got, want, n)
		}
	}
}

// longest returns the length of the longest line.
func (l *logSink) longest() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	m := 0
	for _, line := range l.lines {
		m = max(m, len(line))
	}
	return m
}

// startLogged starts the demo over signed HTTP with its log in a sink.
func startLogged(t *testing.T) (*main.Demo, *logSink) {
	t.Helper()
	logs := newLogSink()
	d := MustStartDemo(t, &main.Demo{World: demo.World{HTTPDelivery: true, Logger: slog.New(slog.NewJSONHandler(logs, &slog.HandlerOptions{Level: slog.LevelInfo}))}})
	return d, logs
}

// eventBody is an Events API event_callback around inner.
func eventBody(t *testing.T, eventID string, inner map[string]any) []byte {
	t.Helper()
	env := map[string]any{"type": "event_callback", "team_id": slacksim.TeamID, "api_app_id": "A0SIM0001", "event": inner}
	if eventID != "" {
		env["event_id"] = eventID
	}
	b, err := json.Marshal(env)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestIncompleteMentionsDropped (issue 12, point 6): an app_mention
// without channel, ts or event_id is acknowledged (200) and dropped with
// one log line; no run starts from it.
func TestIncompleteMentionsDropped(t *testing.T) {
	t.Parallel()
	d, logs := startLogged(t)
	alice := d.Cast.Requester.ID
	text := "<@" + slacksim.BotUserID + "> refund order 1234"
	tests := []struct {
		name    string
		eventID string
		event   map[string]any
	}{
		{"no channel", "Ev0NOCHAN1", map[string]any{"type": "app_mention", "user": alice, "text": text, "ts": "1700000000.000100", "team": slacksim.TeamID}},
		{"no ts", "Ev0NOTS001", map[string]any{"type": "app_mention", "user": alice, "text": text, "channel": d.Cast.Tasks.ID, "team": slacksim.TeamID}},
		{"no event id", "", map[string]any{"type": "app_mention", "user": alice, "text": text, "channel": d.Cast.Tasks.ID, "ts": "1700000000.000300", "team": slacksim.TeamID}},
	}
	for i, tt := range tests {
		body := eventBody(t, tt.eventID, tt.event)
		// twice: a retry of an event without id must not start a second run
		for range 2 {
			if got := signedPost(t, d, "/slack/events", "application/json", body); got != http.StatusOK {
				t.Fatalf("%s: POST /slack/events = %d, want 200", tt.name, got)
			}
		}
		logs.await(t, "incomplete slack event dropped", 2*(i+1))
	}
	if runs := len(d.Model.Requests()); runs != 0 {
		t.Errorf("model called %d times, want 0 (no run from an incomplete event)", runs)
	}
	for _, e := range auditEntries(t, d) {
		t.Errorf("audit has %s, want nothing from incomplete events", e.Event)
	}
}

// TestUntrustedFieldsStaySmall (issue 12, point 4): signed clicks and
// submissions carrying huge ids are refused (400) or dropped; nothing of
// them reaches the audit stream in full, and no log line grows with them.
func TestUntrustedFieldsStaySmall(t *testing.T) {
	t.Parallel()
	d, logs := startLogged(t)
	huge := strings.Repeat("A", 512<<10)
	bob := d.Cast.Approver.ID
	click := func(user, value string) map[string]any {
		return map[string]any{
			"type": "block_actions", "trigger_id": "1.2.3", "response_url": d.Workspace.BaseURL() + "/response/x",
			"team": map[string]any{"id": slacksim.TeamID}, "user": map[string]any{"id": user, "team_id": slacksim.TeamID},
			"channel":   map[string]any{"id": d.Cast.Approvals.ID},
			"container": map[string]any{"channel_id": d.Cast.Approvals.ID, "message_ts": "1700000000.000100"},
			"actions":   []map[string]any{{"action_id": "cs_approve", "block_id": "b", "value": value}},
		}
	}
	tests := []struct {
		name    string
		payload map[string]any
		want    []int
	}{
		{"huge user", click(huge, "req_"+strings.Repeat("a", 26)+"|digest"), []int{http.StatusBadRequest}},
		{"huge request id", click(bob, "req_"+huge+"|digest"), []int{http.StatusOK}},
		{"huge team", map[string]any{"type": "block_actions", "team": map[string]any{"id": huge}, "user": map[string]any{"id": bob}}, []int{http.StatusBadRequest}},
		{"huge modal request id", map[string]any{"type": "view_submission", "team": map[string]any{"id": slacksim.TeamID},
			"user": map[string]any{"id": bob, "team_id": slacksim.TeamID},
			"view": map[string]any{"callback_id": "cs_reject", "private_metadata": "req_" + huge + "|d|" + d.Cast.Approvals.ID + "|1.2",
				"state": map[string]any{"values": map[string]any{"reason": map[string]any{"text": map[string]any{"type": "plain_text_input", "value": "no"}}}}}}, []int{http.StatusOK}},
	}
	for _, tt := range tests {
		b, err := json.Marshal(tt.payload)
		if err != nil {
			t.Fatal(err)
		}
		body := []byte(url.Values{"payload": {string(b)}}.Encode())
		if got := signedPost(t, d, "/slack/interactive", "application/x-www-form-urlencoded", body); !slices.Contains(tt.want, got) {
			t.Errorf("%s: POST /slack/interactive = %d, want one of %v", tt.name, got, tt.want)
		}
	}
	// The process is drained before looking: whatever the clicks queued
	// has been done (or dropped) once the bot's pool is empty.
	if err := d.Main.Bot.Close(); err != nil {
		t.Fatalf("bot.Close: %v", err)
	}
	for _, e := range auditEntries(t, d) {
		if n := len(e.RequestID) + len(e.Actor) + len(e.Tool) + len(e.RunID) + len(e.Data); n > 4<<10 {
			t.Errorf("audit %s entry holds %d bytes of ids and data, want them clipped", e.Event, n)
		}
	}
	if n := logs.longest(); n > 8<<10 {
		t.Errorf("longest log line = %d bytes, want at most 8 KiB", n)
	}
}

// TestSlowAndUnsignedBodiesCostNothing (issue 12, point 3): a request
// without signature headers or with a timestamp outside the window is
// answered 401 before its body is sent; a declared body over the limit 413
// at once; a signed-looking body that stalls is cut off (400) and its
// connection closed. The client here never finishes a body, so a server
// that waits for one never answers (the 30 s deadline only ends the test).
func TestSlowAndUnsignedBodiesCostNothing(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	d := startDemo(t, true)
	fresh := strconv.FormatInt(time.Now().Unix(), 10)
	stale := strconv.FormatInt(time.Now().Add(-time.Hour).Unix(), 10)
	badSig := "v0=" + strings.Repeat("0", 64)
	tests := []struct {
		name    string
		headers map[string]string
		length  int
		want    int
	}{
		{"no signature headers", nil, 4 << 20, http.StatusUnauthorized},
		{"timestamp only", map[string]string{"X-Slack-Request-Timestamp": fresh}, 4 << 20, http.StatusUnauthorized},
		{"stale timestamp", map[string]string{"X-Slack-Request-Timestamp": stale, "X-Slack-Signature": badSig}, 4 << 20, http.StatusUnauthorized},
		{"declared too large", map[string]string{"X-Slack-Request-Timestamp": fresh, "X-Slack-Signature": badSig}, 100 << 20, http.StatusRequestEntityTooLarge},
		{"stalled body", map[string]string{"X-Slack-Request-Timestamp": fresh, "X-Slack-Signature": badSig}, 1 << 20, http.StatusBadRequest},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			conn, err := net.Dial("tcp", d.Main.Addr())
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			_ = conn.SetDeadline(time.Now().Add(30 * time.Second))
			var req strings.Builder
			fmt.Fprintf(&req, "POST /slack/interactive HTTP/1.1\r\nHost: countersign\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: %d\r\n", tt.length)
			for k, v := range tt.headers {
				fmt.Fprintf(&req, "%s: %s\r\n", k, v)
			}
			req.WriteString("\r\npayload=%7B%22type%22") // and nothing more
			if _, err := conn.Write([]byte(req.String())); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, nil)
			if err != nil {
				t.Fatalf("no answer while the body is unsent: %v", err)
			}
			_ = resp.Body.Close()
			if resp.StatusCode != tt.want {
				t.Errorf("status = %d, want %d", resp.StatusCode, tt.want)
			}
			// The server closes the connection rather than wait for the rest.
			if _, err := io.Copy(io.Discard, br); err != nil {
				t.Errorf("connection not closed after the answer: %v", err)
			}
		})
	}
}

// freePort returns a local port nothing listens on right now.
func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// quietPort returns a free loopback port below the kernel's ephemeral
// range (32768 and up on Linux, 49152 and up elsewhere), for a server
// that starts a while after the port is chosen: a port freePort returns
// may be handed to another test's listener (port 0) or connection in the
// meantime, one below the range only to a test that asks for it by
// number (TestRedisDownAtStart once found another test's HTTP server on
// its Redis port).
func quietPort(t *testing.T) int {
	t.Helper()
	for range 100 {
		port := 20000 + rand.IntN(12000)
		if ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port)); err == nil {
			_ = ln.Close()
			return port
		}
	}
	t.Fatal("no free port between 20000 and 32000")
	return 0
}

// healthz returns the status of GET /healthz on addr, 0 when nothing answers.
func healthz(addr string) int {
	resp, err := http.Get("http://" + addr + "/healthz")
	if err != nil {
		return 0
	}
	_ = resp.Body.Close()
	return resp.StatusCode
}

// TestRedisDownAtStart (issue 12, point 7) runs the real binary with its
// Redis not up yet: it waits (one log line), /healthz answers 503
// meanwhile, and once a Redis starts on that port the process starts and
// /healthz answers 200. With no Redis within COUNTERSIGN_REDIS_START_TIMEOUT
// it exits with the clear error.
func TestRedisDownAtStart(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	server, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not in PATH")
		}
		t.Skip("redis-server not in PATH: cannot start a private Redis")
	}
	bin := buildBinary(t)
	ws := slacksimtest.New(t, slacksim.Options{})
	ws.SeedDemo()
	model := httptest.NewServer(scripted.New())
	t.Cleanup(model.Close)
	policy := filepath.Join(t.TempDir(), "policy.yaml")
	if err := os.WriteFile(policy, demo.Policy, 0o600); err != nil {
		t.Fatal(err)
	}
	env := func(redisPort, addr, wait string) []string {
		return []string{
			"PATH=" + os.Getenv("PATH"),
			"HOME=" + t.TempDir(),
			"SLACK_API_URL=" + ws.APIURL(),
			"SLACK_BOT_TOKEN=xoxb-sim",
			"SLACK_APP_TOKEN=xapp-sim",
			"OPENAI_BASE_URL=" + model.URL + "/v1",
			"OPENAI_API_KEY=x",
			"COUNTERSIGN_CONFIG=" + policy,
			"SOR_URL=http://127.0.0.1:1",
			"REDIS_URL=redis://127.0.0.1:" + redisPort + "/0",
			"COUNTERSIGN_REDIS_PREFIX=cstest:redisdown",
			"COUNTERSIGN_ADDR=" + addr,
			"COUNTERSIGN_REDIS_START_TIMEOUT=" + wait,
			"LOG_LEVEL=info",
		}
	}
	const waiting = "redis not reachable yet"

	t.Run("redis comes up", func(t *testing.T) {
		port := strconv.Itoa(quietPort(t)) // redis-server binds it later
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		p := startServe(t, bin, env(port, addr, "2m"))
		waitUntil(t, "the wait for Redis logged", func() bool { return strings.Contains(p.stderr.String(), waiting) })
		if got := healthz(addr); got != http.StatusServiceUnavailable {
			t.Fatalf("/healthz while Redis is down = %d, want 503\nlogs:\n%s", got, p.stderr.String())
		}
		rs := exec.Command(server, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		rsOut := &syncBuffer{}
		rs.Stdout, rs.Stderr = rsOut, rsOut
		if err := rs.Start(); err != nil {
			t.Fatal(err)
		}
		rsExited := make(chan struct{})
		go func() { _ = rs.Wait(); close(rsExited) }() // exits when redis-server does
		t.Cleanup(func() { _ = rs.Process.Kill(); <-rsExited })
		// Either process ending first is the failure, said with both
		// outputs (not a 20 s wait that says neither).
		waitUntil(t, "the process started", func() bool {
			select {
			case <-rsExited:
				t.Fatalf("redis-server exited before the process started:\n%s\nlogs:\n%s", rsOut.String(), p.stderr.String())
			case err := <-p.done:
				t.Fatalf("the process exited (%v) instead of starting once Redis was up; logs:\n%s\nredis-server:\n%s", err, p.stderr.String(), rsOut.String())
			default:
			}
			return strings.Contains(p.stderr.String(), "countersign started")
		})
		if got := healthz(addr); got != http.StatusOK {
			t.Errorf("/healthz once started = %d, want 200", got)
		}
		if n := strings.Count(p.stderr.String(), waiting); n != 1 {
			t.Errorf("%q logged %d times, want once", waiting, n)
		}
		p.stop(t)
	})

	t.Run("redis never comes", func(t *testing.T) {
		port := strconv.Itoa(freePort(t))
		p := startServe(t, bin, env(port, "127.0.0.1:0", "1s"))
		var exit error
		select {
		case exit = <-p.done:
		case <-time.After(60 * time.Second):
			t.Fatalf("process still running 60 s after a 1 s Redis start timeout\nlogs:\n%s", p.stderr.String())
		}
		var ee *exec.ExitError
		if !errors.As(exit, &ee) || ee.ExitCode() != 1 {
			t.Errorf("exit = %v, want code 1", exit)
		}
		logs := p.stderr.String()
		if !strings.Contains(logs, "REDIS_URL: redis not reachable") || strings.Count(logs, waiting) != 1 {
			t.Errorf("logs = %s\nwant one %q line and the clear error", logs, waiting)
		}
	})
}

// privateRedis starts a redis-server of the test's own on a free port and
// returns its address.
func privateRedis(t *testing.T) string {
	t.Helper()
	server, err := exec.LookPath("redis-server")
	if err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatal("redis-server not in PATH")
		}
		t.Skip("redis-server not in PATH: cannot start a private Redis")
	}
	// freePort's port can be taken again before redis-server binds it
	// (CI once found another test's HTTP server there): the server is
	// ours only when it answers with our redis-server's process id;
	// otherwise it exited unable to bind, and another port is tried.
	for attempt := 1; ; attempt++ {
		addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
		_, port, _ := net.SplitHostPort(addr)
		rs := exec.Command(server, "--port", port, "--bind", "127.0.0.1", "--save", "", "--appendonly", "no")
		if err := rs.Start(); err != nil {
			t.Fatal(err)
		}
		exited := make(chan struct{})
		go func() { _ = rs.Wait(); close(exited) }() // ends when redis-server does
		ours := false
		waitUntil(t, "the private redis-server", func() bool {
			select {
			case <-exited:
				return true
			default:
			}
			ours = redisPID(addr) == rs.Process.Pid
			return ours
		})
		if ours {
			t.Cleanup(func() { _ = rs.Process.Kill(); <-exited })
			return addr
		}
		_ = rs.Process.Kill()
		<-exited
		if attempt == 5 {
			t.Fatalf("redis-server could not bind a free port in %d attempts", attempt)
		}
	}
}

// redisPID is the process id the Redis at addr reports (INFO server), 0
// when what answers there is not Redis.
func redisPID(addr string) int {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return 0
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	if _, err := c.Write([]byte("INFO server\r\n")); err != nil {
		return 0
	}
	r := bufio.NewReader(c)
	head, err := r.ReadString('\n')
	if err != nil || !strings.HasPrefix(head, "$") {
		return 0
	}
	n, err := strconv.Atoi(strings.TrimSpace(head[1:]))
	if err != nil || n <= 0 || n > 1<<20 {
		return 0
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return 0
	}
	for line := range strings.Lines(string(body)) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), "process_id:"); ok {
			pid, _ := strconv.Atoi(v)
			return pid
		}
	}
	return 0
}

// TestAnswersMeetSlacksBudgetWithRedisPaused (issue 12, point 2): with
// Redis not answering, the production wiring (REDIS_URL through newRedis)
// still answers Slack inside its 3 s — the local workspace, like Slack,
// gives up on a later answer: an Edit submission gets a field error saying
// nothing was saved (and nothing is), `/countersign pending` says the store
// is not answering.
func TestAnswersMeetSlacksBudgetWithRedisPaused(t *testing.T) {
	t.Parallel() // waits on timers and other processes: overlaps with the rest of the package
	p := storetest.NewProxy(t, privateRedis(t))
	d := MustStartDemo(t, &main.Demo{World: demo.World{HTTPDelivery: true, RedisURL: "redis://" + p.Addr() + "/0", Prefix: "cstest-paused"}})
	t.Cleanup(p.Resume) // runs first: the demo then closes on a Redis that answers
	ws, bob := d.Workspace, d.Cast.Approver.ID
	if _, err := ws.PostMessage(d.Cast.Requester.ID, d.Cast.Tasks.ID,
		"<@"+slacksim.BotUserID+"> order 1234 arrived damaged — look it up, email an apology, refund the shipping", ""); err != nil {
		t.Fatal(err)
	}
	var card slacksim.Message
	waitWS(t, d, "the email card", func() bool {
		var ok bool
		card, ok = cardFor(d, "send_email")
		return ok
	})
	id := buttonValue.FindStringSubmatch(string(card.Blocks))[1]
	before, err := d.Main.Store.Request(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if err := ws.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_edit"); err != nil {
		t.Fatalf("Click(edit): %v", err)
	}
	v := openModal(t, d, bob)

	p.Pause()
	res, err := ws.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "We're sorry about your table"}})
	if err != nil || res.ResponseAction != "errors" || !strings.Contains(joinValues(res.Errors), "try again") {
		t.Errorf("SubmitView with Redis paused = %+v, %v; want a field error saying to try again", res, err)
	}
	if err := ws.SlashCommand(bob, d.Cast.Approvals.ID, "/countersign", "pending"); err != nil {
		t.Fatalf("SlashCommand: %v", err)
	}
	waitWS(t, d, "the pending command's answer", func() bool {
		for _, m := range ws.Ephemerals(bob) {
			if strings.Contains(m.Text, "not answering") {
				return true
			}
		}
		return false
	})
	p.Resume()

	// Nothing of the edit was recorded: once the bot's queued work is
	// done, the request is as it was.
	if err := d.Main.Bot.Close(); err != nil {
		t.Fatal(err)
	}
	after, err := d.Main.Store.Request(context.Background(), id)
	if err != nil {
		t.Fatal(err)
	}
	if after.Status != approval.StatusPending || after.Digest != before.Digest || after.Decision != nil {
		t.Errorf("request after the unsaved edit: %s, digest changed %v; want pending, unchanged", after.Status, after.Digest != before.Digest)
	}
}

func joinValues(m map[string]string) string {
	var b strings.Builder
	for _, v := range m {
		b.WriteString(v)
	}
	return b.String()
}

// TestApprovalSurvivesRetriedDecideScript (issue 12, point 1): Redis runs
// the decide script but its reply is lost (held past the client's
// read_timeout), so go-redis runs the script again. The approver's click
// still counts as theirs: the audit has one `decided` by them and no
// refusal, nobody is told "Already approved", the email is sent once.
func TestApprovalSurvivesRetriedDecideScript(t *testing.T) {
	t.Parallel()
	p := storetest.NewProxy(t, privateRedis(t))
	d := MustStartDemo(t, &main.Demo{World: demo.World{HTTPDelivery: true, RedisURL: "redis://" + p.Addr() + "/0?read_timeout=500ms", Prefix: "cstest-retried"}})
	ws, bob := d.Workspace, d.Cast.Approver.ID
	if _, err := ws.PostMessage(d.Cast.Requester.ID, d.Cast.Tasks.ID,
		"<@"+slacksim.BotUserID+"> order 1234 arrived damaged — look it up, email an apology, refund the shipping", ""); err != nil {
		t.Fatal(err)
	}
	var card slacksim.Message
	waitWS(t, d, "the email card", func() bool {
		var ok bool
		card, ok = cardFor(d, "send_email")
		return ok
	})
	id := buttonValue.FindStringSubmatch(string(card.Blocks))[1]

	// The decide script's arguments carry the decision JSON.
	p.Arm(`"request_id":"` + id + `","verdict":"approve"`)
	if err := ws.Click(bob, d.Cast.Approvals.ID, card.TS, "cs_approve"); err != nil {
		t.Fatalf("Click(approve): %v", err)
	}
	waitWS(t, d, "the email sent", func() bool { return len(d.SoR.Emails()) > 0 })
	if p.Withheld() != 1 {
		t.Fatalf("proxy withheld %d decide replies, want 1 (the retry was not exercised)", p.Withheld())
	}
	// The click's outcome is audited once the retried script answers.
	waitUntil(t, "bob's click audited", func() bool {
		for _, e := range auditEntries(t, d) {
			if e.RequestID == id && e.Actor == bob && (e.Event == approval.EventDecided || e.Event == approval.EventDecisionRefuse) {
				return true
			}
		}
		return false
	})
	if err := d.Main.Bot.Close(); err != nil { // the click's work, the answer to bob included, is done
		t.Fatal(err)
	}
	decided, refused := 0, 0
	for _, e := range auditEntries(t, d) {
		if e.RequestID != id || e.Actor != bob {
			continue
		}
		switch e.Event {
		case approval.EventDecided:
			decided++
		case approval.EventDecisionRefuse:
			refused++
		}
	}
	if decided != 1 || refused != 0 {
		t.Errorf("audit by bob on %s: %d decided, %d refused; want 1 decided, no refusal", id, decided, refused)
	}
	for _, m := range ws.Ephemerals(bob) {
		if strings.Contains(m.Text, "Already") {
			t.Errorf("bob was told %q about his own click", m.Text)
		}
	}
	if n := len(d.SoR.Emails()); n != 1 {
		t.Errorf("emails sent = %d, want 1", n)
	}
}
