// Package scripted is a deterministic, offline chat model served as an
// OpenAI-compatible HTTP handler (POST /v1/chat/completions and
// /chat/completions), so the demo and the tests drive the agent through the
// real go-openai client without the internet.
//
// # Rules (the default behaviour)
//
// Each request is answered from the conversation alone. The task is the
// last user message; everything after it (assistant tool calls and the
// tool messages answering them) is what happened so far. Every rule whose
// tool is offered, whose phrase the task contains, that has not yet called
// its tool for this task and whose inputs are available proposes one call;
// all calls proposed in one turn go out together as parallel tool calls.
// When no rule proposes anything, the reply is a final answer that lists
// every tool call of the task with its result, quoted from the tool
// messages (so it says truthfully what ran, what was rejected and why,
// what was edited, what failed).
//
// DefaultRules, in order:
//
//   - "order 1234" (also "order #1234") → lookup_order {order_id: "1234"}.
//   - "email" or "apologi…" → send_email {to, subject, body}; "to" is an
//     address written in the task, else the customer's email from the
//     lookup_order result ("customer.email" or "email"), so with an order
//     it waits for the lookup.
//   - "refund" with "shipping" → issue_refund {order_id, amount, reason};
//     amount is the shipping cost from the lookup_order result
//     ("shipping", "shipping_cost" or "shipping.cost"). "refund $40" uses
//     the amount written instead.
//   - "delete customer C-123" → delete_customer {customer_id: "C-123"}.
//   - "rush order 1234" → set_order_priority {order_id: "1234", priority:
//     "rush"}.
//
// So "Order 1234 arrived damaged: apologise by email and refund the
// shipping" gives lookup_order first, then send_email and issue_refund in
// one batch, then the summary. Every proposed call carries confidence 0.9
// and a one-line reason, under the property names the agent offers for
// them (found by their descriptions; see agent.ConfidenceDescription).
//
// # Programmable fake
//
// Tests queue exact replies with Enqueue (each request takes the next one;
// the rules answer when the queue is empty), make a request fail with
// Reply.Status, and read every request received with Requests.
package scripted

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// Call is one tool call in a reply.
type Call struct {
	// ID is the tool_call_id, default "call_<turn>_<n>".
	ID   string
	Tool string
	// Args is the arguments text exactly as the model writes it; it may be
	// malformed on purpose.
	Args string
}

// Reply is one queued model reply.
type Reply struct {
	Content   string
	ToolCalls []Call
	// Status, when non-zero, answers with this HTTP status and an
	// OpenAI-style error body instead.
	Status int
	// Func, when set, computes the reply from the request.
	Func func(openai.ChatCompletionRequest) Reply
}

// Turn is what a rule sees: the task and what happened since.
type Turn struct {
	// Task is the last user message.
	Task string
	// Called is the set of tools already called for the task.
	Called map[string]bool
	// Results maps a tool to the content of its latest tool message.
	Results map[string]string
}

// Rule proposes one call of Tool when Match(task) holds and it has not
// been called for this task yet.
type Rule struct {
	Name string
	Tool string
	// Match reports whether the task (lower-cased) asks for this.
	Match func(task string) bool
	// Args builds the arguments, or reports false while its inputs (e.g. a
	// lookup result) are not available.
	Args func(t Turn) (map[string]any, bool)
	// Reason is the model's stated reason sent with the call.
	Reason string
	// Lookup marks a rule that only gathers facts: a task that no other
	// rule matches is answered with what the model can do, since looking
	// something up did not do what was asked.
	Lookup bool
}

// Model is the scripted model. It is safe for concurrent use.
type Model struct {
	rules []Rule

	mu       sync.Mutex // guards queue, requests and received
	queue    []Reply
	requests []openai.ChatCompletionRequest // the last ones: RequestsLimit to twice that once full
	received int                            // every request, numbering the completions
}

// RequestsLimit is how many requests Requests keeps: each holds a whole
// conversation, and the demo's model answers for as long as it runs.
const RequestsLimit = 100

var _ http.Handler = (*Model)(nil)

// New returns a Model answering with rules, DefaultRules when none given.
func New(rules ...Rule) *Model {
	if len(rules) == 0 {
		rules = DefaultRules()
	}
	return &Model{rules: rules}
}

// Enqueue queues exact replies, answered in order before the rules.
func (m *Model) Enqueue(replies ...Reply) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.queue = append(m.queue, replies...)
}

// Requests returns the requests received so far, oldest first: every one,
// or the last RequestsLimit of them.
func (m *Model) Requests() []openai.ChatCompletionRequest {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Clone(m.requests[max(0, len(m.requests)-RequestsLimit):])
}

