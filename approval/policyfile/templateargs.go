package policyfile

import (
	"encoding/json"
	"regexp"
	"slices"
	"strings"
	"text/template"
	"text/template/parse"

	"github.com/countersign/countersign/approval"
)

// channelID is a Slack conversation id (C… public, G… private): the only
// form chat.postMessage accepts for a channel the bot posts cards to.
var channelID = regexp.MustCompile(`^[CG][A-Z0-9]+$`)

// checkTemplateArgs reports each argument a template at path reads
// ({{.Args.name}}) that the tool's schema does not declare in props: the
// call would be sent to a URL with "<no value>" in it. A template that does
// not parse is reported by parseTemplate.
func (d *decoder) checkTemplateArgs(path, text string, props Props) {
	if !strings.Contains(text, ".Args") {
		return
	}
	tmpl, err := template.New(path).Funcs(Funcs(nil)).Parse(text)
	if err != nil || tmpl.Tree == nil {
		return
	}
	var seen []string
	for _, name := range templateArgs(tmpl.Tree.Root) {
		if props.Has(name) || slices.Contains(seen, name) {
			continue
		}
		seen = append(seen, name)
		have := "none"
		if len(props.List) > 0 {
			have = strings.Join(props.sortedNames(), ", ")
		}
		d.errAt(path, ".Args.%s is not a property of the tool's schema (it has: %s)", name, have)
	}
}

// templateArgs lists the argument names n reads as .Args.<name>, in order.
func templateArgs(n parse.Node) []string {
	var out []string
	var walk func(n parse.Node)
	walk = func(n parse.Node) {
		switch n := n.(type) {
		case *parse.ListNode:
			if n == nil {
				return
			}
			for _, c := range n.Nodes {
				walk(c)
			}
		case *parse.ActionNode:
			walk(n.Pipe)
		case *parse.PipeNode:
			if n == nil {
				return
			}
			for _, c := range n.Cmds {
				walk(c)
			}
		case *parse.CommandNode:
			for _, a := range n.Args {
				walk(a)
			}
		case *parse.FieldNode:
			if len(n.Ident) >= 2 && n.Ident[0] == "Args" {
				out = append(out, n.Ident[1])
			}
		case *parse.ChainNode:
			walk(n.Node)
		case *parse.IfNode:
			walk(n.Pipe)
			walk(n.List)
			walk(n.ElseList)
		case *parse.RangeNode:
			walk(n.Pipe)
			walk(n.List)
			walk(n.ElseList)
		case *parse.WithNode:
			walk(n.Pipe)
			walk(n.List)
			walk(n.ElseList)
		}
	}
	walk(n)
	return out
}

// Funcs are the functions available to every template in a policy file:
// env "NAME" (getenv; the value is a secret, never logged or audited),
// json (the JSON encoding of a value) and the built-in urlquery. Callers
// executing templates pass their own getenv (os.Getenv in production).
func Funcs(getenv func(string) string) template.FuncMap {
	return template.FuncMap{
		"env": func(name string) string {
			if getenv == nil {
				return ""
			}
			return getenv(name)
		},
		"json": func(v any) (string, error) {
			b, err := json.Marshal(v)
			return string(b), err
		},
		// {{currency "USD" .Data.total}} reads $1,289.00; cents "USD" reads a
		// value in minor units; date, percent and bytes as in formats.
		"currency": func(code string, v any) string {
			return approval.ValueFormat{Kind: approval.FormatCurrency, Currency: code}.Apply(v)
		},
		"cents": func(code string, v any) string {
			return approval.ValueFormat{Kind: approval.FormatCurrency, Currency: code, MinorUnits: true}.Apply(v)
		},
		"date":    func(v any) string { return approval.ValueFormat{Kind: approval.FormatDate}.Apply(v) },
		"percent": func(v any) string { return approval.ValueFormat{Kind: approval.FormatPercent}.Apply(v) },
		"bytes":   func(v any) string { return approval.ValueFormat{Kind: approval.FormatBytes}.Apply(v) },
	}
}

// parseTemplate parses text with Funcs, reporting errors at path.
func (d *decoder) parseTemplate(path, text string) {
	tpl, err := template.New(path).Funcs(Funcs(nil)).Parse(text)
	if err != nil {
		msg := strings.TrimPrefix(err.Error(), "template: "+path+":")
		d.errAt(path, "template: line %s", msg)
		return
	}
	if p := envArgProblem(tpl); p != "" {
		d.errAt(path, "%s", p)
	}
}

// checkURL parses a URL template and makes sure the model's arguments can
// never choose where a request goes (hostProblem): the scheme and host are
// written literally, or come from the operator's environment as a base URL
// that a "/", "?" or "#" ends.
func (d *decoder) checkURL(path, url string) {
	d.parseTemplate(path, url) // reports a syntax error or a bad env
	tpl, err := template.New(path).Funcs(Funcs(nil)).Parse(url)
	if err != nil {
		return
	}
	if p := hostProblem(tpl); p != "" {
		d.errAt(path, "%s, got %q", p, url)
	}
}
