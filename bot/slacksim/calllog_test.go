package slacksim

import (
	"strconv"
	"testing"
)

// TestCallLogBounded: a workspace that answers for days keeps the last
// CallLogLimit calls, not every one; Calls still counts them all.
func TestCallLogBounded(t *testing.T) {
	var l callLog
	const n = 2*CallLogLimit + 5
	for i := range n {
		method := "chat.update"
		if i%2 == 0 {
			method = "chat.postMessage"
		}
		l.add(Call{Method: method, Params: map[string]string{"i": strconv.Itoa(i)}})
		if len(l.recent) >= 2*CallLogLimit {
			t.Fatalf("after %d calls the log holds %d, want fewer than %d", i+1, len(l.recent), 2*CallLogLimit)
		}
	}
	w := l.window()
	if len(w) != CallLogLimit {
		t.Fatalf("window = %d calls, want %d", len(w), CallLogLimit)
	}
	if first, last := w[0].Params["i"], w[len(w)-1].Params["i"]; first != strconv.Itoa(n-CallLogLimit) || last != strconv.Itoa(n-1) {
		t.Errorf("window = calls %s..%s, want %d..%d, oldest first", first, last, n-CallLogLimit, n-1)
	}
	if got, want := l.counts["chat.postMessage"]+l.counts["chat.update"], n; got != want {
		t.Errorf("counted %d calls, want %d", got, want)
	}
	if got, want := l.counts["chat.postMessage"], (n+1)/2; got != want {
		t.Errorf("counted %d chat.postMessage, want %d", got, want)
	}
}
