package metrics

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"go.yaml.in/yaml/v3" // test only: the rule file is YAML (the product reads YAML in approval/policyfile)
)

// productSeries is every series name Countersign registers, with its
// labels; a histogram's _bucket, _sum and _count series are listed too.
func productSeries(t *testing.T) map[string][]string {
	t.Helper()
	reg := prometheus.NewRegistry()
	m := New(reg)
	RegisterPendingGauge(reg, func(context.Context) (int, error) { return 0, nil }, time.Second)
	RegisterPendingAges(reg, func(context.Context, time.Time) (time.Time, int, error) { return time.Time{}, 0, nil }, time.Now, time.Second)
	RegisterAuditStream(reg, func(context.Context) (int64, int64, error) { return 0, 0, nil }, time.Second)
	RegisterCheckpoints(reg, fixedHealth{})

	descRE := regexp.MustCompile(`fqName: "([a-z_]+)".*variableLabels: \{([^}]*)\}`)
	describe := func(c prometheus.Collector) map[string][]string {
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		out := map[string][]string{}
		for d := range ch {
			mm := descRE.FindStringSubmatch(d.String())
			if mm == nil {
				t.Fatalf("cannot read %s", d)
			}
			var labels []string
			if mm[2] != "" {
				labels = strings.Split(mm[2], ",")
			}
			out[mm[1]] = labels
		}
		return out
	}
	series := describe(reg)
	// The histograms' series (a new histogram belongs in this list).
	for _, h := range []prometheus.Collector{m.decision, m.executionTime, m.modelTime} {
		for name, labels := range describe(h) {
			series[name+"_sum"], series[name+"_count"] = labels, labels
			series[name+"_bucket"] = append(slices.Clone(labels), "le")
		}
	}
	return series
}

// promQL pulls metric names and the labels used with them out of an
// expression: selectors (name{label="x"}) and aggregations (by (label)).
var (
	promMetric   = regexp.MustCompile(`\b(countersign_[a-z_]+)\b(\{[^}]*\})?`)
	promLabel    = regexp.MustCompile(`([a-z_]+)\s*(=~|!~|!=|=)`)
	promGrouping = regexp.MustCompile(`\b(?:by|without)\s*\(([^)]*)\)`)
)

// exprProblems lists the names in expr that Countersign does not export,
// and labels that none of the expression's metrics has.
func exprProblems(expr string, series map[string][]string) []string {
	found := promMetric.FindAllStringSubmatch(expr, -1)
	if len(found) == 0 {
		return []string{"names no countersign_ metric"}
	}
	var problems, all []string
	for _, f := range found {
		labels, ok := series[f[1]]
		if !ok {
			problems = append(problems, f[1]+" is not a metric Countersign exports")
			continue
		}
		all = append(all, labels...)
		for _, l := range promLabel.FindAllStringSubmatch(f[2], -1) {
			if !slices.Contains(labels, l[1]) {
				problems = append(problems, fmt.Sprintf("%s has no label %q (it has %v)", f[1], l[1], labels))
			}
		}
	}
	for _, g := range promGrouping.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(g[1], ",") {
			if l = strings.TrimSpace(l); l != "" && !slices.Contains(all, l) {
				problems = append(problems, fmt.Sprintf("groups by %q, which none of its metrics has", l))
			}
		}
	}
	return problems
}

// checkExpr fails the test for each problem of expr.
func checkExpr(t *testing.T, where, expr string, series map[string][]string) {
	t.Helper()
	for _, p := range exprProblems(expr, series) {
		t.Errorf("%s: %s (expr %s)", where, p, expr)
	}
}

// TestDashboardsUseExportedMetrics: every metric the Grafana dashboard and
// the Prometheus alerts name is one Countersign registers, with the labels
// it has, and the alerts cover what docs/operations.md promises.
func TestDashboardsUseExportedMetrics(t *testing.T) {
	series := productSeries(t)

	t.Run("grafana", func(t *testing.T) {
		raw, err := os.ReadFile("../../../examples/grafana/countersign.json")
		if err != nil {
			t.Fatal(err)
		}
		var dash struct {
			Title  string `json:"title"`
			Panels []struct {
				Title   string `json:"title"`
				Type    string `json:"type"`
				Targets []struct {
					Expr string `json:"expr"`
				} `json:"targets"`
			} `json:"panels"`
		}
		if err := json.Unmarshal(raw, &dash); err != nil {
			t.Fatalf("countersign.json: %v", err)
		}
		n := 0
		for _, p := range dash.Panels {
			if p.Type == "row" {
				continue
			}
			if len(p.Targets) == 0 {
				t.Errorf("panel %q has no query", p.Title)
			}
			for _, q := range p.Targets {
				checkExpr(t, "panel "+p.Title, q.Expr, series)
				n++
			}
		}
		if n < 10 {
			t.Errorf("dashboard has %d queries, want the pending, decision, review-time, rate-limit and error panels", n)
		}
	})

	t.Run("alerts", func(t *testing.T) {
		raw, err := os.ReadFile("../../../examples/prometheus/alerts.yaml")
		if err != nil {
			t.Fatal(err)
		}
		var rules struct {
			Groups []struct {
				Name  string `yaml:"name"`
				Rules []struct {
					Alert string `yaml:"alert"`
					Expr  string `yaml:"expr"`
				} `yaml:"rules"`
			} `yaml:"groups"`
		}
		if err := yaml.Unmarshal(raw, &rules); err != nil {
			t.Fatalf("alerts.yaml: %v", err)
		}
		used := map[string]bool{}
		for _, g := range rules.Groups {
			for _, r := range g.Rules {
				if r.Alert == "" || r.Expr == "" {
					t.Errorf("group %s: a rule without alert or expr: %+v", g.Name, r)
					continue
				}
				checkExpr(t, "alert "+r.Alert, r.Expr, series)
				for _, m := range promMetric.FindAllStringSubmatch(r.Expr, -1) {
					used[m[1]] = true
				}
			}
		}
		// Issue 17: past deadline, oldest pending, audit append failures,
		// Slack 429 rate. Issue 29: the audit stream's growth. Issue 46:
		// checkpoints stopped or refused.
		for _, want := range []string{"countersign_overdue_requests", "countersign_oldest_pending_seconds",
			"countersign_audit_append_errors_total", "countersign_slack_rate_limited_total", "countersign_audit_stream_bytes",
			"countersign_audit_checkpoint_alarm"} {
			if !used[want] {
				t.Errorf("no alert on %s", want)
			}
		}
	})

	t.Run("checker catches mistakes", func(t *testing.T) {
		tests := []struct {
			name, expr string
		}{
			{"unknown metric", `sum(rate(countersign_approvals_total[5m]))`},
			{"unknown label", `sum(countersign_requests_total{verdict="approve"})`},
			{"unknown grouping", `sum by (approver) (rate(countersign_requests_total[5m]))`},
			{"_bucket of a counter", `countersign_expired_total_bucket`},
		}
		for _, tt := range tests {
			t.Run(tt.name, func(t *testing.T) {
				if got := exprProblems(tt.expr, series); len(got) == 0 {
					t.Errorf("exprProblems(%s) = none, want a problem", tt.expr)
				}
			})
		}
	})
}
