package policyfile

import (
	"strings"
	"text/template"
	"text/template/parse"
)

// This file: the host rule of URL templates. The model's arguments may
// fill a URL's path and query, never choose where the request goes (and
// with it the Authorization header the operator's env builds).

// URLPrefix is the fixed beginning of a URL template: its text and its
// {{env "NAME"}} values (read with getenv) up to the first action of any
// other kind, the first that can print something the model chose. whole
// reports that the template is nothing more. Leading space is dropped, as
// it is from the rendered URL.
//
// check refuses a template whose prefix does not hold the scheme and the
// whole host; at run time the rendered URL's scheme, userinfo and host
// (with port) must be the prefix's (agent.HTTPTools), so a template that
// escaped check still cannot move a request.
func URLPrefix(tpl *template.Template, getenv func(string) string) (prefix string, whole bool) {
	if tpl == nil || tpl.Tree == nil || tpl.Tree.Root == nil {
		return "", true
	}
	var b strings.Builder
	for _, n := range tpl.Tree.Root.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			b.Write(n.Text)
		case *parse.ActionNode:
			name, ok := envCall(n.Pipe)
			if !ok {
				return strings.TrimLeft(b.String(), " \t\r\n"), false
			}
			if getenv != nil {
				b.WriteString(getenv(name))
			}
		default:
			return strings.TrimLeft(b.String(), " \t\r\n"), false
		}
	}
	return strings.TrimLeft(b.String(), " \t\r\n"), true
}

// envCall is NAME when p is exactly {{env "NAME"}}.
func envCall(p *parse.PipeNode) (string, bool) {
	if p == nil || len(p.Decl) > 0 || len(p.Cmds) != 1 || len(p.Cmds[0].Args) != 2 {
		return "", false
	}
	id, ok := p.Cmds[0].Args[0].(*parse.IdentifierNode)
	s, lit := p.Cmds[0].Args[1].(*parse.StringNode)
	if !ok || id.Ident != "env" || !lit {
		return "", false
	}
	return s.Text, true
}

// envMark stands for an env value in a prefix check reads: check cannot
// know the value, only where it is.
const envMark = "\x00"

// hostProblem says why the URL template tpl (parsed with Funcs) lets
// something other than fixed text or an env value choose its scheme or
// host; "" when it does not. Two forms pass: a literal scheme and host
// (env values may stand for parts of the host) ended by "/", "?", "#" or
// the template's end, and an env value that begins the URL (a base URL
// from the operator) followed by "/", "?", "#" or nothing, so the host
// ends where the env value ends.
func hostProblem(tpl *template.Template) string {
	prefix, whole := URLPrefix(tpl, func(string) string { return envMark })
	if rest, ok := strings.CutPrefix(prefix, envMark); ok {
		if (rest == "" && whole) || strings.ContainsAny(rest[:min(1, len(rest))], "/?#") {
			return ""
		}
		return "an env value that begins the URL must be followed by /, ? or # (the host ends where the env value ends)"
	}
	const literally = "the scheme and host must be written literally (templates may fill only the path and query)"
	var authority string
	switch {
	case strings.HasPrefix(prefix, "http://"), strings.HasPrefix(prefix, "https://"):
		_, authority, _ = strings.Cut(prefix, "://")
	case !whole && (strings.HasPrefix("http://", prefix) || strings.HasPrefix("https://", prefix)):
		return literally // an action writes (part of) the scheme
	default:
		return "must start with http:// or https://"
	}
	end := strings.IndexAny(authority, "/?#")
	switch {
	case end < 0 && !whole:
		return literally
	case end < 0:
		end = len(authority)
	}
	if authority[:end] == "" {
		return "the host is empty"
	}
	return ""
}

// envArgProblem says where a template calls env with anything but a
// literal name ({{env .Args.name}} would let the model pick which of the
// operator's secrets a request carries); "" when it does not.
func envArgProblem(tpl *template.Template) string {
	for _, t := range tpl.Templates() {
		if t.Tree == nil {
			continue
		}
		if p := envArgInNode(t.Tree.Root); p != "" {
			return p
		}
	}
	return ""
}

func envArgInNode(n parse.Node) string {
	var nodes []parse.Node
	switch n := n.(type) {
	case *parse.ListNode:
		if n != nil {
			nodes = n.Nodes
		}
	case *parse.ActionNode:
		nodes = []parse.Node{n.Pipe}
	case *parse.IfNode:
		nodes = []parse.Node{n.Pipe, n.List, n.ElseList}
	case *parse.RangeNode:
		nodes = []parse.Node{n.Pipe, n.List, n.ElseList}
	case *parse.WithNode:
		nodes = []parse.Node{n.Pipe, n.List, n.ElseList}
	case *parse.TemplateNode:
		nodes = []parse.Node{n.Pipe}
	case *parse.PipeNode:
		if n == nil {
			return ""
		}
		for _, c := range n.Cmds {
			if id, ok := c.Args[0].(*parse.IdentifierNode); ok && id.Ident == "env" {
				if _, lit := argAt(c.Args, 1).(*parse.StringNode); !lit || len(c.Args) != 2 {
					return `env takes one literal name, as in {{env "NAME"}}, got {{` + c.String() + `}}`
				}
			}
			nodes = append(nodes, c.Args...)
		}
	}
	for _, c := range nodes {
		if c == nil {
			continue
		}
		if p := envArgInNode(c); p != "" {
			return p
		}
	}
	return ""
}

func argAt(args []parse.Node, i int) parse.Node {
	if i < len(args) {
		return args[i]
	}
	return nil
}
