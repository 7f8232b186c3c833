package main_test

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/store"
)

// TestExampleOpenAIAgents runs examples/openai-agents (the real
// @openai/agents package, installed by `npm ci` from its lock file) with
// `node test.mjs` against the demo's Countersign and a fake of OpenAI's
// Responses API, and decides its card in the demo's workspace: approved,
// the tool runs once after its claim and the model is told its output;
// rejected with a reason, the tool never runs and the model is told the
// reason; edited, the tool runs once with the approver's arguments. It skips, saying why, without Node 22 or the example's
// node_modules, and fails instead under CI=true.
//
// The sdk-js runner (examples_test.go) runs every example the same way;
// this test is the OpenAI example's own until the two are one.
func TestExampleOpenAIAgents(t *testing.T) {
	const dir = "../../examples/openai-agents"
	node := openAIExampleNode(t)
	if _, err := os.Stat(dir + "/node_modules/.package-lock.json"); err != nil {
		openAIExampleSkip(t, "%s/node_modules is missing: run `npm ci` there", dir)
	}
	const reason = "not without a photo of the damage"
	for _, c := range []struct {
		name  string
		click string
		ran   []map[string]any
		told  string
	}{
		{"approve", "cs_approve", []map[string]any{{"order_id": "1234", "amount": 80.0, "reason": "damaged"}}, "refund of 80 for order 1234 created"},
		{"reject", "cs_reject", nil, reason},
		{"edit", "cs_edit", []map[string]any{{"order_id": "1234", "amount": 64.0, "reason": "damaged"}}, "refund of 64 for order 1234 created"},
	} {
		t.Run(c.name, func(t *testing.T) {
			d := startDemo(t, false)
			model := newOpenAIResponsesFake(t)
			ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
			defer cancel()
			cmd := exec.CommandContext(ctx, node, "test.mjs")
			cmd.Dir = dir
			cmd.Env = append(os.Environ(), "COUNTERSIGN_URL=http://"+d.Main.Addr(), "COUNTERSIGN_API_KEY="+d.APIKey,
				"OPENAI_BASE_URL="+model.URL+"/v1", "OPENAI_API_KEY=sk-fake", "OPENAI_AGENTS_DISABLE_TRACING=1")
			var stdout, stderr strings.Builder
			cmd.Stdout, cmd.Stderr = &stdout, &stderr
			if err := cmd.Start(); err != nil {
				t.Fatal(err)
			}
			exited := make(chan error, 1)
			go func() { exited <- cmd.Wait() }() // ends when node does (ctx kills it)

			var id string
			waitWS(t, d, "the example's card", func() bool {
				for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
					if v := buttonValue.FindStringSubmatch(string(m.Blocks)); v != nil && strings.Contains(string(m.Blocks), "issue_refund") {
						id = v[1]
						return true
					}
				}
				return false
			})
			card := apiCard(t, d, id)
			bob := d.Cast.Approver.ID
			if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, card.TS, c.click); err != nil {
				t.Fatalf("Click %s: %v", c.click, err)
			}
			switch c.click {
			case "cs_reject":
				v := openModal(t, d, bob)
				if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": reason}}); err != nil || !res.Closed {
					t.Fatalf("SubmitView(reason) = %+v, %v", res, err)
				}
			case "cs_edit":
				v := openModal(t, d, bob)
				if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "64"}}); err != nil || !res.Closed {
					t.Fatalf("SubmitView(amount 64) = %+v, %v", res, err)
				}
			}
			if err := <-exited; err != nil {
				t.Fatalf("node test.mjs: %v\nstdout: %s\nstderr: %s\nmodel calls:\n%s", err, stdout.String(), stderr.String(), model.log())
			}
			lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
			var got struct {
				Ran    []map[string]any `json:"ran"`
				Output string           `json:"output"`
			}
			if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
				t.Fatalf("test.mjs's last line is not {ran, output}: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
			}
			if !reflect.DeepEqual(got.Ran, c.ran) && (len(got.Ran) != 0 || len(c.ran) != 0) {
				t.Errorf("the tool ran with %v, want %v", got.Ran, c.ran)
			}
			if told := model.toolResults(); !strings.Contains(told, c.told) || !strings.Contains(got.Output, c.told) {
				t.Errorf("the model was told %q and answered %q; want both to contain %q\nmodel calls:\n%s", told, got.Output, c.told, model.log())
			}
			entries, err := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream}).Range(context.Background(), "", 1000)
			if err != nil {
				t.Fatal(err)
			}
			var events []string
			for _, e := range entries {
				if e.RequestID == id {
					events = append(events, string(e.Event))
				}
			}
			all := " " + strings.Join(events, " ") + " "
			for _, ev := range []approval.Event{approval.EventExecuting, approval.EventExecuted} {
				if strings.Contains(all, " "+string(ev)+" ") != (len(c.ran) > 0) {
					t.Errorf("audit of %s = %v; %s present should be %v", id, events, ev, len(c.ran) > 0)
				}
			}
		})
	}
}