// ServeHTTP answers POST /v1/chat/completions and /chat/completions.
func (m *Model) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	path := strings.TrimSuffix(r.URL.Path, "/")
	if r.Method != http.MethodPost || (path != "/v1/chat/completions" && path != "/chat/completions") {
		writeError(w, http.StatusNotFound, "not found: only POST /v1/chat/completions is served")
		return
	}
	var req openai.ChatCompletionRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, 32<<20)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, "invalid request: "+err.Error())
		return
	}
	m.mu.Lock()
	m.requests = append(m.requests, req)
	if len(m.requests) >= 2*RequestsLimit { // a copy, so the old ones are freed
		m.requests = slices.Clone(m.requests[len(m.requests)-RequestsLimit:])
	}
	m.received++
	n := m.received
	var reply Reply
	queued := len(m.queue) > 0
	if queued {
		reply = m.queue[0]
		m.queue = m.queue[1:]
	}
	m.mu.Unlock()
	if !queued {
		reply = Reply{Func: m.Respond}
	}
	if reply.Func != nil {
		reply = reply.Func(req)
	}
	if reply.Status != 0 {
		writeError(w, reply.Status, fmt.Sprintf("scripted error %d", reply.Status))
		return
	}
	msg := openai.ChatCompletionMessage{Role: openai.ChatMessageRoleAssistant, Content: reply.Content}
	turn := assistantTurns(req.Messages) + 1
	for i, c := range reply.ToolCalls {
		id := c.ID
		if id == "" {
			id = fmt.Sprintf("call_%d_%d", turn, i+1)
		}
		msg.ToolCalls = append(msg.ToolCalls, openai.ToolCall{
			ID: id, Type: openai.ToolTypeFunction,
			Function: openai.FunctionCall{Name: c.Tool, Arguments: c.Args},
		})
	}
	finish := openai.FinishReasonStop
	if len(msg.ToolCalls) > 0 {
		finish = openai.FinishReasonToolCalls
	}
	model := req.Model
	if model == "" {
		model = "scripted"
	}
	resp := openai.ChatCompletionResponse{
		ID: fmt.Sprintf("chatcmpl-scripted-%d", n), Object: "chat.completion", Model: model,
		Choices: []openai.ChatCompletionChoice{{Index: 0, Message: msg, FinishReason: finish}},
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(resp)
}

// propsOf finds the agent's confidence and reason properties in an offered
// schema by their descriptions ("Optional: your confidence…", "Optional:
// why you propose…"); a tool's own "reason" argument is left alone.
func propsOf(params any) [2]string {
	var out [2]string
	b, err := json.Marshal(params)
	if err != nil {
		return out
	}
	var schema struct {
		Properties map[string]struct {
			Description string `json:"description"`
		} `json:"properties"`
	}
	if json.Unmarshal(b, &schema) != nil {
		return out
	}
	for name, p := range schema.Properties {
		switch {
		case strings.HasPrefix(p.Description, "Optional: your confidence"):
			out[0] = name
		case strings.HasPrefix(p.Description, "Optional: why you propose"):
			out[1] = name
		}
	}
	return out
}

func writeError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": "scripted_error"}})
}

func assistantTurns(msgs []openai.ChatCompletionMessage) int {
	n := 0
	for _, m := range msgs {
		if m.Role == openai.ChatMessageRoleAssistant {
			n++
		}
	}
	return n
}

