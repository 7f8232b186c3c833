package scripted_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/sashabaranov/go-openai"

	"github.com/countersign/countersign/agent/scripted"
)

func mustClient(tb testing.TB, m *scripted.Model) *openai.Client {
	tb.Helper()
	srv := httptest.NewServer(m)
	tb.Cleanup(srv.Close)
	cfg := openai.DefaultConfig("test")
	cfg.BaseURL = srv.URL + "/v1"
	cfg.HTTPClient = srv.Client()
	return openai.NewClientWithConfig(cfg)
}

func tool(name, schema string) openai.Tool {
	return openai.Tool{Type: openai.ToolTypeFunction, Function: &openai.FunctionDefinition{Name: name, Parameters: json.RawMessage(schema)}}
}

const agentProps = `"confidence":{"type":"number","description":"Optional: your confidence (0 to 1)"},` +
	`"%s":{"type":"string","description":"Optional: why you propose this call"}`

func schema(reasonProp string, own string) string {
	props := strings.Replace(agentProps, "%s", reasonProp, 1)
	if own != "" {
		props += "," + own
	}
	return `{"type":"object","properties":{` + props + `}}`
}

var demoTools = []openai.Tool{
	tool("lookup_order", schema("reason", `"order_id":{"type":"string"}`)),
	tool("send_email", schema("reason", `"to":{"type":"string"}`)),
	tool("issue_refund", schema("rationale", `"reason":{"type":"string"}`)),
	tool("delete_customer", schema("reason", `"customer_id":{"type":"string"}`)),
}

func ask(tb testing.TB, c *openai.Client, msgs []openai.ChatCompletionMessage) openai.ChatCompletionMessage {
	tb.Helper()
	resp, err := c.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "m", Messages: msgs, Tools: demoTools})
	if err != nil {
		tb.Fatalf("CreateChatCompletion: %v", err)
	}
	return resp.Choices[0].Message
}

// TestDefaultRules walks the documented demo conversation.
func TestDefaultRules(t *testing.T) {
	c := mustClient(t, scripted.New())
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "Order 1234 arrived damaged: apologise by email and refund the shipping"}}
	m := ask(t, c, msgs)
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "lookup_order" || m.ToolCalls[0].Function.Arguments != `{"confidence":0.9,"order_id":"1234","reason":"Look the order up before acting on it."}` {
		t.Fatalf("first reply = %+v, want lookup_order 1234", m.ToolCalls)
	}
	msgs = append(msgs, m, openai.ChatCompletionMessage{Role: "tool", ToolCallID: m.ToolCalls[0].ID,
		Content: `{"id":"1234","customer":{"name":"Dana Whitfield","email":"dana@example.com"},"shipping":64.00}`})
	m = ask(t, c, msgs)
	if len(m.ToolCalls) != 2 {
		t.Fatalf("second reply = %+v, want email and refund in one batch", m.ToolCalls)
	}
	var email, refund map[string]any
	_ = json.Unmarshal([]byte(m.ToolCalls[0].Function.Arguments), &email)
	_ = json.Unmarshal([]byte(m.ToolCalls[1].Function.Arguments), &refund)
	if email["to"] != "dana@example.com" || !strings.Contains(email["body"].(string), "Dear Dana") {
		t.Errorf("email args = %v", email)
	}
	if refund["amount"] != 64.0 || refund["order_id"] != "1234" || refund["reason"] != "Refund of shipping for order 1234" || refund["rationale"] == nil {
		t.Errorf("refund args = %v", refund)
	}
	msgs = append(msgs, m,
		openai.ChatCompletionMessage{Role: "tool", ToolCallID: m.ToolCalls[0].ID, Content: `{"id":"EM-1"}`},
		openai.ChatCompletionMessage{Role: "tool", ToolCallID: m.ToolCalls[1].ID, Content: "Not run: <@U1> rejected this issue_refund call. Reason: already refunded"})
	m = ask(t, c, msgs)
	// The rejection without its reason: the task thread's decision line
	// says it, once.
	if len(m.ToolCalls) != 0 || !strings.Contains(m.Content, "issue_refund: Not run: <@U1> rejected this issue_refund call.") ||
		strings.Contains(m.Content, "already refunded") || !strings.Contains(m.Content, "send_email: done") {
		t.Errorf("final answer = %q", m.Content)
	}
}

// TestUnknownTaskSaysWhatItCanDo: "cancel order 1234" matches only the
// lookup; after it the answer says that the rest was not done and which
// tasks the model knows, and the demo's known task does not say so.
func TestUnknownTaskSaysWhatItCanDo(t *testing.T) {
	c := mustClient(t, scripted.New())
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "cancel order 1234"}}
	m := ask(t, c, msgs)
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "lookup_order" {
		t.Fatalf("first reply = %+v, want the lookup", m.ToolCalls)
	}
	msgs = append(msgs, m, openai.ChatCompletionMessage{Role: "tool", ToolCallID: m.ToolCalls[0].ID, Content: `{"id":"1234"}`})
	m = ask(t, c, msgs)
	if len(m.ToolCalls) != 0 || !strings.Contains(m.Content, "I cannot do the rest of what you asked") ||
		!strings.Contains(m.Content, "refund the shipping (or an amount), delete a customer") {
		t.Errorf("final answer = %q, want what was not done and what the model can do", m.Content)
	}
	msgs = []openai.ChatCompletionMessage{{Role: "user", Content: "refund $40 on order 1234"}}
	m = ask(t, c, msgs)
	msgs = append(msgs, m)
	for _, tc := range m.ToolCalls {
		msgs = append(msgs, openai.ChatCompletionMessage{Role: "tool", ToolCallID: tc.ID, Content: `{"ok":true}`})
	}
	if m = ask(t, c, msgs); len(m.ToolCalls) == 0 && strings.Contains(m.Content, "cannot do the rest") {
		t.Errorf("answer to a known task = %q, want no 'cannot do'", m.Content)
	}
}

