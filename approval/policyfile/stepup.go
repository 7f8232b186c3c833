package policyfile

import (
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/duration"
)

// rawStepUp is a step_up key as written: a mapping {when, reason, risk,
// method, fresh}, or false to turn off the one defaults set.
type rawStepUp struct {
	path    string
	off     bool
	when    *string
	reason  *string
	risk    *string
	methods []string
	fresh   *time.Duration
}

// stepUp reads step_up on a tool (t != nil) or in defaults. when is a
// tool's: in defaults, a rule by risk says which tools.
func (d *decoder) stepUp(n *yaml.Node, path string, t *rawTool) *rawStepUp {
	s := &rawStepUp{path: path}
	if n.Kind == yaml.ScalarNode {
		if b := d.bool(n, path); b != nil {
			if *b {
				d.errorf(n, path, "true is not a rule: write a mapping such as {method: passkey}, or false to turn off the defaults' step_up")
				return nil
			}
			s.off = true
			return s
		}
		return nil
	}
	h := handlers{
		"reason": func(n *yaml.Node, p string) { s.reason = d.str(n, p) },
		"risk":   func(n *yaml.Node, p string) { s.risk = d.str(n, p) },
		"fresh":  func(n *yaml.Node, p string) { s.fresh = d.duration(n, p) },
		"method": func(n *yaml.Node, p string) {
			if n.Kind == yaml.ScalarNode {
				if v := d.str(n, p); v != nil {
					s.methods = []string{*v}
				}
				return
			}
			s.methods = d.strings(n, p)
		},
	}
	if t != nil {
		h["when"] = func(n *yaml.Node, p string) { s.when = d.str(n, p) }
	} else {
		h["when"] = func(n *yaml.Node, p string) {
			d.errorf(n, p, "a when rule belongs on a tool's step_up; in defaults say which tools by risk (risk: high)")
		}
	}
	d.mapping(n, path, h)
	return s
}

// applyStepUp overlays a step_up key onto tp, checking each field.
func (d *decoder) applyStepUp(tp *approval.ToolPolicy, s *rawStepUp) {
	if s == nil {
		return
	}
	if s.off {
		tp.StepUp = nil
		return
	}
	su := &approval.StepUp{Reason: strings.TrimSpace(deref(s.reason))}
	if s.when != nil {
		su.When = strings.TrimSpace(*s.when)
		if err := approval.CheckWhen(su.When); err != nil {
			d.errAt(s.path+".when", "%v", err)
		}
	}
	if s.risk != nil {
		switch v := approval.Risk(*s.risk); v {
		case approval.RiskLow, approval.RiskMedium, approval.RiskHigh:
			su.Risk = v
		default:
			d.errAt(s.path+".risk", "must be low, medium or high, got %q", *s.risk)
		}
	}
	for i, m := range s.methods {
		switch v := approval.StepUpMethod(m); v {
		case approval.StepUpPasskey, approval.StepUpOIDC:
			su.Methods = append(su.Methods, v)
		default:
			d.errAt(index(s.path+".method", i), "must be passkey or oidc, got %q", m)
		}
	}
	if s.methods != nil && len(s.methods) == 0 {
		d.errAt(s.path+".method", "must name passkey, oidc or both")
	}
	if len(su.Methods) == 0 {
		su.Methods = []approval.StepUpMethod{approval.StepUpPasskey}
	}
	if s.fresh != nil {
		if *s.fresh > approval.MaxStepUpFresh {
			d.errAt(s.path+".fresh", "must be at most %s (one confirmation covering a whole day of votes is no confirmation), got %s",
				duration.Format(approval.MaxStepUpFresh), duration.Format(*s.fresh))
		}
		su.Fresh = *s.fresh
	}
	tp.StepUp = su
}