// Respond is the rule-based reply to req (what ServeHTTP answers when the
// queue is empty).
func (m *Model) Respond(req openai.ChatCompletionRequest) Reply {
	last := -1
	for i, msg := range req.Messages {
		if msg.Role == openai.ChatMessageRoleUser {
			last = i
		}
	}
	if last < 0 {
		return Reply{Content: "There is no task to work on."}
	}
	t := Turn{Task: req.Messages[last].Content, Called: map[string]bool{}, Results: map[string]string{}}
	type done struct{ tool, args, result string }
	var history []done
	byID := map[string]int{}
	for _, msg := range req.Messages[last+1:] {
		switch msg.Role {
		case openai.ChatMessageRoleAssistant:
			for _, tc := range msg.ToolCalls {
				t.Called[tc.Function.Name] = true
				byID[tc.ID] = len(history)
				history = append(history, done{tool: tc.Function.Name, args: tc.Function.Arguments})
			}
		case openai.ChatMessageRoleTool:
			if i, ok := byID[msg.ToolCallID]; ok {
				history[i].result = msg.Content
				t.Results[history[i].tool] = msg.Content
			}
		}
	}
	offered := map[string]bool{}
	agentProps := map[string][2]string{}
	for _, tool := range req.Tools {
		if tool.Function != nil {
			offered[tool.Function.Name] = true
			agentProps[tool.Function.Name] = propsOf(tool.Function.Parameters)
		}
	}
	task := strings.ToLower(t.Task)
	var calls []Call
	for _, r := range m.rules {
		if !offered[r.Tool] || t.Called[r.Tool] || !r.Match(task) {
			continue
		}
		args, ok := r.Args(t)
		if !ok {
			continue
		}
		props := agentProps[r.Tool]
		if props[0] != "" {
			args[props[0]] = 0.9
		}
		if props[1] != "" && r.Reason != "" {
			args[props[1]] = r.Reason
		}
		b, _ := json.Marshal(args)
		calls = append(calls, Call{Tool: r.Tool, Args: string(b)})
	}
	if len(calls) > 0 {
		return Reply{ToolCalls: calls}
	}
	// What this model can do with the tools offered, for a task it did not
	// know how to carry out.
	var can []string
	acted := false
	for _, r := range m.rules {
		if offered[r.Tool] {
			can = append(can, r.Name)
			acted = acted || (!r.Lookup && r.Match(task))
		}
	}
	canDo := "I am the demo's scripted model and only know these tasks: " + strings.Join(can, ", ") + "."
	if len(history) == 0 {
		return Reply{Content: "I have no tool for this task, so I did nothing. " + canDo}
	}
	var b strings.Builder
	b.WriteString("Here is what happened:")
	for _, h := range history {
		fmt.Fprintf(&b, "\n- %s: %s", h.tool, summarise(h.result))
	}
	if !acted {
		b.WriteString("\nI only looked things up: I cannot do the rest of what you asked. " + canDo)
	}
	return Reply{Content: b.String()}
}

// summarise quotes a tool message: refusals and errors in full (up to 400
// characters), a rejection without its reason (the task thread's line
// about the decision gives it, and saying it again is noise), successful
// output shortened.
func summarise(result string) string {
	r := strings.TrimSpace(result)
	if r == "" {
		return "no result"
	}
	lower := strings.ToLower(r)
	if strings.HasPrefix(lower, "not run") && strings.Contains(lower, " rejected ") {
		if head, _, ok := strings.Cut(r, " Reason: "); ok {
			r = head
		}
	}
	for _, p := range []string{"error", "not run", "outcome unknown"} {
		if strings.HasPrefix(lower, p) {
			return clip.Bytes(oneLine(r), 400)
		}
	}
	if strings.Contains(lower, "edited the") {
		// "<@U…> edited the … arguments (…); it ran with … Result: {json}":
		// the note in full, the result in brief.
		if note, res, ok := strings.Cut(r, "Result: "); ok {
			return clip.Bytes(oneLine(note), 300) + " Result: " + clip.Bytes(brief(strings.TrimSpace(res)), 200)
		}
		return clip.Bytes(oneLine(r), 400)
	}
	return "done — " + clip.Bytes(brief(r), 200)
}

// briefKeys are the fields of a JSON result worth repeating, in order.
var briefKeys = []string{"id", "status", "to", "subject", "order_id", "amount", "total", "shipping", "deleted", "error"}

// dollarKeys are the fields of the demo order system that are US dollars:
// the answer says "total $1,289.00", as a person (or a real model) would.
var dollarKeys = map[string]bool{"amount": true, "total": true, "shipping": true, "refunded": true}

var dollars = approval.ValueFormat{Kind: approval.FormatCurrency, Currency: "USD"}

// brief shortens a tool's JSON object output to its telling fields
// ("id EM-1, to dana@example.com, subject …"); other output is kept as one
// line.
func brief(result string) string {
	var obj map[string]any
	if json.Unmarshal([]byte(result), &obj) != nil {
		return oneLine(result)
	}
	var parts []string
	for _, k := range briefKeys {
		v, ok := obj[k]
		if !ok {
			continue
		}
		switch v := v.(type) {
		case string:
			parts = append(parts, fmt.Sprintf("%s %s", k, clip.Bytes(oneLine(v), 60)))
		case float64:
			if dollarKeys[k] {
				parts = append(parts, k+" "+dollars.Apply(v))
				continue
			}
			parts = append(parts, fmt.Sprintf("%s %v", k, v))
		case bool:
			parts = append(parts, fmt.Sprintf("%s %v", k, v))
		}
	}
	if len(parts) == 0 {
		return oneLine(result)
	}
	return strings.Join(parts, ", ")
}

func oneLine(s string) string { return strings.Join(strings.Fields(s), " ") }

