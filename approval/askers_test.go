package approval_test

import (
	"slices"
	"testing"

	"github.com/countersign/countersign/approval"
)

// TestAskers lists who asked for a request, in the order they asked, each
// once.
func TestAskers(t *testing.T) {
	tests := []struct {
		name       string
		requester  string
		requesters []string
		want       []string
	}{
		{"requester alone", "U1", nil, []string{"U1"}},
		{"set names the requester", "U2", []string{"U1", "U2"}, []string{"U1", "U2"}},
		{"set without the requester", "U1", []string{"U2"}, []string{"U1", "U2"}},
		{"nobody", "", nil, nil},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := &approval.Request{Requester: tt.requester, Requesters: tt.requesters}
			if got := r.Askers(); !slices.Equal(got, tt.want) {
				t.Errorf("Askers(%q, %v) = %v, want %v", tt.requester, tt.requesters, got, tt.want)
			}
			for _, u := range tt.want {
				if !r.AskedBy(u) {
					t.Errorf("AskedBy(%q) = false, want true", u)
				}
			}
			if r.AskedBy("U9") || r.AskedBy("") {
				t.Errorf("AskedBy(U9 or empty) = true, want false")
			}
		})
	}
}
