package approval

import (
	"encoding/json"
	"errors"
	"fmt"
)

// errNoGate is returned by Judge when the lifecycle was built without a
// gate: nothing can be judged, so nothing may run.
var errNoGate = errors.New("approval: the lifecycle has no gate (LifecycleOptions.Gate)")

// Judge runs the checks every call takes, whether a caller proposed it or
// an approver edited it: its arguments are one JSON object that matches
// the tool's schema (the policy's; for a tool the policy does not declare,
// inputSchema when its caller supplied one), then the gate decides (deny
// rules first, then review, signals and quorum). external selects the
// policy's external rule for an undeclared tool (Gate.AssessExternal);
// otherwise an undeclared tool is unknown.
//
// Errors wrap ErrUnknownTool or ErrInvalidArgs (the message says what is
// wrong, in plain words); a deny rule is not an error but
// Assessment.Denied.
func (l *Lifecycle) Judge(call ToolCall, inputSchema json.RawMessage, requester string, external bool) (Assessment, error) {
	if l.gate == nil {
		return Assessment{}, errNoGate
	}
	if !isObject(call.Args) { // decodeArgs only to say what is wrong
		if _, err := decodeArgs(call.Args); err != nil {
			return Assessment{}, fmt.Errorf("judge %s: %w", call.Tool, err)
		}
	}
	if l.schemas != nil {
		if err := l.schemas.ValidateCall(call.Tool, inputSchema, call.Args); err != nil {
			return Assessment{}, err
		}
	}
	if external {
		return l.gate.AssessExternal(call, requester)
	}
	return l.gate.Assess(call, requester)
}
