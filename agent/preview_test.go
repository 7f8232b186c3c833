package agent_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/approval"
)

// previewTool is a tool whose Preview answers from fields; nothing else of
// it is called.
type previewTool struct {
	agent.Tool
	name string
	p    approval.Preview
	err  error
}

func (t previewTool) Name() string { return t.name }

func (t previewTool) Preview(context.Context, json.RawMessage) (approval.Preview, error) {
	return t.p, t.err
}

// TestPreviews: the API's preview answers for the tools previewed names,
// says a failure in Preview.Error, and has none for any other tool.
func TestPreviews(t *testing.T) {
	facts := approval.Preview{Facts: []approval.Fact{{Label: "Order", Value: "1234"}}}
	preview := agent.Previews([]agent.Tool{
		previewTool{name: "lookup", p: facts},
		previewTool{name: "broken", err: errors.New("sor down")},
		previewTool{name: "quiet", p: facts},
	}, func(name string) bool { return name != "quiet" })
	for _, tt := range []struct {
		tool      string
		wantOK    bool
		wantError string
		wantFacts int
	}{
		{"lookup", true, "", 1},
		{"broken", true, "preview unavailable: sor down", 0},
		{"quiet", false, "", 0},
		{"external_tool", false, "", 0},
	} {
		p, ok := preview(context.Background(), tt.tool, json.RawMessage(`{}`))
		if ok != tt.wantOK || p.Error != tt.wantError || len(p.Facts) != tt.wantFacts {
			t.Errorf("preview(%q) = %+v, %v, want %d facts, error %q, %v", tt.tool, p, ok, tt.wantFacts, tt.wantError, tt.wantOK)
		}
	}
}
