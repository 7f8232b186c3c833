package main

import "runtime/debug"

// GCPercent is the garbage collector's target (GOGC) of the long-running
// commands (serve, demo, mcp) when the environment does not set GOGC. Go's
// default, 100, collects each time the heap doubles, and the live heap is
// small: BenchmarkClickToTool's whole process (serve with the local
// workspace and the fakes) holds 15–25 MB, so with 100 it collected about
// every ten approvals, and each collection's marking shared the two cores
// with the clicks it overlapped. With 400 it collects a quarter as often
// for a peak heap of about five times the live one (tens of megabytes);
// docs/performance.md has the figures. Set GOGC (and GOMEMLIMIT in a
// container with a hard limit) to choose otherwise.
const GCPercent = 400

// TuneGC sets GCPercent unless getenv("GOGC") is set, and reports the
// target the process runs with.
func TuneGC(getenv func(string) string) int {
	if getenv("GOGC") != "" {
		p := debug.SetGCPercent(100) // read the target the runtime took from GOGC…
		debug.SetGCPercent(p)        // …and leave it as it was
		return p
	}
	debug.SetGCPercent(GCPercent)
	return GCPercent
}
