package main_test

import (
	"bytes"
	"context"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/bot/slacksim"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/cmd/countersign/demo"
)

// cardSaying waits until the card whose blocks contain marker also
// contains every one of want, and returns it.
func cardSaying(t *testing.T, d *main.Demo, marker string, want ...string) slacksim.Message {
	t.Helper()
	var card slacksim.Message
	waitWS(t, d, "the card of "+marker+" saying "+strings.Join(want, ", "), func() bool {
		for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
			if m.ThreadTS == "" && m.BotID != "" && strings.Contains(string(m.Blocks), marker) && containsAll(strings.ToLower(string(m.Blocks)), want) {
				card = m
				return true
			}
		}
		return false
	})
	return card
}

// TestHookClaudeCodeGoneIsWithdrawn runs `countersign hook claude-code` as
// a real process waiting for a person, and makes it go the ways a hook
// goes: its own --timeout runs out, Claude Code stops it (SIGTERM) or
// kills it (SIGKILL: it can do nothing, the server's grace period — 1s
// here — withdraws it). Each time the request ends cancelled, its card
// says the caller gave up and nothing ran and has no buttons, and no
// approval can run it any more.
func TestHookClaudeCodeGoneIsWithdrawn(t *testing.T) {
	t.Parallel() // the hook is a process of its own, its environment given
	bin := buildBinary(t)
	d := startHookServer(t, func(d *main.Demo) { d.WithdrawGrace = time.Second })
	for _, tt := range []struct {
		name, timeout string
		stop          func(p *os.Process) error
		why           string // what the card says
		answers       string // the hook's deny says (nothing after SIGKILL)
	}{
		{name: "its --timeout ran out", timeout: "2s", why: "The caller gave up waiting (key " + demo.APIKeyName + "); nothing ran",
			answers: "no decision within the hook's --timeout (2s), so it gave up"},
		{name: "SIGTERM", timeout: "100s", stop: func(p *os.Process) error { return p.Signal(syscall.SIGTERM) },
			why: "The caller gave up waiting (key " + demo.APIKeyName + "); nothing ran", answers: "the hook was stopped before a decision came"},
		{name: "SIGKILL", timeout: "100s", stop: func(p *os.Process) error { return p.Kill() },
			why: "The caller gave up: it stopped waiting for the decision and did not come back within 1s (key " + demo.APIKeyName + "); nothing ran"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel() // each its own call, card and request
			command := "make deploy-" + strings.ReplaceAll(strings.ToLower(tt.name), " ", "-")
			polling := make(chan struct{}, 100)
			proxy := pollWatcher(t, "http://"+d.Main.Addr(), polling)
			cmd := bin.Command(append(os.Environ(), "COUNTERSIGN_API_KEY="+d.APIKey, "COUNTERSIGN_URL=", "XDG_STATE_HOME="+t.TempDir()),
				"hook", "claude-code", "--url", proxy, "--timeout", tt.timeout)
			cmd.Stdin = strings.NewReader(preToolUse("Bash", "toolu_GONE_"+strings.ReplaceAll(tt.name, " ", "_"), `{"command":"`+command+`","description":"Deploy"}`))
			var stdout, stderr bytes.Buffer
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			done := make(chan error, 1)
			go func() { done <- cmd.Wait() }() // the hook answers, or is killed
			id := requestOfCard(t, hookCard(t, d, command))
			select { // the hook waits: it asked, and its first long poll is on its way
			case <-polling:
			case <-time.After(30 * time.Second):
				t.Fatal("the hook did not poll")
			}
			if tt.stop != nil {
				if err := tt.stop(cmd.Process); err != nil {
					t.Fatalf("stop the hook: %v", err)
				}
			}
			select {
			case <-done:
			case <-time.After(60 * time.Second):
				_ = cmd.Process.Kill()
				t.Fatalf("the hook did not end\nstderr %s", stderr.String())
			}
			card := cardSaying(t, d, command, "Cancelled", tt.why)
			if strings.Contains(string(card.Blocks), "cs_approve") {
				t.Errorf("the withdrawn card still has buttons: %s", card.Blocks)
			}
			if tt.answers != "" {
				o := decoded(t, hookRun{stdout: stdout.String()})
				if o.HookSpecificOutput.PermissionDecision != "deny" || !strings.Contains(o.HookSpecificOutput.PermissionDecisionReason, tt.answers) ||
					!strings.Contains(o.HookSpecificOutput.PermissionDecisionReason, "The request was withdrawn") {
					t.Errorf("the hook answered %s; want deny saying %q and that the request was withdrawn", stdout.String(), tt.answers)
				}
			}
			got, err := apiClient(d).Get(context.Background(), id, 0)
			if err != nil || got.Status != client.Cancelled || got.Reason != tt.why {
				t.Errorf("request %s = %+v, %v; want cancelled: %q", id, got, err, tt.why)
			}
		})
	}
}

// pollWatcher is a reverse proxy to server that tells polling each time
// it forwards a long poll (a GET with ?wait=), so a test knows the hook
// is waiting for a decision.
func pollWatcher(t *testing.T, server string, polling chan<- struct{}) string {
	t.Helper()
	u, err := url.Parse(server)
	if err != nil {
		t.Fatal(err)
	}
	rp := httputil.NewSingleHostReverseProxy(u)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet && r.URL.Query().Get("wait") != "" {
			select {
			case polling <- struct{}{}:
			default:
			}
		}
		rp.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	return srv.URL
}
