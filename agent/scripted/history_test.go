package scripted

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

// TestRequestsBounded: the demo's model answers for as long as the demo
// runs, so it keeps the last RequestsLimit requests (each a whole
// conversation), not every one; completions stay numbered apart.
func TestRequestsBounded(t *testing.T) {
	m := New()
	const n = 2*RequestsLimit + 5
	ids := make(map[string]bool, n)
	for i := range n {
		body := fmt.Sprintf(`{"model":"m","messages":[{"role":"user","content":"task %d"}]}`, i)
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/chat/completions", strings.NewReader(body)))
		var got struct{ ID string }
		if err := json.Unmarshal(rec.Body.Bytes(), &got); rec.Code != http.StatusOK || err != nil || got.ID == "" {
			t.Fatalf("request %d: %d %s", i, rec.Code, rec.Body)
		}
		if ids[got.ID] {
			t.Fatalf("request %d answered with id %s, already used", i, got.ID)
		}
		ids[got.ID] = true
		if held := len(m.requests); held >= 2*RequestsLimit {
			t.Fatalf("after %d requests the model holds %d, want fewer than %d", i+1, held, 2*RequestsLimit)
		}
	}
	reqs := m.Requests()
	if len(reqs) != RequestsLimit {
		t.Fatalf("Requests() = %d, want the last %d", len(reqs), RequestsLimit)
	}
	first, last := reqs[0].Messages[0].Content, reqs[len(reqs)-1].Messages[0].Content
	if first != fmt.Sprintf("task %d", n-RequestsLimit) || last != fmt.Sprintf("task %d", n-1) {
		t.Errorf("Requests() = %q..%q, want task %d..task %d, oldest first", first, last, n-RequestsLimit, n-1)
	}
}
