package main_test

import (
	"bytes"
	"encoding/json"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"go.yaml.in/yaml/v3"
)

// TestGatewaysDocAgentgateway validates docs/gateways.md's agentgateway
// configurations against agentgateway's published config schema
// (testdata/agentgateway/config.schema.json: schema/config.json of
// github.com/agentgateway/agentgateway at commit 75b4e6c) and checks the
// settings a human wait needs: fail closed, a timeout of minutes, the
// gated methods with both phases and the metadata that carries the claim
// to CheckResponse (extmcp.MetadataKey, extmcp.AuthorizationKey), and the
// whole body for ext_authz.
func TestGatewaysDocAgentgateway(t *testing.T) {
	t.Parallel()
	doc, err := os.ReadFile("../../docs/gateways.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(doc), "\n## agentgateway\n")
	section, _, _ = strings.Cut(section, "\n## ")
	var blocks []string
	for rest := section; ; {
		_, after, found := strings.Cut(rest, "```yaml\n")
		if !found {
			break
		}
		block, tail, _ := strings.Cut(after, "```")
		blocks, rest = append(blocks, block), tail
	}
	if !ok || len(blocks) != 2 {
		t.Fatalf("docs/gateways.md's agentgateway section has %d yaml blocks, want 2 (ExtMcp, ext_authz)", len(blocks))
	}
	raw, err := os.ReadFile("testdata/agentgateway/config.schema.json")
	if err != nil {
		t.Fatal(err)
	}
	schemaDoc, err := jsonschema.UnmarshalJSON(bytes.NewReader(raw))
	if err != nil {
		t.Fatal(err)
	}
	c := jsonschema.NewCompiler()
	if err := c.AddResource("https://agentgateway.dev/schema/config", schemaDoc); err != nil {
		t.Fatal(err)
	}
	schema, err := c.Compile("https://agentgateway.dev/schema/config")
	if err != nil {
		t.Fatalf("agentgateway's schema does not compile: %v", err)
	}
	type policies struct {
		HTTP struct {
			RequestTimeout string `json:"requestTimeout"`
		} `json:"http"`
	}
	var cfgs [2]struct {
		MCP struct {
			Policies struct {
				McpGuardrails struct {
					Processors []struct {
						Kind        string            `json:"kind"`
						Host        string            `json:"host"`
						Methods     map[string]string `json:"methods"`
						FailureMode string            `json:"failureMode"`
						Metadata    map[string]string `json:"metadata"`
						Policies    policies          `json:"policies"`
					} `json:"processors"`
				} `json:"mcpGuardrails"`
				ExtAuthz struct {
					Host               string `json:"host"`
					FailureMode        string `json:"failureMode"`
					IncludeRequestBody struct {
						MaxRequestBytes     int  `json:"maxRequestBytes"`
						AllowPartialMessage bool `json:"allowPartialMessage"`
					} `json:"includeRequestBody"`
					Policies policies `json:"policies"`
				} `json:"extAuthz"`
			} `json:"policies"`
		} `json:"mcp"`
	}
	for i, block := range blocks {
		var v any
		if err := yaml.Unmarshal([]byte(block), &v); err != nil {
			t.Fatalf("agentgateway config %d: %v", i+1, err)
		}
		js, err := json.Marshal(v)
		if err != nil {
			t.Fatal(err)
		}
		inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(js))
		if err != nil {
			t.Fatal(err)
		}
		if err := schema.Validate(inst); err != nil {
			t.Errorf("agentgateway config %d fails agentgateway's schema: %v", i+1, err)
		}
		if err := json.Unmarshal(js, &cfgs[i]); err != nil {
			t.Fatal(err)
		}
	}
	minutes := func(what, d string) {
		if got, err := time.ParseDuration(d); err != nil || got < time.Minute {
			t.Errorf("%s requestTimeout %q: want minutes, for a person to decide", what, d)
		}
	}
	ps := cfgs[0].MCP.Policies.McpGuardrails.Processors
	if len(ps) != 1 {
		t.Fatalf("ExtMcp config has %d processors, want 1", len(ps))
	}
	p := ps[0]
	if p.Kind != "remote" || p.Host == "" || p.FailureMode != "failClosed" {
		t.Errorf("processor %+v: want kind remote, a host, failureMode failClosed", p)
	}
	for _, m := range []string{"tools/call", "resources/read", "prompts/get"} {
		if p.Methods[m] != "full" {
			t.Errorf("processor methods %v: want %s: full (the request and the response hooks)", p.Methods, m)
		}
	}
	if got, want := p.Metadata["countersign"], `default(mcpGuardrails.countersign, "")`; got != want {
		t.Errorf("processor metadata countersign = %q, want %q", got, want)
	}
	if !strings.Contains(p.Metadata["authorization"], `request.headers["authorization"]`) {
		t.Errorf("processor metadata authorization = %q, want the request's authorization header", p.Metadata["authorization"])
	}
	minutes("mcpGuardrails", p.Policies.HTTP.RequestTimeout)
	ea := cfgs[1].MCP.Policies.ExtAuthz
	if ea.Host == "" || ea.FailureMode != "deny" || ea.IncludeRequestBody.AllowPartialMessage || ea.IncludeRequestBody.MaxRequestBytes < 1<<16 {
		t.Errorf("extAuthz %+v: want a host, failureMode deny, the whole body (not partial, far above the 8 KiB default)", ea)
	}
	minutes("extAuthz", ea.Policies.HTTP.RequestTimeout)
}
