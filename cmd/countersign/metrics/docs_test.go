package metrics

import (
	"context"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestMetricsMatchOperationsDoc: every series the process exports is in
// the metrics table of docs/operations.md with the same type and labels,
// and the table names nothing the process does not export.
func TestMetricsMatchOperationsDoc(t *testing.T) {
	doc, err := os.ReadFile("../../../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	// | `name` | type | `a`, `b` = … | meaning |
	row := regexp.MustCompile("(?m)^\\| `(countersign_[a-z_]+)` \\| (counter|gauge|histogram) \\| ([^|]*) \\|")
	label := regexp.MustCompile("`([a-z_]+)`")
	documented := map[string]string{}
	for _, m := range row.FindAllStringSubmatch(string(doc), -1) {
		var labels []string
		names, _, _ := strings.Cut(m[3], "=") // `kind` = `prompt`, `completion`: values follow "="
		for _, l := range label.FindAllStringSubmatch(names, -1) {
			labels = append(labels, l[1])
		}
		slices.Sort(labels)
		documented[m[1]] = m[2] + " " + strings.Join(labels, ",")
	}
	if len(documented) == 0 {
		t.Fatal("no metrics table found in docs/operations.md")
	}

	reg := prometheus.NewRegistry()
	New(reg)
	RegisterPendingGauge(reg, func(context.Context) (int, error) { return 0, nil }, time.Second)
	RegisterPendingAges(reg, func(context.Context, time.Time) (time.Time, int, error) { return time.Time{}, 0, nil }, time.Now, time.Second)
	RegisterAuditStream(reg, func(context.Context) (int64, int64, error) { return 0, 0, nil }, time.Second)
	RegisterMCPUpstreams(reg, func() int { return 0 })
	RegisterCheckpoints(reg, fixedHealth{})
	ch := make(chan *prometheus.Desc, 64)
	go func() { reg.Describe(ch); close(ch) }()
	descRE := regexp.MustCompile(`fqName: "([a-z_]+)".*variableLabels: \{([^}]*)\}`)
	exported := map[string]string{}
	for d := range ch {
		m := descRE.FindStringSubmatch(d.String())
		if m == nil {
			t.Fatalf("cannot read %s", d)
		}
		labels := strings.Split(m[2], ",")
		if m[2] == "" {
			labels = nil
		}
		slices.Sort(labels)
		exported[m[1]] = strings.Join(labels, ",")
	}
	for name, labels := range exported {
		doc, ok := documented[name]
		if !ok {
			t.Errorf("%s{%s} is exported but not in docs/operations.md", name, labels)
			continue
		}
		if _, docLabels, _ := strings.Cut(doc, " "); docLabels != labels {
			t.Errorf("%s labels = {%s}, docs/operations.md says {%s}", name, labels, docLabels)
		}
	}
	for name := range documented {
		if _, ok := exported[name]; !ok {
			t.Errorf("docs/operations.md documents %s, which is not exported", name)
		}
	}
}
