package agent

import (
	"bytes"
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"sync"
	"text/template"
	"text/template/parse"
	"time"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/option"
	"github.com/countersign/countersign/approval/policyfile"
)

// Defaults for HTTP tools whose spec leaves them out (a File from
// policyfile.Parse has them filled already).
const (
	DefaultHTTPTimeout      = 10 * time.Second
	DefaultMaxResponseBytes = 1 << 20
	// maxPreviewBytes bounds a preview response.
	maxPreviewBytes = 1 << 20
)

// HTTPTools builds a Tool for every tool of file that declares http. Its
// templates (URL, header values, body; preview URL, headers, summary) see
// .Args (the call's arguments), .RequestID and the functions of
// policyfile.Funcs: env "NAME" (from env; values are secrets, never logged
// or audited, and never shown in error text), json and urlquery. Every
// value a URL template writes is escaped for where it lands
// (escapeURLTemplate).
//
// Each call sends Idempotency-Key: <request id>; a response outside 2xx is
// an error result for the model; a response beyond the size limit is cut
// with a note. Without a body template, POST, PUT and PATCH send the
// arguments as JSON. HTTP tools are RetrySafe: after a crash, a claimed
// call without a recorded outcome is sent again with the same key.
// client may be nil (http.DefaultClient's transport, per-tool timeouts).
//
// Redirects are followed only within the scheme and host (with port) of the
// URL the tool called: a redirect elsewhere is not followed, and its 3xx is
// the response (an error result for a call, "returned 3xx" for a
// preview). Header values (often secrets from env) are copied to every
// redirect by net/http except Authorization and Cookie, and even those
// when only the port differs, and a 307/308 re-sends the body: a side
// effect must never move to a host the policy file does not name. client
// is copied, not changed.
func HTTPTools(file *policyfile.File, env func(string) string, client *http.Client) ([]Tool, error) {
	client = cmp.Or(client, &http.Client{})
	c := *client
	c.CheckRedirect = sameOrigin(client.CheckRedirect)
	client = &c
	env = option.FuncOr(env, func(string) string { return "" })
	var tools []Tool
	var errs []error
	for i, spec := range file.Tools {
		if spec.HTTP == nil {
			continue
		}
		t, err := newHTTPTool(spec, file.Policy.Tools[spec.Name], env, client)
		if err != nil {
			errs = append(errs, fmt.Errorf("tools[%d] (%s).%w", i, spec.Name, err))
			continue
		}
		tools = append(tools, t)
	}
	if len(errs) > 0 {
		return nil, errors.Join(errs...)
	}
	return tools, nil
}

// maxRedirects is net/http's default bound, kept when redirects are
// limited to the origin.
const maxRedirects = 10

// sameOrigin is a CheckRedirect that stops at a redirect leaving the first
// request's scheme and host, then defers to next (nil: net/http's default).
func sameOrigin(next func(*http.Request, []*http.Request) error) func(*http.Request, []*http.Request) error {
	return func(req *http.Request, via []*http.Request) error {
		first := via[0].URL
		if req.URL.Scheme != first.Scheme || !strings.EqualFold(req.URL.Host, first.Host) {
			return http.ErrUseLastResponse
		}
		if next != nil {
			return next(req, via)
		}
		if len(via) >= maxRedirects {
			return fmt.Errorf("stopped after %d redirects", maxRedirects)
		}
		return nil
	}
}

type httpTool struct {
	spec    policyfile.Tool
	policy  approval.ToolPolicy
	env     func(string) string
	client  *http.Client
	url     *template.Template
	headers map[string]*template.Template
	body    *template.Template // nil: the arguments as JSON

	previewURL     *template.Template
	previewHeaders map[string]*template.Template
	previewSummary *template.Template

	// Each template cloned once with env bound, as it is executed:
	// urlRuns for the URL templates (a pool: each clone records the env
	// values one execution used), bound for the others.
	urlRuns map[*template.Template]*sync.Pool
	bound   map[*template.Template]*template.Template
}

// urlRun is a clone of a URL template whose env records the values it
// returned, which renderURL redacts from the URL it shows; pooled, since
// the record is one execution's.
type urlRun struct {
	tpl  *template.Template
	used []string
}

