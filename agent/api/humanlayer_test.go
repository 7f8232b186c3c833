package api_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/approval"
)

// pairs is one file of testdata/humanlayer: recorded request/response
// pairs in HumanLayer's SDK shapes (what humanlayer/core/cloud.py sends:
// the models' model_dump, and what its models parse), with the decisions
// a person makes in between.
type pairs struct {
	About string `json:"about"`
	Steps []struct {
		// Send is one SDK call; Expect its answer, checked field by field.
		Send *struct {
			Method string          `json:"method"`
			Path   string          `json:"path"`
			Key    string          `json:"key"` // full, narrow, or a literal wrong key
			Body   json.RawMessage `json:"body"`
		} `json:"send"`
		Expect *struct {
			Status int             `json:"status"`
			Body   json.RawMessage `json:"body"`
		} `json:"expect"`
		// Decide is a person's decision on the request of a call id, as a
		// click records it (through the lifecycle owner).
		Decide *struct {
			CallID   string           `json:"call_id"`
			Verdict  approval.Verdict `json:"verdict"`
			Approver string           `json:"approver"`
			Text     string           `json:"text"`
			Choice   string           `json:"choice"`
		} `json:"decide"`
		// Advance moves the clock and runs the expiry sweep.
		Advance string `json:"advance"`
	} `json:"steps"`
}

// hlPolicy is the harness policy with a rule for contact requests.
func hlPolicy() *approval.Policy {
	p := testPolicy()
	p.Tools[approval.ContactTool] = approval.ToolPolicy{Risk: approval.RiskLow, Review: approval.ReviewAlways, Timeout: 2 * time.Hour}
	return &p
}

// TestHumanLayerRecordedPairs replays every file of testdata/humanlayer
// against the real handler over HTTP (real store and audit: Redis when
// REDIS_URL is set), each file on a fresh harness, and checks every answer
// field by field: each field recorded is present with that value, and no
// field is answered that the recording lacks. "<request_id>" matches a
// request id, "<string>" any non-empty string.
func TestHumanLayerRecordedPairs(t *testing.T) {
	files, err := filepath.Glob("testdata/humanlayer/*.json")
	if err != nil || len(files) == 0 {
		t.Fatalf("no recorded pairs in testdata/humanlayer (%v)", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".json"), func(t *testing.T) {
			raw, err := os.ReadFile(file)
			if err != nil {
				t.Fatal(err)
			}
			var p pairs
			dec := json.NewDecoder(bytes.NewReader(raw))
			dec.DisallowUnknownFields()
			if err := dec.Decode(&p); err != nil {
				t.Fatalf("%s: %v", file, err)
			}
			h := newHarness(t, harnessOptions{policy: hlPolicy()})
			ids := map[string]string{} // call id → request id, from the answers
			for i, st := range p.Steps {
				switch {
				case st.Send != nil:
					key := map[string]string{"full": fullKey, "narrow": narrowKey}[st.Send.Key]
					if key == "" {
						key = st.Send.Key
					}
					code, body := h.hlSend(st.Send.Method, st.Send.Path, key, st.Send.Body)
					if st.Expect == nil {
						t.Fatalf("step %d: a send without expect", i)
					}
					if code != st.Expect.Status {
						t.Errorf("step %d: %s %s = %d, want %d; body %s", i, st.Send.Method, st.Send.Path, code, st.Expect.Status, body)
					}
					var got, want any
					if err := json.Unmarshal(body, &got); err != nil {
						t.Fatalf("step %d: answer is not JSON: %s", i, body)
					}
					if err := json.Unmarshal(st.Expect.Body, &want); err != nil {
						t.Fatalf("step %d: recorded body: %v", i, err)
					}
					for _, d := range diffJSON("", got, want) {
						t.Errorf("step %d: %s %s: %s", i, st.Send.Method, st.Send.Path, d)
					}
					if m, ok := got.(map[string]any); ok {
						if cs, ok := m["countersign"].(map[string]any); ok {
							ids[fmt.Sprint(m["call_id"])], _ = cs["request_id"].(string)
						}
					}
				case st.Decide != nil:
					id := ids[st.Decide.CallID]
					if id == "" {
						t.Fatalf("step %d: no request seen for call id %q", i, st.Decide.CallID)
					}
					r, err := h.store.Request(h.ctx, id)
					if err != nil {
						t.Fatal(err)
					}
					d := approval.Decision{RequestID: id, Verdict: st.Decide.Verdict, Approver: st.Decide.Approver, Text: st.Decide.Text,
						Choice: st.Decide.Choice, At: h.clock.Now(), Digest: r.Digest}
					if _, err := h.life.Decide(h.ctx, r, d, approval.DecideOptions{}); err != nil {
						t.Fatalf("step %d: Decide: %v", i, err)
					}
				case st.Advance != "":
					d, err := time.ParseDuration(st.Advance)
					if err != nil {
						t.Fatal(err)
					}
					h.clock.Advance(d)
					if _, err := h.life.ExpireDue(h.ctx); err != nil {
						t.Fatalf("step %d: ExpireDue: %v", i, err)
					}
				default:
					t.Fatalf("step %d: nothing to do", i)
				}
			}
		})
	}
}