// openAIExampleSkip skips with why, or fails under CI=true.
func openAIExampleSkip(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// openAIExampleNode is Node 22 or later: $COUNTERSIGN_NODE22, else node on
// PATH.
func openAIExampleNode(t *testing.T) string {
	t.Helper()
	node := os.Getenv("COUNTERSIGN_NODE22")
	if node == "" {
		p, err := exec.LookPath("node")
		if err != nil {
			openAIExampleSkip(t, "node not found: examples/openai-agents is not run (set COUNTERSIGN_NODE22)")
		}
		node = p
	}
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		openAIExampleSkip(t, "%s: %v: examples/openai-agents is not run", node, err)
	}
	v := strings.TrimSpace(string(out))
	if major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0]); major < 22 {
		openAIExampleSkip(t, "%s is Node %s; @openai/agents needs Node 22 or later (set COUNTERSIGN_NODE22 to one)", node, v)
	}
	return node
}

// openAIResponsesFake is a scripted model behind OpenAI's Responses API
// (POST /v1/responses, not streamed: what the Agents SDK's run() sends by
// default): without a tool result in its input it calls issue_refund;
// after one it answers in text quoting the result.
type openAIResponsesFake struct {
	*httptest.Server
	mu    sync.Mutex // guards calls and told
	calls []string
	told  []string
}

func newOpenAIResponsesFake(t *testing.T) *openAIResponsesFake {
	t.Helper()
	f := &openAIResponsesFake{}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *openAIResponsesFake) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.calls = append(f.calls, r.Method+" "+r.URL.Path+" "+string(body))
	f.mu.Unlock()
	if r.Method != http.MethodPost || r.URL.Path != "/v1/responses" {
		http.Error(w, `{"error":{"message":"this fake serves POST /v1/responses only"}}`, http.StatusNotFound)
		return
	}
	var in struct {
		Model string `json:"model"`
		Input []struct {
			Type   string          `json:"type"`
			Output json.RawMessage `json:"output"`
		} `json:"input"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var told []string
	for _, it := range in.Input {
		if it.Type == "function_call_output" {
			var s string
			if json.Unmarshal(it.Output, &s) != nil {
				s = string(it.Output)
			}
			told = append(told, s)
		}
	}
	f.mu.Lock()
	f.told = append(f.told, told...)
	f.mu.Unlock()
	item := map[string]any{"type": "function_call", "id": "fc_1", "call_id": "call_refund_1", "name": "issue_refund",
		"arguments": `{"order_id":"1234","amount":80,"reason":"damaged"}`, "status": "completed"}
	if len(told) > 0 {
		item = map[string]any{"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
			"content": []map[string]any{{"type": "output_text", "text": "Done. The tool said: " + strings.Join(told, "; "), "annotations": []any{}}}}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(map[string]any{"id": "resp_1", "object": "response", "created_at": 1764900000, "status": "completed",
		"model": in.Model, "output": []any{item}, "usage": map[string]any{"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}})
}

func (f *openAIResponsesFake) log() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, "\n")
}

func (f *openAIResponsesFake) toolResults() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.told, "\n")
}