// bind clones the parsed templates once with env bound, so that a call
// executes them without cloning them again (a clone and its FuncMap were
// most of what rendering a URL cost).
func (t *httpTool) bind() {
	t.urlRuns = map[*template.Template]*sync.Pool{}
	for _, tpl := range []*template.Template{t.url, t.previewURL} {
		if tpl == nil {
			continue
		}
		t.urlRuns[tpl] = &sync.Pool{New: func() any {
			r := &urlRun{}
			r.tpl = template.Must(tpl.Clone()).Funcs(policyfile.Funcs(func(name string) string {
				v := t.env(name)
				r.used = append(r.used, v)
				return v
			}))
			return r
		}}
	}
	t.bound = map[*template.Template]*template.Template{}
	funcs := policyfile.Funcs(t.env)
	others := []*template.Template{t.body, t.previewSummary}
	for _, hs := range []map[string]*template.Template{t.headers, t.previewHeaders} {
		for _, tpl := range hs {
			others = append(others, tpl)
		}
	}
	for _, tpl := range others {
		if tpl != nil {
			t.bound[tpl] = template.Must(tpl.Clone()).Funcs(funcs)
		}
	}
}

var _ RetrySafe = (*httpTool)(nil)

func newHTTPTool(spec policyfile.Tool, pol approval.ToolPolicy, env func(string) string, client *http.Client) (*httpTool, error) {
	t := &httpTool{spec: spec, policy: pol, env: env, client: client}
	parse := func(key, text string) (*template.Template, error) {
		tpl, err := template.New(key).Funcs(policyfile.Funcs(nil)).Option("missingkey=zero").Parse(text)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", key, err)
		}
		return tpl, nil
	}
	var err error
	if strings.TrimSpace(spec.HTTP.URL) == "" {
		return nil, errors.New("http.url: required")
	}
	if t.url, err = parse("http.url", spec.HTTP.URL); err != nil {
		return nil, err
	}
	escapeURLTemplate(t.url)
	if t.headers, err = parseHeaders("http.headers", spec.HTTP.Headers, parse); err != nil {
		return nil, err
	}
	if spec.HTTP.Body != "" {
		if t.body, err = parse("http.body", spec.HTTP.Body); err != nil {
			return nil, err
		}
	}
	if p := spec.Preview; p != nil && p.URL != "" {
		if t.previewURL, err = parse("preview.url", p.URL); err != nil {
			return nil, err
		}
		escapeURLTemplate(t.previewURL)
		if t.previewHeaders, err = parseHeaders("preview.headers", p.Headers, parse); err != nil {
			return nil, err
		}
	}
	if p := spec.Preview; p != nil && p.Summary != "" {
		if t.previewSummary, err = parse("preview.summary", p.Summary); err != nil {
			return nil, err
		}
	}
	t.bind()
	return t, nil
}

func parseHeaders(key string, hs map[string]string, parse func(string, string) (*template.Template, error)) (map[string]*template.Template, error) {
	out := map[string]*template.Template{}
	for k, v := range hs {
		tpl, err := parse(key+"."+k, v)
		if err != nil {
			return nil, err
		}
		out[k] = tpl
	}
	return out, nil
}

func (t *httpTool) Name() string            { return t.spec.Name }
func (t *httpTool) Description() string     { return t.spec.Description }
func (t *httpTool) Schema() json.RawMessage { return t.spec.Schema }
func (t *httpTool) Risk() approval.Risk     { return t.policy.Risk }
func (t *httpTool) Capabilities() []string  { return t.policy.Capabilities }

// RetrySafe: every call carries its request id as Idempotency-Key.
func (t *httpTool) RetrySafe() bool { return true }

// The escapers escapeURLTemplate puts at the end of every value a URL
// template writes, by where the value lands.
const (
	escPathFunc  = "urlpath"  // a path segment: percent-encoded, never empty, "." or ".."
	escQueryFunc = "urlvalue" // a query value or the fragment: percent-encoded
)

