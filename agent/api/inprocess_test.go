package api_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval"
)

// TestInProcessAsOverHTTP: a client calling the API in this process
// (client.InProcess: the call handed over as a value, the answer taken as
// one, no JSON) gets what the same client gets over HTTP, for every call
// of the client and its refusals. Before, a cancel's body handed over was
// never read (the handler looked at Content-Length), so a hook that gave
// up was recorded as withdrawn.
func TestInProcessAsOverHTTP(t *testing.T) {
	h := newHarness(t, harnessOptions{})
	over := h.client(fullKey)
	in := client.New("http://countersign.internal", fullKey)
	in.HTTP = client.InProcess(h.server.Handler(), "")
	in.PollWait = over.PollWait

	// what is the same of two answers: the request's shape without its
	// ids and times, or the refusal's status, code and field.
	type outcome struct {
		Status                   client.Status
		Verdict, Reason, Tool    string
		Arguments                string
		Code, Field              string
		HTTPStatus               int
		AutoApproved, HasRequest bool
	}
	of := func(r *client.Request, err error) outcome {
		var o outcome
		if r != nil {
			o = outcome{Status: r.Status, Verdict: r.Verdict, Reason: r.Reason, Tool: r.Tool, Arguments: string(r.Arguments), AutoApproved: r.AutoApproved}
		}
		if e, ok := errors.AsType[*client.Error](err); ok {
			o.Code, o.Field, o.HTTPStatus, o.HasRequest = e.Code, e.Field, e.HTTPStatus, e.Request != nil
		} else if err != nil {
			t.Fatalf("not a refusal: %v", err)
		}
		return o
	}
	steps := []struct {
		name string
		do   func(c *client.Client, tag string) (*client.Request, error)
	}{
		{"auto-allowed", func(c *client.Client, tag string) (*client.Request, error) {
			return c.Request(h.ctx, client.Call{Tool: "lookup", CallID: tag + "-a", Arguments: json.RawMessage(`{"q":"1"}`)})
		}},
		{"refused by a deny rule", func(c *client.Client, tag string) (*client.Request, error) {
			return c.Request(h.ctx, client.Call{Tool: "refund", CallID: tag + "-d", Arguments: json.RawMessage(`{"amount":5000}`)})
		}},
		{"a field refused", func(c *client.Client, tag string) (*client.Request, error) {
			return c.Request(h.ctx, client.Call{Tool: "refund", CallID: tag + "-f", Arguments: json.RawMessage(`[1]`)})
		}},
		{"a tool the key may not ask for", func(c *client.Client, tag string) (*client.Request, error) {
			return c.Request(h.ctx, client.Call{Tool: "nope", CallID: tag + "-t", Arguments: json.RawMessage(`{}`)})
		}},
		{"an unknown request", func(c *client.Client, tag string) (*client.Request, error) {
			return c.Get(h.ctx, "req_"+tag+"_none", 0)
		}},
		{"pending, then given up", func(c *client.Client, tag string) (*client.Request, error) {
			r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: tag + "-g", Arguments: json.RawMessage(`{"amount":30}`)})
			if err != nil || r.Status != client.Pending {
				return r, fmt.Errorf("not pending: %+v, %w", r, err)
			}
			return c.GiveUp(h.ctx, r.ID)
		}},
		{"pending, then cancelled", func(c *client.Client, tag string) (*client.Request, error) {
			r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: tag + "-c", Arguments: json.RawMessage(`{"amount":31}`)})
			if err != nil {
				return r, err
			}
			return c.Cancel(h.ctx, r.ID)
		}},
		{"approved, claimed, reported, claimed again", func(c *client.Client, tag string) (*client.Request, error) {
			r, err := c.Request(h.ctx, client.Call{Tool: "refund", CallID: tag + "-r", Arguments: json.RawMessage(`{"amount":32}`)})
			if err != nil {
				return r, err
			}
			h.decide(r.ID, approval.VerdictApprove, "U_APPROVER", "")
			cl, err := c.Claim(h.ctx, r.ID)
			if err != nil {
				return nil, err
			}
			if _, err := c.Result(h.ctx, r.ID, cl.Token, client.Executed, "refunded"); err != nil {
				return nil, err
			}
			_, err = c.Claim(h.ctx, r.ID)
			return nil, err
		}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			want := of(s.do(over, "http-"+strings.ReplaceAll(s.name, " ", "-")))
			got := of(s.do(in, "inproc-"+strings.ReplaceAll(s.name, " ", "-")))
			if !reflect.DeepEqual(got, want) {
				t.Errorf("in process: %+v\nover HTTP:  %+v", got, want)
			}
		})
	}
}