var (
	orderRe    = regexp.MustCompile(`order\s*#?\s*(\d+)`)
	customerRe = regexp.MustCompile(`(?i)delete\s+customer\s+(c-\d+)`)
	emailRe    = regexp.MustCompile(`[a-zA-Z0-9._%+-]+@[a-zA-Z0-9.-]+\.[a-zA-Z]{2,}`)
	amountRe   = regexp.MustCompile(`refund\s+\$\s*(\d+(?:\.\d+)?)`)
)

// DefaultRules are the phrase → tool-call rules documented in the package
// comment.
func DefaultRules() []Rule {
	return []Rule{
		{
			Name: "look up the order", Tool: "lookup_order",
			Match:  func(task string) bool { return orderRe.MatchString(task) },
			Reason: "Look the order up before acting on it.",
			Lookup: true,
			Args: func(t Turn) (map[string]any, bool) {
				return map[string]any{"order_id": orderOf(t.Task)}, true
			},
		},
		{
			Name: "email the customer", Tool: "send_email",
			Match: func(task string) bool {
				return strings.Contains(task, "email") || strings.Contains(task, "apologi")
			},
			Reason: "The task asks to write to the customer.",
			Args: func(t Turn) (map[string]any, bool) {
				order := orderOf(t.Task)
				to := emailRe.FindString(t.Task)
				name := "there"
				if lookup, ok := t.Results["lookup_order"]; ok {
					data := decode(lookup)
					if to == "" {
						to = str(data, "customer.email", "email")
					}
					if n := str(data, "customer.name", "name"); n != "" {
						name = strings.Fields(n)[0]
					}
				}
				if to == "" {
					return nil, false // waits for the lookup, or cannot address it
				}
				subject := "Our apologies"
				if order != "" {
					subject = "About your order " + order
				}
				body := fmt.Sprintf("Dear %s,\n\nWe are sorry about the trouble with your order. We are putting it right.\n\nKind regards,\nSupport", name)
				return map[string]any{"to": to, "subject": subject, "body": body}, true
			},
		},
		{
			Name: "refund the shipping (or an amount)", Tool: "issue_refund",
			Match: func(task string) bool {
				return strings.Contains(task, "refund") && (strings.Contains(task, "shipping") || amountRe.MatchString(task))
			},
			Reason: "The task asks for a refund.",
			Args: func(t Turn) (map[string]any, bool) {
				order := orderOf(t.Task)
				if order == "" {
					return nil, false
				}
				var amount any
				if m := amountRe.FindStringSubmatch(strings.ToLower(t.Task)); m != nil {
					amount = json.Number(m[1])
				} else {
					lookup, ok := t.Results["lookup_order"]
					if !ok {
						return nil, false
					}
					s := str(decode(lookup), "shipping", "shipping_cost", "shipping.cost")
					if _, err := strconv.ParseFloat(s, 64); err != nil {
						return nil, false
					}
					amount = json.Number(s)
				}
				return map[string]any{"order_id": order, "amount": amount, "reason": "Refund of shipping for order " + order}, true
			},
		},
		{
			Name: "rush an order", Tool: "set_order_priority",
			Match:  func(task string) bool { return strings.Contains(task, "rush") && orderRe.MatchString(task) },
			Reason: "The task asks to rush this order.",
			Args: func(t Turn) (map[string]any, bool) {
				return map[string]any{"order_id": orderOf(t.Task), "priority": "rush"}, true
			},
		},
		{
			Name: "delete a customer", Tool: "delete_customer",
			Match:  func(task string) bool { return customerRe.MatchString(task) },
			Reason: "The task asks to delete this customer.",
			Args: func(t Turn) (map[string]any, bool) {
				m := customerRe.FindStringSubmatch(t.Task)
				return map[string]any{"customer_id": strings.ToUpper(m[1])}, true
			},
		},
	}
}

func orderOf(task string) string {
	m := orderRe.FindStringSubmatch(strings.ToLower(task))
	if m == nil {
		return ""
	}
	return m[1]
}

func decode(s string) any {
	dec := json.NewDecoder(strings.NewReader(s))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil
	}
	return v
}

// str returns the first of the dotted paths present in v, as text.
func str(v any, paths ...string) string {
	for _, p := range paths {
		cur := v
		ok := true
		for _, part := range strings.Split(p, ".") {
			m, isMap := cur.(map[string]any)
			if !isMap {
				ok = false
				break
			}
			if cur, ok = m[part]; !ok {
				break
			}
		}
		if !ok {
			continue
		}
		switch x := cur.(type) {
		case string:
			return x
		case json.Number:
			return x.String()
		}
	}
	return ""
}