// escapeURLTemplate makes every value a URL template writes pass through
// urlpath (before the first "?" or "#") or urlvalue (after it), in place of
// an urlquery the author wrote; only env (the operator's own settings) is
// left as it is. So a model's argument fills exactly one path segment or
// one query value: it can never add segments, climb with "..", start a
// query or a fragment, or leave a segment empty (DELETE /customers/).
// Where a branch leaves it unclear whether the query has begun, the
// stricter path rule applies.
func escapeURLTemplate(tpl *template.Template) {
	tpl.Funcs(template.FuncMap{escPathFunc: urlPath, escQueryFunc: urlValue})
	for _, t := range tpl.Templates() {
		if t.Tree != nil {
			var e urlEscaper
			e.list(t.Tree.Root)
		}
	}
}

// urlEscaper walks a URL template in order, knowing whether the text so
// far has begun the query.
type urlEscaper struct{ query bool }

func (e *urlEscaper) list(l *parse.ListNode) {
	if l == nil {
		return
	}
	for _, n := range l.Nodes {
		switch n := n.(type) {
		case *parse.TextNode:
			if bytes.ContainsAny(n.Text, "?#") {
				e.query = true
			}
		case *parse.ActionNode:
			e.pipe(n.Pipe)
		case *parse.IfNode:
			e.branch(&n.BranchNode)
		case *parse.RangeNode:
			e.branch(&n.BranchNode)
		case *parse.WithNode:
			e.branch(&n.BranchNode)
		}
	}
}

func (e *urlEscaper) branch(b *parse.BranchNode) {
	before := e.query
	e.list(b.List)
	then := e.query
	e.query = before
	e.list(b.ElseList)
	e.query = then && e.query
	if b.NodeType == parse.NodeRange {
		e.query = before // the body may run no time or many
	}
}

// pipe ends a pipeline that prints something with the escaper.
func (e *urlEscaper) pipe(p *parse.PipeNode) {
	if p == nil || len(p.Decl) > 0 || len(p.Cmds) == 0 {
		return // {{$x := …}} prints nothing
	}
	esc := escPathFunc
	if e.query {
		esc = escQueryFunc
	}
	last := p.Cmds[len(p.Cmds)-1]
	if id, ok := last.Args[0].(*parse.IdentifierNode); ok {
		switch id.Ident {
		case "env", escPathFunc, escQueryFunc:
			return
		case "urlquery": // its "+" for a space is wrong in a path
			last.Args[0] = parse.NewIdentifier(esc).SetPos(id.Pos)
			return
		}
	}
	p.Cmds = append(p.Cmds, &parse.CommandNode{NodeType: parse.NodeCommand, Pos: p.Pos,
		Args: []parse.Node{parse.NewIdentifier(esc).SetPos(p.Pos)}})
}

// urlPath escapes a path segment; it refuses an empty segment and the dot
// segments, which would change which resource is meant.
func urlPath(args ...any) (string, error) {
	s := joinArgs(args)
	if s == "" || s == "." || s == ".." {
		return "", fmt.Errorf("a path segment cannot be %q", s)
	}
	return percentEncode(s), nil
}

// urlValue escapes a query value or a fragment.
func urlValue(args ...any) string { return percentEncode(joinArgs(args)) }

// joinArgs prints template arguments as urlquery does; a missing value is
// empty.
func joinArgs(args []any) string {
	switch {
	case len(args) == 1 && args[0] == nil:
		return ""
	case len(args) == 1:
		return fmt.Sprint(args[0])
	}
	return fmt.Sprint(args...)
}

// percentEncode encodes all but RFC 3986's unreserved characters (letters,
// digits, - . _ ~), which is right in a path segment and a query value
// alike.
func percentEncode(s string) string {
	var b strings.Builder
	for i := range len(s) {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9', c == '-', c == '.', c == '_', c == '~':
			b.WriteByte(c)
		default:
			fmt.Fprintf(&b, "%%%02X", c)
		}
	}
	return b.String()
}

// tplData is what HTTP templates see.
type tplData struct {
	Args      map[string]any
	RequestID string
	Data      any // preview summary only: the response JSON
}

func argsMap(args json.RawMessage) (map[string]any, error) {
	m := map[string]any{}
	if len(bytes.TrimSpace(args)) == 0 {
		return m, nil
	}
	dec := json.NewDecoder(bytes.NewReader(args))
	dec.UseNumber()
	if err := dec.Decode(&m); err != nil {
		return nil, fmt.Errorf("arguments: %w", err)
	}
	return m, nil
}

