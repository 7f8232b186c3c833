package agent

import (
	"context"
	"encoding/json"

	"github.com/countersign/countersign/approval"
)

// Previews is the system-of-record preview of calls to the agent's own
// tools that arrive through the HTTP API (api.Options.Preview): a tool of
// tools whose name previewed reports answers with its facts, a failure
// said in Preview.Error as on the agent's own cards; any other tool has no
// preview (false).
func Previews(tools []Tool, previewed func(name string) bool) func(ctx context.Context, tool string, args json.RawMessage) (approval.Preview, bool) {
	byName := map[string]Tool{}
	for _, t := range tools {
		if previewed(t.Name()) {
			byName[t.Name()] = t
		}
	}
	return func(ctx context.Context, tool string, args json.RawMessage) (approval.Preview, bool) {
		t, ok := byName[tool]
		if !ok {
			return approval.Preview{}, false
		}
		return previewOf(ctx, t, args), true
	}
}

// previewOf asks t for its facts; a failure is said plainly on the card,
// which still goes out.
func previewOf(ctx context.Context, t Tool, args json.RawMessage) approval.Preview {
	p, err := t.Preview(ctx, args)
	if err != nil {
		p.Error = "preview unavailable: " + err.Error()
	}
	return p
}