// hlSend sends one call to the HumanLayer endpoints.
func (h *harness) hlSend(method, path, key string, body json.RawMessage) (int, []byte) {
	h.t.Helper()
	var rd io.Reader
	if len(body) > 0 {
		rd = bytes.NewReader(body)
	}
	req, err := http.NewRequest(method, h.url+path, rd)
	if err != nil {
		h.t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		h.t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	out, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, out
}

// diffJSON lists where got differs from want, field by field.
func diffJSON(path string, got, want any) []string {
	if path == "" {
		path = "(body)"
	}
	switch w := want.(type) {
	case string:
		g, ok := got.(string)
		switch {
		case w == "<request_id>" && ok && approval.ValidID("req", g):
			return nil
		case w == "<string>" && ok && g != "":
			return nil
		case ok && g == w:
			return nil
		}
	case map[string]any:
		g, ok := got.(map[string]any)
		if !ok {
			break
		}
		var out []string
		keys := make([]string, 0, len(w)+len(g))
		for k := range w {
			keys = append(keys, k)
		}
		for k := range g {
			if _, ok := w[k]; !ok {
				keys = append(keys, k)
			}
		}
		slices.Sort(keys)
		for _, k := range keys {
			gv, inG := g[k]
			wv, inW := w[k]
			switch {
			case !inG:
				out = append(out, fmt.Sprintf("%s.%s missing, want %v", path, k, wv))
			case !inW:
				out = append(out, fmt.Sprintf("%s.%s = %v, not in the recording", path, k, gv))
			default:
				out = append(out, diffJSON(path+"."+k, gv, wv)...)
			}
		}
		return out
	case []any:
		g, ok := got.([]any)
		if !ok || len(g) != len(w) {
			break
		}
		var out []string
		for i := range w {
			out = append(out, diffJSON(fmt.Sprintf("%s[%d]", path, i), g[i], w[i])...)
		}
		return out
	default:
		if fmt.Sprint(got) == fmt.Sprint(want) && (got == nil) == (want == nil) {
			return nil
		}
	}
	return []string{fmt.Sprintf("%s = %v, want %v", path, got, want)}
}

// TestHumanLayerRoutesServed: every HumanLayer route reaches its handler,
// and anything else under the prefix is a JSON 404.
func TestHumanLayerRoutesServed(t *testing.T) {
	h := newHarness(t, harnessOptions{policy: hlPolicy()})
	for _, route := range api.HumanLayerRoutes() {
		method, path, _ := strings.Cut(route, " ")
		code, body := h.hlSend(method, strings.ReplaceAll(path, "{call_id}", "c1"), fullKey, json.RawMessage(`{}`))
		if strings.Contains(string(body), "no such endpoint") {
			t.Errorf("%s: not served (%d %s)", route, code, body)
		}
	}
	code, body := h.hlSend("GET", "/humanlayer/v1/agents", fullKey, nil)
	if code != http.StatusNotFound || !strings.Contains(string(body), `"not_found"`) {
		t.Errorf("GET /humanlayer/v1/agents = %d %s, want a JSON 404", code, body)
	}
}
