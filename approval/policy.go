package approval

import "time"

// Review says when a tool needs a human.
type Review string

// Review modes. Under ReviewAuto a human is needed when any signal fires.
const (
	ReviewAuto   Review = "auto"
	ReviewAlways Review = "always"
	ReviewNever  Review = "never"
	// ReviewAfter runs the call when a cancel window (CancelWindow) ends,
	// unless an approver cancels it first; a call that fires a signal (its
	// when rule, low confidence...) is reviewed before instead, as under
	// auto.
	ReviewAfter Review = "after"
)

// DefaultSensitiveCapabilities are used when the policy names none.
var DefaultSensitiveCapabilities = []string{"send_email", "spend_money", "delete", "external_write"}

// DefaultMinConfidence is used when the policy sets no min_confidence.
const DefaultMinConfidence = 0.6

// Policy is the parsed, validated policy: global settings and one rule per
// tool. It is plain data; the policy file package builds it from YAML and the
// Gate applies it.
type Policy struct {
	Version               int
	SensitiveCapabilities []string
	MinConfidence         float64
	Tools                 map[string]ToolPolicy
	// External is the rule for tools the policy does not declare, called
	// by outside agents through the HTTP API (the policy file's external
	// key); nil when they are refused. Its Name is ignored.
	External *ToolPolicy
	// PasskeyAdmins are who may vouch for a colleague's passkey
	// enrollment (policy slack.passkey_admins); nil: any member of the
	// approvals channel. Nobody vouches for their own.
	PasskeyAdmins *Approvers
}

// ToolPolicy is the resolved rule for one tool (defaults already applied).
type ToolPolicy struct {
	Name         string
	Risk         Risk
	Capabilities []string
	Review       Review
	// When is a CEL expression over args, tool and requester; true fires a
	// signal. Empty means no rule.
	When string
	// Formats say how arguments read for people, by argument name (money
	// with its unit, dates, …); the exact values are always shown too.
	Formats map[string]ValueFormat
	// PreauthorizeLimits bound each grant Preauthorize offers (uses, a
	// total of one numeric argument).
	PreauthorizeLimits GrantLimits
	// Confirm puts Slack's "are you sure?" dialog on the card's Approve
	// buttons. The policy file turns it on for high-risk tools unless a
	// tool says otherwise.
	Confirm bool
	// WhenReason says in words why When needs a human ("refund above
	// $50"); shown on the card instead of the rule. Empty: the rule is
	// shown in its plainest form (PlainRule).
	WhenReason string
	// QuorumWhen raises Quorum for the calls a rule matches (highest
	// matching rule wins); a matching rule also needs a human under auto.
	// Assessment.Policy.Quorum holds the effective quorum.
	QuorumWhen []QuorumRule
	// Deny refuses, without asking anyone, the calls a rule matches: an
	// automated reviewer. It applies under every review mode, and again to
	// the arguments about to run (an approver's edit included).
	Deny      []DenyRule
	Decisions []Verdict
	Timeout   time.Duration
	// CancelWindow is how long a call under review: after waits for a
	// cancel before it runs.
	CancelWindow time.Duration
	// Sample is the fraction, in [0,1], of the calls that run without a
	// human which are posted afterwards for review (Sampled).
	Sample    float64
	Quorum    int
	Approvers Approvers
	// Remember, when positive, lets an identical approved call by the same
	// requester skip the human for this long (ask-once).
	Remember time.Duration
	// Preauthorize, when positive, offers approvers "approve and allow for
	// this long": further calls of the tool by the same requester in the
	// same task thread then run without a card (see Grant). At most
	// MaxPreauthorize.
	Preauthorize    time.Duration
	StopOnRejection bool
	RemindAfter     time.Duration
	EscalateAfter   time.Duration
	EscalateTo      Approvers
	// WidenOnEscalation adds EscalateTo to who may approve once escalated.
	WidenOnEscalation bool
	// Secret names argument properties never written to logs or audit.
	Secret []string
	// StepUp, when set, asks each approving vote to be confirmed with a
	// passkey or a single sign-on (approval/stepup.go).
	StepUp *StepUp
}

// Assessment is the gate's verdict on one proposed call.
type Assessment struct {
	Tool       string
	NeedsHuman bool
	// Signals lists every signal that fired, in plain words. Under
	// review: always it holds review_always plus any that fired; under
	// review: never it is empty.
	Signals []Signal
	Policy  ToolPolicy
	// Window, when positive, says the call runs after this cancel window
	// (review: after) rather than waiting for an approval. NeedsHuman is
	// then true as well, so a caller that overlooks Window still asks
	// before running.
	Window time.Duration
	// Denied is set when one of the tool's deny rules refused the call:
	// it must not run and nobody is asked. NeedsHuman is then true as
	// well, so a caller that overlooks Denied still never runs the call
	// unreviewed.
	Denied *Denial
}

// Denial is a deny rule's refusal: the rule and the policy author's reason,
// fit for the model and the task thread.
type Denial struct {
	Rule   string // the deny rule's when expression
	Reason string
}
