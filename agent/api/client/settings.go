package client

import (
	"errors"
	"fmt"
	"strings"
)

// CheckServer checks the two settings every caller outside the server
// reads from its environment (`countersign mcp`, `countersign hook`):
// COUNTERSIGN_URL (also --url), the server's http(s) URL, and
// COUNTERSIGN_API_KEY. Each wrong one is one error naming its variable.
func CheckServer(serverURL, apiKey string) []error {
	var errs []error
	if !strings.HasPrefix(serverURL, "http://") && !strings.HasPrefix(serverURL, "https://") {
		errs = append(errs, fmt.Errorf("COUNTERSIGN_URL (--url): must be the server's http(s) URL, got %q", serverURL))
	}
	if apiKey == "" {
		errs = append(errs, errors.New("COUNTERSIGN_API_KEY: required (the API key the calls are made with; docs/api.md, Keys)"))
	}
	return errs
}
