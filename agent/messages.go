package agent

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"text/template"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/policyfile"
)

// Default messages fed back to the model (text/template; fields .Tool
// .Approver .Reason .Response .Changes .Args). policyfile.Agent.Templates
// overrides each. The approver is written as a Slack mention (<@U…>) so
// that, when the model repeats it in its answer, Slack shows the person's
// name rather than a raw id.
const (
	DefaultRejectedTemplate = `Not run: <@{{.Approver}}> rejected this {{.Tool}} call. Reason: {{.Reason}}`
	DefaultEditedTemplate   = `<@{{.Approver}}> edited the {{.Tool}} arguments before approving ({{.Changes}}); it ran with the edited arguments.`
	DefaultExpiredTemplate  = `Not run: the approval request for this {{.Tool}} call {{.Reason}}.`
	// DefaultRespondedTemplate: an approver answered in place of the tool;
	// the model must not report the call as done.
	DefaultRespondedTemplate = `Not run: <@{{.Approver}}> answered instead of running {{.Tool}}. Their answer: {{.Response}}`
	DefaultUnknownTemplate   = `Outcome unknown: {{.Tool}} was started but the process stopped before its result was recorded. It was not run again; check the system of record before retrying.`
)

// messages renders what the model is told about decisions.
type messages struct {
	rejected, edited, expired, unknown, responded *template.Template
}

// messageData is the data every template sees.
type messageData struct {
	Tool     string
	Approver string
	Reason   string
	Response string
	Changes  string
	Args     string
}

func newMessages(t policyfile.Templates) (*messages, error) {
	parse := func(name, text, def string) (*template.Template, error) {
		if strings.TrimSpace(text) == "" {
			text = def
		}
		tpl, err := template.New(name).Option("missingkey=error").Parse(text)
		if err != nil {
			return nil, fmt.Errorf("agent.templates.%s: %w", name, err)
		}
		return tpl, nil
	}
	var m messages
	var err error
	if m.rejected, err = parse("rejected", t.Rejected, DefaultRejectedTemplate); err != nil {
		return nil, err
	}
	if m.edited, err = parse("edited", t.Edited, DefaultEditedTemplate); err != nil {
		return nil, err
	}
	if m.expired, err = parse("expired", t.Expired, DefaultExpiredTemplate); err != nil {
		return nil, err
	}
	if m.unknown, err = parse("unknown", t.Unknown, DefaultUnknownTemplate); err != nil {
		return nil, err
	}
	if m.responded, err = parse("responded", t.Responded, DefaultRespondedTemplate); err != nil {
		return nil, err
	}
	return &m, nil
}

// render executes tpl, falling back to the default text when a configured
// template fails at run time: the model is always told something true.
func render(tpl *template.Template, def string, d messageData) string {
	var b bytes.Buffer
	if err := tpl.Execute(&b, d); err == nil {
		return b.String()
	}
	b.Reset()
	_ = template.Must(template.New("default").Parse(def)).Execute(&b, d)
	return b.String()
}

func (m *messages) Rejected(d messageData) string {
	return render(m.rejected, DefaultRejectedTemplate, d)
}
func (m *messages) Edited(d messageData) string  { return render(m.edited, DefaultEditedTemplate, d) }
func (m *messages) Expired(d messageData) string { return render(m.expired, DefaultExpiredTemplate, d) }
func (m *messages) Unknown(d messageData) string { return render(m.unknown, DefaultUnknownTemplate, d) }
func (m *messages) Responded(d messageData) string {
	return render(m.responded, DefaultRespondedTemplate, d)
}

// changes describes how an approver's edit differs from the proposal, key
// by key, e.g. `amount: 64 → 40; reason: (added) "goodwill"`.
func changes(before, after json.RawMessage) string {
	var parts []string
	for _, c := range approval.DiffArgs(before, after, 1) {
		switch {
		case c.Before == nil:
			parts = append(parts, fmt.Sprintf("%s: (added) %s", c.Path, c.After))
		case c.After == nil:
			parts = append(parts, fmt.Sprintf("%s: %s → (removed)", c.Path, c.Before))
		default:
			parts = append(parts, fmt.Sprintf("%s: %s → %s", c.Path, c.Before, c.After))
		}
	}
	if len(parts) == 0 {
		return "no change"
	}
	return strings.Join(parts, "; ")
}
