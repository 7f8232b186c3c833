package gctune

import (
	"errors"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// TestApply: Percent and LimitRatio of the cgroup's limit when the
// environment sets neither, the operator's GOGC and GOMEMLIMIT when it
// does, and no limit when there is no cgroup limit. The collector's
// settings are the process's: each case puts them back.
func TestApply(t *testing.T) {
	const gib = 1 << 30
	ratio := LimitRatio
	ratioOfGiB := int64(float64(gib) * ratio)
	noCgroup := func() (uint64, error) { return 0, memlimit.ErrNoCgroup }
	tests := []struct {
		name        string
		env         map[string]string
		cgroup      memlimit.Provider
		wantPercent int
		wantLimit   int64
		wantErr     bool
	}{
		{"neither set, 1 GiB cgroup", nil, memlimit.Limit(gib), Percent, ratioOfGiB, false},
		{"neither set, unlimited cgroup", nil, func() (uint64, error) { return 0, memlimit.ErrNoLimit }, Percent, math.MaxInt64, false},
		{"neither set, no cgroup", nil, noCgroup, Percent, math.MaxInt64, true},
		{"GOGC=150", map[string]string{"GOGC": "150"}, memlimit.Limit(gib), 150, ratioOfGiB, false},
		{"GOMEMLIMIT set", map[string]string{"GOMEMLIMIT": "300MiB"}, memlimit.Limit(gib), Percent, 300 << 20, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			percent, limit := Current()
			t.Cleanup(func() { debug.SetGCPercent(percent); debug.SetMemoryLimit(limit) })
			// As the runtime does at start from the environment.
			debug.SetGCPercent(100)
			debug.SetMemoryLimit(math.MaxInt64)
			t.Setenv("GOGC", tt.env["GOGC"])
			t.Setenv("GOMEMLIMIT", tt.env["GOMEMLIMIT"])
			if tt.env["GOGC"] == "150" {
				debug.SetGCPercent(150)
			}
			if tt.env["GOMEMLIMIT"] != "" {
				debug.SetMemoryLimit(300 << 20)
			}
			called := false
			cgroup := func() (uint64, error) { called = true; return tt.cgroup() }
			s := apply(func(k string) string { return tt.env[k] }, cgroup)
			if s.Percent != tt.wantPercent || s.Limit != tt.wantLimit {
				t.Errorf("apply = GOGC %d, limit %d; want %d, %d", s.Percent, s.Limit, tt.wantPercent, tt.wantLimit)
			}
			if p, l := Current(); p != s.Percent || l != s.Limit {
				t.Errorf("the runtime runs with GOGC %d, limit %d; apply said %d, %d", p, l, s.Percent, s.Limit)
			}
			if (s.LimitErr != nil) != tt.wantErr || (tt.wantErr && !errors.Is(s.LimitErr, memlimit.ErrNoCgroup)) {
				t.Errorf("LimitErr = %v, want an error: %v", s.LimitErr, tt.wantErr)
			}
			if set := tt.env["GOMEMLIMIT"] != ""; called == set {
				t.Errorf("cgroup asked: %v with GOMEMLIMIT %q", called, tt.env["GOMEMLIMIT"])
			}
		})
	}
}
