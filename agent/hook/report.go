package hook

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"github.com/countersign/countersign/agent/api/client"
	"github.com/countersign/countersign/approval/clip"
)

// maxOutput is the API's limit on a result's output (bytes).
const maxOutput = 4000

// Report is the PostToolUse (and PostToolUseFailure) mode: the call this
// hook claimed ran, so it reports executed (or failed) with the tool's
// response, using the claim's token kept by the PreToolUse run. A call
// it did not claim (auto-approved, or denied) has nothing to report. It
// returns what went wrong, "" when nothing did; Claude Code's call has
// already run, so a failure here changes nothing for it.
func Report(ctx context.Context, in Input, o Options) string {
	if o.Claims == nil || o.API == nil || in.ToolUseID == "" {
		return ""
	}
	id, token, ok, err := o.Claims.Take(in.ToolUseID)
	if err != nil {
		return fmt.Sprintf("read the claim of %s: %v", in.ToolUseID, err)
	}
	if !ok {
		return ""
	}
	status, output := client.Executed, string(in.ToolResponse)
	if in.HookEventName == "PostToolUseFailure" {
		status, output = client.Failed, in.Error
	}
	if o.Timeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, o.Timeout)
		defer cancel()
	}
	if _, err := o.API.Result(ctx, id, token, status, clip.Bytes(output, maxOutput)); err != nil {
		return fmt.Sprintf("report the result of request %s: %v", id, err)
	}
	return ""
}

// Dir keeps claims as one small file per tool use in a directory (mode
// 0700, files 0600): the PreToolUse and PostToolUse runs of the hook are
// separate processes. The file's name is a hash of the tool_use_id.
type Dir string

var _ Claims = Dir("")

func (d Dir) path(toolUseID string) string {
	h := sha256.Sum256([]byte(toolUseID))
	return filepath.Join(string(d), hex.EncodeToString(h[:16])+".json")
}

type kept struct {
	RequestID string `json:"request_id"`
	Token     string `json:"claim_token"`
}

// Put keeps request id and token for the tool use.
func (d Dir) Put(toolUseID, requestID, token string) error {
	if err := os.MkdirAll(string(d), 0o700); err != nil {
		return err
	}
	b, err := json.Marshal(kept{RequestID: requestID, Token: token})
	if err != nil {
		return err
	}
	return os.WriteFile(d.path(toolUseID), b, 0o600)
}

// Take returns and removes what Put kept; ok is false when nothing is.
func (d Dir) Take(toolUseID string) (requestID, token string, ok bool, err error) {
	p := d.path(toolUseID)
	b, err := os.ReadFile(p)
	if errors.Is(err, fs.ErrNotExist) {
		return "", "", false, nil
	}
	if err != nil {
		return "", "", false, err
	}
	if err := os.Remove(p); err != nil {
		return "", "", false, err
	}
	var k kept
	if err := json.Unmarshal(b, &k); err != nil || !strings.HasPrefix(k.Token, "cst_") {
		return "", "", false, fmt.Errorf("claim file %s: not a claim", p)
	}
	return k.RequestID, k.Token, true, nil
}

// StateDir is where the hook keeps claims: $XDG_STATE_HOME/countersign/
// claude-code, else ~/.local/state/countersign/claude-code.
func StateDir(getenv func(string) string) string {
	base := getenv("XDG_STATE_HOME")
	if base == "" {
		home := getenv("HOME")
		if home == "" {
			return ""
		}
		base = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(base, "countersign", "claude-code")
}
