package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"strings"
	"testing"
	"time"

	main "github.com/countersign/countersign/cmd/countersign"
)

// TestDemoCommand runs `countersign demo` as a user would: it prints the
// page's URL, the audit view's URL and credentials and the HTTP API's
// address and key, all are served (the view and the API only with their
// credentials), and cancelling (Ctrl-C) stops it cleanly
// with exit code 0.
func TestDemoCommand(t *testing.T) {
	for _, v := range []string{"REDIS_URL", "OPENAI_API_KEY", "OPENAI_BASE_URL"} {
		t.Setenv(v, "") // restored after the test; unset: embedded Redis and the scripted model, as on a fresh machine
		os.Unsetenv(v)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := main.Run(ctx, []string{"demo", "--addr", "127.0.0.1:0"}, main.Stdio{Stdout: pw, Stderr: pw})
		pw.Close()
		done <- code
	}()

	lines := bufio.NewScanner(pr)
	var url string
	for lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "Countersign demo is running: "); ok {
			url = strings.TrimSpace(after)
			break
		}
	}
	if url == "" {
		t.Fatalf("demo printed no URL (exit %d)", <-done)
	}
	var auditURL, auditUser, auditPass string
	for lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "Audit view (read-only): "); ok {
			auditURL = strings.TrimSpace(after)
		}
		if f := strings.Fields(lines.Text()); len(f) >= 4 && f[0] == "user" && f[2] == "password" {
			auditUser, auditPass = strings.TrimSuffix(f[1], ","), f[3]
			break
		}
	}
	if auditURL == "" || auditUser == "" || auditPass == "" {
		t.Fatalf("demo printed no audit view URL and credentials (url %q, user %q)", auditURL, auditUser)
	}
	// The printed audit command reaches the demo's (embedded) Redis and
	// its stream: run it as printed, with `verify` for `tail`.
	var command []string
	for lines.Scan() {
		if f := strings.Fields(lines.Text()); len(f) > 0 && strings.HasPrefix(f[0], "REDIS_URL=") {
			command = f
			break
		}
	}
	// For the binary that is running, not `go run` (issue 47).
	self, _ := os.Executable()
	if len(command) < 4 || strings.Join(command[len(command)-3:], " ") != self+" audit tail" {
		t.Fatalf("demo printed no audit command line for its binary %s (got %q)", self, command)
	}
	// Signed audit checkpoints are on, and the banner says how to verify
	// with the running binary.
	var verify []string
	for verify == nil && lines.Scan() && lines.Text() != "" { // the block ends at a blank line
		if f := strings.Fields(lines.Text()); len(f) > 0 && strings.HasPrefix(f[0], "REDIS_URL=") {
			verify = f
		}
	}
	exe, _ := os.Executable()
	if len(verify) != 9 || verify[2] != exe || strings.Join(verify[3:5], " ") != "audit verify" || verify[5] != "--pubkey" || verify[7] != "--checkpoints" {
		t.Fatalf("demo printed no verify command line for its binary %s (got %q)", exe, verify)
	}
	var apiURL, apiKey string
	for lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "HTTP API for your own agent (docs/api.md): "); ok {
			apiURL = strings.TrimSpace(after)
		}
		if f := strings.Fields(lines.Text()); len(f) >= 2 && f[0] == "key" {
			apiKey = f[1]
			break
		}
	}
	if apiURL == "" || apiKey == "" {
		t.Fatalf("demo printed no API address and key (url %q)", apiURL)
	}
	// Envoy's gRPC ext_authz is served where the banner says: a tools/call
	// without a key is denied 401, tools/list passes.
	var extAddr string
	for extAddr == "" && lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "ext_authz (docs/gateways.md): gRPC at "); ok {
			extAddr = strings.TrimSuffix(strings.Fields(after)[0], ",")
		}
	}
	if extAddr == "" {
		t.Fatal("demo printed no ext_authz line")
	}
	// AuthZEN's discovery is where the banner says, naming endpoints that
	// refuse a call without a key.
	var discovery string
	for discovery == "" && lines.Scan() {
		if _, after, ok := strings.Cut(lines.Text(), "AuthZEN (docs/gateways.md): discovery at "); ok {
			discovery = strings.TrimSuffix(strings.Fields(after)[0], ",")
		}
	}
	if discovery == "" {
		t.Fatal("demo printed no AuthZEN line")
	}
	go func() { _, _ = io.Copy(io.Discard, pr) }() // keep draining output
	var meta map[string]any
	if resp, err := http.Get(discovery); err != nil {
		t.Fatal(err)
	} else if err := json.NewDecoder(resp.Body).Decode(&meta); err != nil || resp.StatusCode != 200 {
		t.Fatalf("GET %s = %d, %v", discovery, resp.StatusCode, err)
	} else {
		resp.Body.Close()
	}
	evalURL, _ := meta["access_evaluation_endpoint"].(string)
	if resp, err := http.Post(evalURL, "application/json", strings.NewReader(`{}`)); err != nil || resp.StatusCode != 401 {
		t.Errorf("POST %q without a key = %v, %v; want 401", evalURL, resp, err)
	} else {
		resp.Body.Close()
	}
	if got := demoExtAuthz(t, extAddr, toolCall(1, "refund", `{}`), ""); got.allow || got.status != 401 {
		t.Errorf("ext_authz Check of a tools/call without a key = %+v, want denied 401", got)
	}
	if got := demoExtAuthz(t, extAddr, `{"jsonrpc":"2.0","id":2,"method":"tools/list"}`, apiKey); !got.allow {
		t.Errorf("ext_authz Check of tools/list = %+v, want allowed", got)
	}
	// agentgateway's ExtMcp on the same port: the same refusal.
	if got := demoExtMcp(t, extAddr, agwRequest("tools/call", callParams("refund", `{}`), nil, nil)); got.pass || !strings.Contains(got.reason, "no API key") {
		t.Errorf("ExtMcp CheckRequest of a tools/call without a key = %+v, want an error saying no API key", got)
	}
	for _, kv := range command[:len(command)-5] {
		k, v, _ := strings.Cut(kv, "=")
		t.Setenv(k, v)
	}
	if code, out, errOut := runCLI(ctx, "audit", "verify"); code != 0 || !strings.Contains(out, "audit chain intact") ||
		(errOut != "" && !strings.Contains(errOut, `"countersign-demo:{audit}"`)) {
		t.Errorf("the printed audit command (verify) = %d, %q, %q; want the demo's stream read", code, out, errOut)
	}

	// The printed key is accepted by the printed API (an unknown request is
	// not found, not unauthenticated); no key is refused.
	for _, tc := range []struct {
		key  string
		want int
	}{{apiKey, http.StatusNotFound}, {"", http.StatusUnauthorized}} {
		req, _ := http.NewRequest(http.MethodGet, apiURL+"/requests/req_none", nil)
		if tc.key != "" {
			req.Header.Set("Authorization", "Bearer "+tc.key)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", apiURL, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s/requests/req_none with key %q = %d, want %d", apiURL, tc.key, resp.StatusCode, tc.want)
		}
	}

	for _, tc := range []struct {
		name string
		user string
		want int
	}{{"without credentials", "", http.StatusUnauthorized}, {"with the printed credentials", auditUser, http.StatusOK}} {
		req, _ := http.NewRequest(http.MethodGet, auditURL, nil)
		if tc.user != "" {
			req.SetBasicAuth(tc.user, auditPass)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatalf("GET %s %s: %v", auditURL, tc.name, err)
		}
		resp.Body.Close()
		if resp.StatusCode != tc.want {
			t.Errorf("GET %s %s = %d, want %d", auditURL, tc.name, resp.StatusCode, tc.want)
		}
	}

	// A request through the API writes audit entries; a checkpoint covers
	// them within a second or so, and the printed command proves them.
	req, _ := http.NewRequest(http.MethodPost, apiURL+"/requests",
		strings.NewReader(`{"tool":"deploy_service","call_id":"c1","arguments":{"service":"web"}}`))
	req.Header.Set("Authorization", "Bearer "+apiKey)
	if resp, err := http.DefaultClient.Do(req); err != nil || resp.StatusCode/100 != 2 {
		t.Fatalf("POST %s/requests = %v, %v", apiURL, resp, err)
	} else {
		resp.Body.Close()
	}
	witnessFile := verify[8]
	waitUntil(t, "a signed checkpoint in "+witnessFile, func() bool {
		b, _ := os.ReadFile(witnessFile)
		return strings.Contains(string(b), `"sig"`)
	})
	if code, out, errOut := runCLI(ctx, verify[3:]...); code != 0 || !strings.Contains(out, "audit proven: ") || strings.Contains(out, "audit proven: 0 entries") {
		t.Errorf("the printed verify command = %d, %q, %q; want the demo's entries proven", code, out, errOut)
	}
	base, _ := strings.CutSuffix(apiURL, "/v1")
	if resp, err := http.Get(base + "/readyz"); err != nil {
		t.Errorf("GET /readyz: %v", err)
	} else {
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK || strings.Contains(string(body), "degraded") {
			t.Errorf("GET /readyz = %d, %q; want ready, checkpoints not degraded", resp.StatusCode, body)
		}
	}

	resp, err := http.Get(url + "/")
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK || !strings.Contains(string(body), "<html") {
		t.Fatalf("GET %s = %d, want the workspace page", url, resp.StatusCode)
	}

	cancel()
	select {
	case code := <-done:
		if code != 0 {
			t.Errorf("demo exit = %d after Ctrl-C, want 0", code)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("demo did not stop within 15 s of Ctrl-C")
	}
}
