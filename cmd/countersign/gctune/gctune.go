// Package gctune sets the Go garbage collector of Countersign's
// long-running commands (serve, demo, mcp) and of policy replay and
// suggest, which stream the audit over a small live heap (a third less
// CPU for 100,000 calls). It is automemlimit's one home.
//
// Go's default target, GOGC=100, collects each time the heap doubles, and
// the live heap is small: BenchmarkClickToTool's whole process (serve with
// the local workspace and the fakes) holds 15–25 MB, so with 100 it
// collected about every ten approvals, and each collection's marking
// shared the two cores with the clicks it overlapped (a trace of 1,000
// clicks put one inside 8 of the 21 slowest). With Percent it collects a
// quarter as often, for a peak heap of about five times the live one.
//
// Five times the live heap is more than a container may allow once
// thousands of runs are parked (about 20 KiB each): so, unless GOMEMLIMIT
// is set, the process's soft memory limit is LimitRatio of its cgroup's
// memory limit, and the collector works harder near it instead of the
// kernel killing the process. docs/performance.md has the figures.
package gctune

import (
	"errors"
	"runtime/debug"
	"runtime/metrics"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// Percent is the collector's target (GOGC) when the environment does not
// set GOGC.
const Percent = 400

// LimitRatio is the share of the cgroup's memory limit taken as the soft
// memory limit (GOMEMLIMIT) when the environment does not set GOMEMLIMIT.
const LimitRatio = 0.9

// Settings are what the collector runs with.
type Settings struct {
	Percent int   // GOGC; negative when off
	Limit   int64 // the soft memory limit in bytes, math.MaxInt64 when none
	// LimitErr says why no limit was taken from the cgroup (not in one,
	// say); nil when it was, when there is none, or when GOMEMLIMIT is set.
	LimitErr error
}

// Apply sets Percent unless GOGC is set and the soft memory limit from
// the cgroup unless GOMEMLIMIT is set, and returns the settings the
// process runs with.
func Apply(getenv func(string) string) Settings {
	return apply(getenv, memlimit.FromCgroup)
}

func apply(getenv func(string) string, cgroup memlimit.Provider) Settings {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(Percent)
	}
	var s Settings
	if getenv("GOMEMLIMIT") == "" {
		_, err := memlimit.Set(memlimit.WithProvider(cgroup), memlimit.WithRatio(LimitRatio))
		if err != nil && !errors.Is(err, memlimit.ErrNoLimit) {
			s.LimitErr = err
		}
	}
	s.Percent, s.Limit = Current()
	return s
}

// Current reads the collector's target (GOGC; -1 when off) and soft memory
// limit (math.MaxInt64 when none) without changing them.
func Current() (percent int, limit int64) {
	m := []metrics.Sample{{Name: "/gc/gogc:percent"}, {Name: "/gc/gomemlimit:bytes"}}
	metrics.Read(m)
	return int(int64(m[0].Value.Uint64())), int64(m[1].Value.Uint64())
}