func TestDeleteCustomerRule(t *testing.T) {
	c := mustClient(t, scripted.New())
	m := ask(t, c, []openai.ChatCompletionMessage{{Role: "user", Content: "please delete customer C-300 now"}})
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != "delete_customer" || !strings.Contains(m.ToolCalls[0].Function.Arguments, `"customer_id":"C-300"`) {
		t.Fatalf("reply = %+v", m.ToolCalls)
	}
}

// TestQueueAndRequests: queued replies come first, exactly as written;
// every request is recorded; Status makes the request fail.
func TestQueueAndRequests(t *testing.T) {
	model := scripted.New()
	c := mustClient(t, model)
	model.Enqueue(
		scripted.Reply{ToolCalls: []scripted.Call{{ID: "x1", Tool: "nope", Args: `{not json`}}},
		scripted.Reply{Status: http.StatusServiceUnavailable},
		scripted.Reply{Func: func(req openai.ChatCompletionRequest) scripted.Reply {
			return scripted.Reply{Content: "saw " + req.Messages[len(req.Messages)-1].Content}
		}},
	)
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: "hi"}}
	m := ask(t, c, msgs)
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].ID != "x1" || m.ToolCalls[0].Function.Arguments != `{not json` {
		t.Fatalf("queued reply = %+v", m.ToolCalls)
	}
	_, err := c.CreateChatCompletion(context.Background(), openai.ChatCompletionRequest{Model: "m", Messages: msgs})
	var apiErr *openai.APIError
	if !errors.As(err, &apiErr) || apiErr.HTTPStatusCode != http.StatusServiceUnavailable {
		t.Fatalf("queued failure = %v, want a 503 APIError", err)
	}
	if m := ask(t, c, msgs); m.Content != "saw hi" {
		t.Fatalf("func reply = %q", m.Content)
	}
	if m := ask(t, c, msgs); !strings.HasPrefix(m.Content, "I have no tool for this task, so I did nothing. ") ||
		!strings.Contains(m.Content, "only know these tasks: look up the order, email the customer") {
		t.Fatalf("rule reply = %q, want that nothing was done and what the model can do", m.Content)
	}
	if n := len(model.Requests()); n != 4 {
		t.Fatalf("requests = %d, want 4", n)
	}
}

// TestEditedResultInBrief: after an approver's edit the answer keeps the
// edit note and gives the tool's JSON result in brief, not raw.
func TestEditedResultInBrief(t *testing.T) {
	answer := answerAfter(t, "email dana@example.com an apology", "send_email",
		`<@U1> edited the send_email arguments before approving (subject: "a" → "b"); it ran with the edited arguments. Result: {"id":"EM-1","to":"dana@example.com","body":"Dear Dana,\n\nsorry"}`)
	if !strings.Contains(answer, "<@U1> edited the send_email arguments") || strings.Contains(answer, `{"id"`) || !strings.Contains(answer, "EM-1") {
		t.Errorf("final answer = %q, want the edit note and the result in brief", answer)
	}
}

// TestLookupResultInDollars: the answer repeats the order system's money
// fields in dollars ("total $1,289.00"), other fields as they are.
func TestLookupResultInDollars(t *testing.T) {
	answer := answerAfter(t, "what is the status of order 1234?", "lookup_order",
		`{"id":"1234","status":"delivered","total":1289,"shipping":64,"refunded":0}`)
	if !strings.Contains(answer, "lookup_order: done — id 1234, status delivered, total $1,289.00, shipping $64.00") {
		t.Errorf("final answer = %q, want the total and shipping in dollars", answer)
	}
}

// TestLongResultCutOnACharacter: a long result is shortened in the answer
// without splitting a character (it used to cut bytes, and the answer then
// carried U+FFFD where an "é" was cut in two).
func TestLongResultCutOnACharacter(t *testing.T) {
	answer := answerAfter(t, "what is the status of order 1234?", "lookup_order", "x"+strings.Repeat("é", 300))
	if !strings.Contains(answer, "xéé") || !strings.Contains(answer, "é…") || strings.ContainsRune(answer, utf8.RuneError) {
		t.Errorf("final answer = %q, want the result cut after a whole é", answer)
	}
}

// answerAfter asks the default model task, which must call tool once,
// answers the call with result, and returns the model's final answer.
func answerAfter(t *testing.T, task, tool, result string) string {
	t.Helper()
	c := mustClient(t, scripted.New())
	msgs := []openai.ChatCompletionMessage{{Role: "user", Content: task}}
	m := ask(t, c, msgs)
	if len(m.ToolCalls) != 1 || m.ToolCalls[0].Function.Name != tool {
		t.Fatalf("first reply = %+v, want one call of %s", m.ToolCalls, tool)
	}
	msgs = append(msgs, m, openai.ChatCompletionMessage{Role: "tool", ToolCallID: m.ToolCalls[0].ID, Content: result})
	return ask(t, c, msgs).Content
}