// rendered is a URL ready to call and the form of it that may be shown.
type rendered struct {
	url     string
	display string
}

// renderURL executes a URL template. env values other than a leading base
// URL are replaced by [redacted] in the display form, and so is userinfo.
func (t *httpTool) renderURL(tpl *template.Template, src string, d tplData) (rendered, error) {
	src = strings.TrimSpace(src)
	based := strings.HasPrefix(src, "{{env ") || strings.HasPrefix(src, "{{ env ")
	runs := t.urlRuns[tpl]
	run := runs.Get().(*urlRun)
	defer runs.Put(run)
	run.used = run.used[:0]
	var b bytes.Buffer
	if err := run.tpl.Execute(&b, d); err != nil {
		return rendered{}, fmt.Errorf("render url: %w", err)
	}
	used := run.used
	raw := strings.TrimSpace(b.String())
	display := raw
	for i, v := range used {
		if v == "" || (i == 0 && based && strings.HasPrefix(raw, v)) {
			continue
		}
		display = strings.ReplaceAll(display, v, "[redacted]")
	}
	u, err := url.Parse(raw)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return rendered{}, fmt.Errorf("render url: %q is not an http(s) URL", display)
	}
	if err := t.sameHost(tpl, u); err != nil {
		return rendered{}, fmt.Errorf("render url: %q: %w", display, err)
	}
	if u.User != nil {
		if du, err := url.Parse(display); err == nil {
			du.User = nil
			display = du.String()
		}
	}
	return rendered{url: raw, display: display}, nil
}

// ErrHostChanged is why a call whose rendered URL does not go to the
// scheme and host its template fixes fails: nothing was sent.
var ErrHostChanged = errors.New("not sent: its scheme or host is not the one the URL template fixes")

// sameHost fails closed unless u has the scheme, userinfo and host (with
// port) of tpl's fixed beginning (policyfile.URLPrefix: its text and env
// values), so what the model wrote can never choose where a request and
// its headers go, even for a template that check did not see. The hosts
// are compared as written: a change of case, an encoded dot, a port or
// userinfo added is a change.
func (t *httpTool) sameHost(tpl *template.Template, u *url.URL) error {
	prefix, _ := policyfile.URLPrefix(tpl, t.env)
	if _, authority, ok := strings.Cut(prefix, "://"); ok {
		if end := strings.IndexAny(authority, "/?#"); end >= 0 {
			prefix = prefix[:len(prefix)-len(authority)+end] // the path is not compared
		}
	}
	want, err := url.Parse(prefix)
	if err != nil || want.Host == "" {
		return ErrHostChanged // the template fixes none: check refuses it
	}
	if u.Scheme != want.Scheme || u.Host != want.Host || u.User.String() != want.User.String() {
		return ErrHostChanged
	}
	return nil
}

func (t *httpTool) render(tpl *template.Template, d tplData) (string, error) {
	var b bytes.Buffer
	if err := t.bound[tpl].Execute(&b, d); err != nil {
		return "", err
	}
	return b.String(), nil
}

func (t *httpTool) setHeaders(req *http.Request, hs map[string]*template.Template, d tplData) error {
	for k, tpl := range hs {
		v, err := t.render(tpl, d)
		if err != nil {
			return fmt.Errorf("render header %s", k) // no detail: values may hold secrets
		}
		req.Header.Set(k, strings.TrimSpace(v))
	}
	return nil
}

