package policyfile

import (
	"regexp"
	"slices"
	"strings"
	"text/template"
	"text/template/parse"
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
