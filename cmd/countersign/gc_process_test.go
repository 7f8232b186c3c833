package main_test

import (
	"io"
	"net/http"
	"regexp"
	"strconv"
	"testing"

	"github.com/countersign/countersign/bot/slacksim"
	"github.com/countersign/countersign/bot/slacksim/slacksimtest"
	"github.com/countersign/countersign/cmd/countersign/gctune"
)

// TestServeGCPercent runs the real binary's serve and reads its
// garbage collector's settings off /metrics: gctune.Percent when the
// environment leaves GOGC unset, the operator's GOGC and GOMEMLIMIT when
// set.
func TestServeGCPercent(t *testing.T) {
	t.Parallel()
	rig := newServeRig(t, slacksimtest.New(t, slacksim.Options{}))
	gogc := regexp.MustCompile(`(?m)^go_gc_gogc_percent (\d+)$`)
	limit := regexp.MustCompile(`(?m)^go_gc_gomemlimit_bytes (\S+)$`)
	for _, tt := range []struct {
		name      string
		env       []string
		want      int
		wantLimit string // "" for whatever the machine's cgroup gives
	}{
		{"GOGC unset", nil, gctune.Percent, ""},
		{"GOGC=150", []string{"GOGC=150"}, 150, ""},
		{"GOMEMLIMIT=300MiB", []string{"GOMEMLIMIT=300MiB"}, gctune.Percent, "3.145728e+08"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			addr := "127.0.0.1:" + strconv.Itoa(freePort(t))
			env := append(append(append([]string(nil), rig.env...), "COUNTERSIGN_ADDR="+addr), tt.env...)
			p := startServe(t, rig.bin, env)
			waitUntil(t, "the process started", func() bool { return healthz(addr) == http.StatusOK })
			resp, err := http.Get("http://" + addr + "/metrics")
			if err != nil {
				t.Fatal(err)
			}
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			m := gogc.FindSubmatch(body)
			if m == nil {
				t.Fatalf("/metrics has no go_gc_gogc_percent\nlogs:\n%s", p.stderr.String())
			}
			if got, _ := strconv.Atoi(string(m[1])); got != tt.want {
				t.Errorf("go_gc_gogc_percent = %d, want %d", got, tt.want)
			}
			if l := limit.FindSubmatch(body); l == nil || (tt.wantLimit != "" && string(l[1]) != tt.wantLimit) {
				t.Errorf("go_gc_gomemlimit_bytes = %q, want %q", l, tt.wantLimit)
			}
			p.stop(t)
		})
	}
}