// Run sends the request and returns the response body.
func (t *httpTool) Run(ctx context.Context, inv Invocation) (string, error) {
	args, err := argsMap(inv.Args)
	if err != nil {
		return "", err
	}
	d := tplData{Args: args, RequestID: inv.RequestID}
	u, err := t.renderURL(t.url, t.spec.HTTP.URL, d)
	if err != nil {
		return "", err
	}
	method := t.spec.HTTP.Method
	if method == "" {
		method = http.MethodPost
	}
	var body io.Reader
	switch {
	case t.body != nil:
		s, err := t.render(t.body, d)
		if err != nil {
			return "", fmt.Errorf("render body: %w", err)
		}
		body = strings.NewReader(s)
	case method == http.MethodPost || method == http.MethodPut || method == http.MethodPatch:
		body = bytes.NewReader(inv.Args)
	}
	timeout := option.PositiveOr(t.spec.HTTP.Timeout, DefaultHTTPTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, method, u.url, body)
	if err != nil {
		return "", fmt.Errorf("%s %s: %v", method, u.display, errors.Unwrap(err))
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	if err := t.setHeaders(req, t.headers, d); err != nil {
		return "", err
	}
	req.Header.Set("Idempotency-Key", inv.RequestID)
	resp, err := t.client.Do(req)
	if err != nil {
		return "", fmt.Errorf("%s %s: %s", method, u.display, transportError(err))
	}
	defer resp.Body.Close()
	limit := option.PositiveOr(t.spec.HTTP.MaxBodyBytes, DefaultMaxResponseBytes)
	out, err := io.ReadAll(io.LimitReader(resp.Body, limit+1))
	if err != nil {
		return "", fmt.Errorf("%s %s: reading the response: %s", method, u.display, transportError(err))
	}
	text := clip.Bytes(string(out), int(limit)) // at most limit bytes, the marker included
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return "", fmt.Errorf("%s %s returned %d: %s", method, u.display, resp.StatusCode, clip.Bytes(strings.TrimSpace(text), 500))
	}
	return text, nil
}

// transportError describes a client error without the URL it carries.
func transportError(err error) string {
	var ue *url.Error
	if errors.As(err, &ue) {
		if ue.Timeout() {
			return "timed out"
		}
		return ue.Err.Error()
	}
	return err.Error()
}

// Preview fetches the system-of-record facts for the card. A failed fetch
// gives a Preview whose Error says so plainly (nil error).
func (t *httpTool) Preview(ctx context.Context, raw json.RawMessage) (approval.Preview, error) {
	if t.previewURL == nil {
		return approval.Preview{}, nil
	}
	args, err := argsMap(raw)
	if err != nil {
		return approval.Preview{}, err
	}
	d := tplData{Args: args}
	u, err := t.renderURL(t.previewURL, t.spec.Preview.URL, d)
	if err != nil {
		return approval.Preview{Error: "preview unavailable: " + err.Error()}, nil
	}
	p := approval.Preview{Source: t.spec.Preview.Label}
	unavailable := func(format string, a ...any) (approval.Preview, error) {
		p.Error = "preview unavailable: GET " + u.display + " " + fmt.Sprintf(format, a...)
		return p, nil
	}
	timeout := option.PositiveOr(t.spec.Preview.Timeout, DefaultPreviewTimeout)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u.url, nil)
	if err != nil {
		return unavailable("could not be built")
	}
	req.Header.Set("Accept", "application/json")
	if err := t.setHeaders(req, t.previewHeaders, d); err != nil {
		return unavailable("failed: %v", err)
	}
	resp, err := t.client.Do(req)
	if err != nil {
		return unavailable("failed: %s", transportError(err))
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxPreviewBytes))
	if err != nil {
		return unavailable("failed reading the response: %s", transportError(err))
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return unavailable("returned %d", resp.StatusCode)
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.UseNumber()
	var data any
	if err := dec.Decode(&data); err != nil {
		return unavailable("returned a response that is not JSON")
	}
	for _, f := range t.spec.Preview.Fields {
		v, ok := lookupPath(data, f.Path)
		value := "(not in the system of record)"
		if ok {
			value = f.Format.Apply(v) // the zero format shows the value as it is
		}
		p.Facts = append(p.Facts, approval.Fact{Label: f.Label, Value: value})
	}
	if t.previewSummary != nil {
		d.Data = data
		s, err := t.render(t.previewSummary, d)
		if err == nil {
			p.Summary = strings.TrimSpace(s)
		}
	}
	return p, nil
}

// lookupPath follows a dotted path ("customer.name", "items.0") into
// decoded JSON.
func lookupPath(v any, path string) (any, bool) {
	for _, part := range strings.Split(path, ".") {
		switch x := v.(type) {
		case map[string]any:
			next, ok := x[part]
			if !ok {
				return nil, false
			}
			v = next
		case []any:
			i, err := strconv.Atoi(part)
			if err != nil || i < 0 || i >= len(x) {
				return nil, false
			}
			v = x[i]
		default:
			return nil, false
		}
	}
	return v, true
}
