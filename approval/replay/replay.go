// Package replay judges the calls recorded in the audit stream again, by
// a candidate policy and by the policy in force, through the same gate
// that judges live calls (approval.Gate: deny rules, review, signals,
// quorum; each policy's CEL compiled once), and compares what each would
// have done with what people actually decided: `countersign policy
// replay`. It also finds approvals that were always the same and drafts
// the narrowest rule that lets them through (Suggest: `countersign
// policy suggest`).
//
// The stream is read one page at a time (auditreport.Scan). A call is
// held from its first entry until it is settled (decided, expired,
// cancelled, refused, or run), then judged and folded into per-tool
// counts; afterwards replay keeps only the request id of a call the
// candidate would run without a person (a later "marked wrong" makes it a
// regression). Memory grows with those ids and the grants seen, never
// with the entries.
//
// What cannot be replayed is counted and named, never guessed: arguments
// redacted or cut in the audit (a rule could read what was removed),
// arguments missing or not a JSON object, a tool either policy does not
// declare, a rule over the requester when the audit does not name one.
package replay

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/auditreport"
	"github.com/countersign/countersign/approval/clip"
)

// ErrEmpty: the audit stream has no entries at all (nothing was recorded,
// or the command reads another stream than the process writes).
var ErrEmpty = errors.New("replay: the audit stream is empty or missing")

// ErrTrimmed: the stream does not hold the whole period asked for, or an
// entry is missing inside it (trimmed by MAXLEN while read, or cut): a
// replay of part of a period would report counts that look complete.
var ErrTrimmed = errors.New("replay: the audit stream is trimmed")

// Policy is one policy as replay judges calls with it: the parsed policy
// (its gate is built once, by NewJudge) and, optionally, the tools'
// argument schemas (policyfile.File implements approval.Schemas).
type Policy struct {
	Policy  approval.Policy
	Schemas approval.Schemas
}

// Judge is one policy ready to judge calls: its gate, compiled once.
type Judge struct {
	gate    *approval.Gate
	schemas approval.Schemas
	// readsRequester holds, per declared tool, whether one of its rules
	// reads the requester: found once here rather than for every call
	// (Gate.Policy copies the tool's policy).
	readsRequester map[string]bool
}

// NewJudge compiles p's gate (every when, quorum_when and deny rule once).
// The error is approval.NewGate's, naming each tool's problem.
func NewJudge(p Policy) (*Judge, error) {
	g, err := approval.NewGate(p.Policy)
	if err != nil {
		return nil, err
	}
	j := &Judge{gate: g, schemas: p.Schemas, readsRequester: map[string]bool{}}
	for _, name := range g.Tools() {
		pol, _ := g.Policy(name)
		j.readsRequester[name] = mentionsRequester(pol)
	}
	return j, nil
}

// Outcome is what a policy does with a call.
type Outcome string

// Outcomes of a judgement.
const (
	// Auto: the call runs without a person.
	Auto Outcome = "auto"
	// Window: review after; the call runs when its cancel window ends
	// unless an approver cancels it (no person needs to act).
	Window Outcome = "window"
	// Asked: a person (Quorum people) decides first.
	Asked Outcome = "asked"
	// Denied: a deny rule (or the tool's schema) refuses it; nobody is
	// asked and it never runs.
	Denied Outcome = "denied"
)

// Unattended reports whether o lets a call run without anyone approving it.
func (o Outcome) Unattended() bool { return o == Auto || o == Window }

// Verdict is one policy's judgement of a call.
type Verdict struct {
	Outcome Outcome `json:"outcome"`
	// Quorum is the approvals asked for (Asked only).
	Quorum int `json:"quorum,omitempty"`
	// Why names the deny rule, or the signals that asked a person.
	Why string `json:"why,omitempty"`
}

// Call is one call as the audit recorded it, the input of a judgement.
type Call struct {
	RequestID  string
	Tool       string
	Args       json.RawMessage
	Confidence *float64
	// Requester is who asked ("" when the audit does not say).
	Requester string
	// Outside: an outside caller (the HTTP API, MCP, a hook) rather than
	// Countersign's own model, judged as Gate.AssessExternal judges it.
	Outside bool
}

// Unreplayable reasons, stable for machines.
const (
	WhyArgsMissing      = "args_missing"
	WhyArgsNotObject    = "args_not_object"
	WhyArgsRedacted     = "args_redacted"
	WhyArgsCut          = "args_cut"
	WhyUnknownCurrent   = "tool_unknown_to_current"
	WhyUnknownCandidate = "tool_unknown_to_candidate"
	WhyRequesterUnknown = "requester_unknown"
)

// Judge judges c. ok false means c cannot be replayed under this policy
// (why is one of the Why codes): never a guess.
func (j *Judge) Judge(c Call) (v Verdict, why string, ok bool) {
	reads, declared := j.readsRequester[c.Tool]
	if !declared {
		return Verdict{}, WhyUnknownCandidate, false
	}
	if c.Requester == "" && reads {
		return Verdict{}, WhyRequesterUnknown, false
	}
	if j.schemas != nil {
		if err := j.schemas.ValidateCall(c.Tool, nil, c.Args); err != nil {
			return Verdict{Outcome: Denied, Why: "arguments invalid: " + err.Error()}, "", true
		}
	}
	call := approval.ToolCall{Tool: c.Tool, Args: c.Args, Confidence: c.Confidence}
	var as approval.Assessment
	var err error
	if c.Outside {
		as, err = j.gate.AssessExternal(call, c.Requester)
	} else {
		as, err = j.gate.Assess(call, c.Requester)
	}
	switch {
	case errors.Is(err, approval.ErrUnknownTool):
		return Verdict{}, WhyUnknownCandidate, false
	case err != nil:
		return Verdict{}, WhyArgsNotObject, false
	case as.Denied != nil:
		return Verdict{Outcome: Denied, Why: "deny rule " + as.Denied.Rule}, "", true
	case as.Window > 0:
		return Verdict{Outcome: Window}, "", true
	case as.NeedsHuman:
		codes := make([]string, 0, len(as.Signals))
		for _, s := range as.Signals {
			if !slices.Contains(codes, s.Code) {
				codes = append(codes, s.Code)
			}
		}
		return Verdict{Outcome: Asked, Quorum: max(as.Policy.Quorum, 1), Why: strings.Join(codes, ",")}, "", true
	}
	return Verdict{Outcome: Auto}, "", true
}

// mentionsRequester reports whether one of pol's rules reads the
// requester (then a call whose requester is unknown cannot be judged).
func mentionsRequester(pol approval.ToolPolicy) bool {
	rules := []string{pol.When}
	for _, q := range pol.QuorumWhen {
		rules = append(rules, q.When)
	}
	for _, d := range pol.Deny {
		rules = append(rules, d.When)
	}
	return slices.ContainsFunc(rules, func(r string) bool { return strings.Contains(r, "requester") })
}

// checkArgs says why args cannot be replayed, "" when they can.
func checkArgs(args json.RawMessage) string {
	t := bytes.TrimSpace(args)
	switch {
	case len(t) == 0 || bytes.Equal(t, []byte("null")):
		return WhyArgsMissing
	case t[0] != '{':
		return WhyArgsNotObject
	case bytes.Contains(t, []byte(approval.Redacted)):
		return WhyArgsRedacted
	case bytes.Contains(t, []byte(clip.Marker)) && hasCut(t):
		return WhyArgsCut
	}
	return ""
}

// hasCut reports whether a string of args (a value or a key, at any
// depth) is as long as the audit keeps one and ends with the cut marker:
// approval.BoundData cut it, so it is not what was judged.
func hasCut(args json.RawMessage) bool {
	var v any
	if json.Unmarshal(args, &v) != nil {
		return false
	}
	cut := func(s string) bool {
		return len(s) > approval.MaxDataField-utf8.UTFMax-len(clip.Marker) && strings.HasSuffix(s, clip.Marker)
	}
	var walk func(any) bool
	walk = func(v any) bool {
		switch x := v.(type) {
		case string:
			return cut(x)
		case []any:
			return slices.ContainsFunc(x, walk)
		case map[string]any:
			for k, e := range x {
				if cut(k) || walk(e) {
					return true
				}
			}
		}
		return false
	}
	return walk(v)
}

// Options say what to replay.
type Options struct {
	// Current is the policy in force, Candidate the one proposed.
	Current, Candidate Policy
	// Since and Until bound the calls replayed by the time of their first
	// entry; zero Since is the whole stream, zero Until no end.
	Since, Until time.Time
	// Tool keeps one tool's calls; "" keeps all.
	Tool string
}

// Counts are what one policy does with a tool's calls.
type Counts struct {
	Auto   int `json:"auto"`
	Window int `json:"window,omitempty"`
	Asked  int `json:"asked"`
	Denied int `json:"denied"`
	// Approvals is the approvals asked for (the quorum of each asked call).
	Approvals int `json:"approvals"`
}

func (c *Counts) add(v Verdict) {
	switch v.Outcome {
	case Auto:
		c.Auto++
	case Window:
		c.Window++
	case Asked:
		c.Asked++
		c.Approvals += v.Quorum
	case Denied:
		c.Denied++
	}
}

// ToolRow is one tool's replay.
type ToolRow struct {
	Tool string `json:"tool"`
	// Calls is every call of the tool in the period; Replayed those
	// judged (the rest are in Report.Unreplayable).
	Calls     int    `json:"calls"`
	Replayed  int    `json:"replayed"`
	Now       Counts `json:"now"`
	Candidate Counts `json:"candidate"`
	// MinutesSaved and MinutesAdded are people-minutes: a call asked now
	// and not under the candidate saves the time its decision took (as
	// recorded; the tool's mean time per approval when it was not
	// decided), an approval the candidate adds costs the tool's mean.
	MinutesSaved float64 `json:"people_minutes_saved"`
	MinutesAdded float64 `json:"people_minutes_added"`
	// MeanDecisionSec is the tool's mean time per approval, from every
	// decision in the period; every tool's when nobody decided one of
	// this tool's calls (0 when nobody decided anything).
	MeanDecisionSec float64 `json:"mean_decision_seconds"`
	// GrantsRunOut counts the pre-authorisations whose uses or budget,
	// under the candidate's limits, would have run out before their last
	// use; GrantCallsAsked the calls they let through that would then
	// have gone to a person.
	GrantsRunOut    int `json:"grants_run_out,omitempty"`
	GrantCallsAsked int `json:"grant_calls_asked,omitempty"`
	Regressions     int `json:"regressions"`

	savedMS        int64 // recorded decision time of calls no longer asked
	savedEstimated int   // approvals no longer asked, without a recorded time
	addedApprovals int
	voteMS         int64
	votes          int
}

// Regression is a call a person did not let through as proposed —
// rejected, cancelled, answered instead, edited, or marked wrong — that
// the candidate would run without a person.
type Regression struct {
	RequestID string    `json:"request_id"`
	Tool      string    `json:"tool"`
	Time      time.Time `json:"time"`
	// Person is what people did: rejected, cancelled, responded, edited,
	// marked_wrong (several joined by "+").
	Person    string  `json:"person"`
	By        string  `json:"by,omitempty"`
	Now       Verdict `json:"now"`
	Candidate Verdict `json:"candidate"`
}

// Unreplayed is a call replay could not judge, and why.
type Unreplayed struct {
	RequestID string    `json:"request_id"`
	Tool      string    `json:"tool"`
	Time      time.Time `json:"time"`
	Why       string    `json:"why"`
}

// Report is a replay's result.
type Report struct {
	Since   time.Time `json:"since,omitzero"`
	Until   time.Time `json:"until,omitzero"`
	Entries int       `json:"entries"`
	Calls   int       `json:"calls"`
	Tools   []ToolRow `json:"tools"`
	// Regressions are listed in stream order.
	Regressions  []Regression `json:"regressions"`
	Unreplayable []Unreplayed `json:"unreplayable"`
}

// Run replays the calls of r's stream in opts' period. It returns ErrEmpty
// for a stream with no entries and ErrTrimmed (wrapped, saying where) when
// the stream starts after Since or misses an entry inside the period; any
// other error is r's.
func Run(ctx context.Context, r auditreport.Ranger, opts Options) (*Report, error) {
	cur, err := NewJudge(opts.Current)
	if err != nil {
		return nil, fmt.Errorf("the policy in force: %w", err)
	}
	cand, err := NewJudge(opts.Candidate)
	if err != nil {
		return nil, fmt.Errorf("the candidate policy: %w", err)
	}
	rp := New(cur, cand, opts)
	if err := Stream(ctx, r, opts.Since, rp.Add); err != nil {
		return nil, err
	}
	return rp.Report(), nil
}

// Stream calls fn for every entry of r's stream stamped at or after since
// (the whole stream for zero since), oldest first, a page at a time. It
// checks that the stream holds the whole period: ErrEmpty for no entries
// at all, ErrTrimmed when the stream's first entry is a trimmed chain's
// (seq above 1) stamped after since, or when a sequence number is skipped.
func Stream(ctx context.Context, r auditreport.Ranger, since time.Time, fn func(approval.Entry) error) error {
	if err := whole(ctx, r, since); err != nil {
		return err
	}
	after := ""
	if !since.IsZero() {
		after = auditreport.StreamIDBefore(since.Add(-auditreport.SinceSkew))
	}
	var prev int64
	return auditreport.Scan(ctx, r, after, func(e approval.Entry) error {
		if prev != 0 && e.Seq != prev+1 {
			return fmt.Errorf("%w: entry seq %d follows seq %d (entries missing: trimmed while read, or cut)", ErrTrimmed, e.Seq, prev)
		}
		prev = e.Seq
		if !since.IsZero() && e.Time.Before(since) {
			return nil
		}
		return fn(e)
	})
}

// whole checks that r's stream begins at or before since: ErrEmpty for
// no entries, ErrTrimmed when its first entry follows trimmed ones and is
// stamped after since.
func whole(ctx context.Context, r auditreport.Ranger, since time.Time) error {
	first, err := r.Range(ctx, "", 1)
	if err != nil {
		return err
	}
	if len(first) == 0 {
		return ErrEmpty
	}
	if f := first[0]; f.Seq > 1 && (since.IsZero() || f.Time.After(since)) {
		return fmt.Errorf("%w: its first entry (seq %d, %s) follows entries trimmed away, so the period asked for (since %s) is not whole; replay a shorter period",
			ErrTrimmed, f.Seq, f.Time.UTC().Format(time.RFC3339), sinceText(since))
	}
	return nil
}

func sinceText(t time.Time) string {
	if t.IsZero() {
		return "the beginning"
	}
	return t.UTC().Format(time.RFC3339)
}

// Replayer folds entries into a replay, one at a time (Add), in stream
// order.
type Replayer struct {
	cur, cand *Judge
	opts      Options
	open      map[string]*call    // request id → a call not yet settled
	unatt     map[string]*settled // request id → a settled call the candidate runs unattended, not a regression yet
	runs      map[string]string   // run id → requester (run_started's actor)
	grants    map[string]*grantUse
	tools     map[string]*ToolRow
	rep       Report
}

// call is what the audit said of one call so far.
type call struct {
	Call
	first      time.Time
	proposed   bool // Countersign's model proposed it
	question   bool // a question, not a call
	votes      int
	voteMS     int64
	person     []string // what people did: rejected, edited, …
	by         string
	grantUse   *grantUse
	grantSpend float64
}

// settled is what replay keeps of a settled call the candidate would run
// unattended: enough to list it should it be marked wrong later.
type settled struct {
	tool      string
	at        time.Time
	now, cand Verdict
}

// grantUse is a pre-authorisation's uses so far, under the candidate's
// limits.
type grantUse struct {
	uses   int
	spent  float64
	runOut bool
}

// New returns a Replayer judging with cur (the policy in force) and cand.
func New(cur, cand *Judge, opts Options) *Replayer {
	return &Replayer{cur: cur, cand: cand, opts: opts, open: map[string]*call{}, unatt: map[string]*settled{},
		runs: map[string]string{}, grants: map[string]*grantUse{}, tools: map[string]*ToolRow{},
		rep: Report{Since: opts.Since, Until: opts.Until}}
}

func (rp *Replayer) row(tool string) *ToolRow {
	r, ok := rp.tools[tool]
	if !ok {
		r = &ToolRow{Tool: tool}
		rp.tools[tool] = r
	}
	return r
}

// Add folds in one entry. It never fails; the error is for Stream.
func (rp *Replayer) Add(e approval.Entry) error {
	rp.rep.Entries++
	switch e.Event {
	case approval.EventRunStarted:
		rp.runs[e.RunID] = e.Actor
		return nil
	case approval.EventRunFinished:
		delete(rp.runs, e.RunID)
		return nil
	}
	if e.RequestID == "" || (rp.opts.Tool != "" && e.Tool != rp.opts.Tool) {
		return nil
	}
	if e.Event == approval.EventMarkedWrong {
		rp.markedWrong(e)
		return nil
	}
	c, ok := rp.open[e.RequestID]
	if !ok {
		switch e.Event {
		case approval.EventProposed, approval.EventAssessed, approval.EventRequested:
		default:
			return nil // a call settled already, or begun before the period
		}
		if !rp.opts.Until.IsZero() && !e.Time.Before(rp.opts.Until) {
			return nil
		}
		c = &call{Call: Call{RequestID: e.RequestID, Tool: e.Tool, Outside: true}, first: e.Time}
		if req, ok := rp.runs[e.RunID]; ok {
			c.Requester = req
		}
		rp.open[e.RequestID] = c
	}
	settle := false
	switch e.Event {
	case approval.EventAssessed, approval.EventCardPosted, approval.EventReminded, approval.EventEscalated,
		approval.EventDecisionRefuse, approval.EventScheduled, approval.EventReopened, approval.EventGranted,
		approval.EventWebhookSent, approval.EventWebhookFailed, approval.EventSampled, approval.EventSampleReviewed:
		return nil // nothing in them changes the call or what people did
	case approval.EventExecuted, approval.EventOutcomeUnknown, approval.EventExpired, approval.EventAbandoned,
		approval.EventLost, approval.EventWindowElapsed:
		delete(rp.open, e.RequestID)
		rp.settle(c)
		return nil
	case approval.EventAutoApproved, approval.EventRemembered:
		// Let through; an outside caller's arguments come with executing.
		if len(c.Args) > 0 {
			delete(rp.open, e.RequestID)
			rp.settle(c)
		}
		return nil
	}
	// A request or a decision (most of the stream) is read from its Brief:
	// a third of the work of its whole typed struct.
	var data any
	if b, ok := approval.DecodeBrief(e); ok {
		data = b
	} else {
		data = approval.DecodeEvent(e)
	}
	switch d := data.(type) {
	case *approval.ProposedEvent:
		c.proposed, c.Outside = true, false
		c.Args, c.Confidence = d.Args, d.Confidence
	case approval.Brief:
		if e.Event == approval.EventRequested {
			rp.requested(e, c, d)
		} else {
			settle = rp.decided(e, c, d)
		}
	case *approval.WindowDecisionEvent: // run now, or an approver's cancel
		c.votes++
		c.voteMS += max(d.DecisionMS, 0)
		c.by = e.Actor
		if d.Verdict == approval.VerdictCancel {
			c.person = append(c.person, "cancelled")
		}
		settle = true
	case *approval.PreauthorizedEvent:
		c.grantUse = rp.grants[d.GrantID]
		if c.grantUse == nil {
			c.grantUse = &grantUse{}
			rp.grants[d.GrantID] = c.grantUse
		}
		c.grantSpend = d.Amount
		settle = len(c.Args) > 0 // else its arguments come with executing
	case *approval.ExecutingEvent:
		if len(c.Args) == 0 {
			c.Args = d.Args
		}
		settle = true
	case *approval.CallErrorEvent:
		if len(c.Args) == 0 {
			c.Args = d.Args
		}
		settle = true
	case *approval.ReasonEvent, *approval.ExecutedEvent: // cancelled by the system; failed
		settle = true
	}
	if settle {
		delete(rp.open, e.RequestID)
		rp.settle(c)
	}
	return nil
}

// requested folds in a request's Brief d.
func (rp *Replayer) requested(e approval.Entry, c *call, d approval.Brief) {
	c.question = d.Kind == approval.KindContact
	if len(c.Args) == 0 {
		c.Args = d.Args
	}
	c.Confidence = cmpPtr(c.Confidence, d.Confidence)
	c.Requester = cmpStr(d.Requester, c.Requester)
	// The agent's own requests are created by "agent"; an outside
	// caller's by "api:<key>", "mcp:<key>", …
	c.Outside = e.Actor != "agent" && !c.proposed
}

// decided folds in a decision's or a vote's Brief d, and says whether it
// settles the call.
func (rp *Replayer) decided(e approval.Entry, c *call, d approval.Brief) bool {
	v := d.Verdict
	if e.Event == approval.EventApprovalVote && v == "" {
		v = approval.VerdictApprove
	}
	if v != approval.VerdictExpire && e.Actor != "" && e.Actor != "system" {
		c.votes++
		c.voteMS += max(d.DecisionMS, 0)
		c.by = e.Actor
	}
	if e.Event != approval.EventDecided {
		return false
	}
	switch v {
	case approval.VerdictReject:
		c.person = append(c.person, "rejected")
	case approval.VerdictEdit:
		c.person = append(c.person, "edited")
	case approval.VerdictRespond:
		c.person = append(c.person, "responded")
	}
	// An approval settles the call when it runs (executing), is refused
	// at its claim, or is abandoned: until then the policy in force may
	// reopen it for more approvals, and a person may still reject it.
	return v != approval.VerdictApprove && v != approval.VerdictEdit
}

func cmpStr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

func cmpPtr(a, b *float64) *float64 {
	if a != nil {
		return a
	}
	return b
}

// markedWrong folds in a mark as wrong: on an open call it is noted; on a
// settled call the candidate runs unattended it is a regression now.
func (rp *Replayer) markedWrong(e approval.Entry) {
	if c, ok := rp.open[e.RequestID]; ok {
		c.person = append(c.person, "marked_wrong")
		return
	}
	s, ok := rp.unatt[e.RequestID]
	if !ok {
		return
	}
	delete(rp.unatt, e.RequestID)
	rp.regress(Regression{RequestID: e.RequestID, Tool: s.tool, Time: s.at, Person: "marked_wrong", By: e.Actor, Now: s.now, Candidate: s.cand})
}

func (rp *Replayer) regress(r Regression) {
	rp.rep.Regressions = append(rp.rep.Regressions, r)
	rp.row(r.Tool).Regressions++
}

// settle judges c by both policies and folds it in.
func (rp *Replayer) settle(c *call) {
	if c.question {
		return // a question runs nothing: no policy lets it through
	}
	rp.rep.Calls++
	row := rp.row(c.Tool)
	row.Calls++
	row.votes += c.votes
	row.voteMS += c.voteMS
	skip := func(why string) {
		rp.rep.Unreplayable = append(rp.rep.Unreplayable, Unreplayed{RequestID: c.RequestID, Tool: c.Tool, Time: c.first, Why: why})
	}
	if why := checkArgs(c.Args); why != "" {
		skip(why)
		return
	}
	now, why, ok := rp.cur.Judge(c.Call)
	if !ok {
		if why == WhyUnknownCandidate {
			why = WhyUnknownCurrent
		}
		skip(why)
		return
	}
	cand, why, ok := rp.cand.Judge(c.Call)
	if !ok {
		skip(why)
		return
	}
	row.Replayed++
	row.Now.add(now)
	row.Candidate.add(cand)
	switch {
	case now.Outcome == Asked && cand.Outcome != Asked:
		if c.votes > 0 {
			row.savedMS += c.voteMS
		} else {
			row.savedEstimated += now.Quorum
		}
	case now.Outcome != Asked && cand.Outcome == Asked:
		row.addedApprovals += cand.Quorum
	case now.Outcome == Asked && cand.Quorum > now.Quorum:
		row.addedApprovals += cand.Quorum - now.Quorum
	case now.Outcome == Asked && cand.Quorum < now.Quorum:
		row.savedEstimated += now.Quorum - cand.Quorum
	}
	if c.grantUse != nil {
		rp.useGrant(c, row)
	}
	if !cand.Outcome.Unattended() {
		return
	}
	if len(c.person) > 0 {
		rp.regress(Regression{RequestID: c.RequestID, Tool: c.Tool, Time: c.first, Person: strings.Join(c.person, "+"), By: c.by, Now: now, Candidate: cand})
		return
	}
	rp.unatt[c.RequestID] = &settled{tool: c.Tool, at: c.first, now: now, cand: cand}
}

// useGrant counts one use of a pre-authorisation under the candidate's
// limits for the tool: a use past its uses or its budget (or any use when
// the candidate offers none) would have gone to a person.
func (rp *Replayer) useGrant(c *call, row *ToolRow) {
	g := c.grantUse
	pol, _ := rp.cand.gate.Policy(c.Tool)
	lim := pol.PreauthorizeLimits
	amount := c.grantSpend
	if lim.Budgeted() {
		if n, ok := numberArg(c.Args, lim.Argument); ok {
			amount = n
		}
	}
	over := pol.Preauthorize <= 0 ||
		lim.MaxUses > 0 && g.uses+1 > lim.MaxUses ||
		lim.Budgeted() && g.spent+amount > lim.MaxTotal
	if over {
		row.GrantCallsAsked++
		if !g.runOut {
			g.runOut = true
			row.GrantsRunOut++
		}
		return
	}
	g.uses++
	g.spent += amount
}

// numberArg reads the numeric argument name of args.
func numberArg(args json.RawMessage, name string) (float64, bool) {
	var all map[string]json.RawMessage
	if json.Unmarshal(args, &all) != nil {
		return 0, false
	}
	var f float64
	if json.Unmarshal(all[name], &f) != nil {
		return 0, false
	}
	return f, true
}

// Report settles the calls still open (pending when the stream ends) and
// returns the replay.
func (rp *Replayer) Report() *Report {
	for _, id := range slices.Sorted(maps.Keys(rp.open)) {
		rp.settle(rp.open[id])
	}
	clear(rp.open)
	rep := rp.rep
	rep.Tools = rep.Tools[:0]
	var allMS int64
	var all int
	for _, r := range rp.tools {
		allMS, all = allMS+r.voteMS, all+r.votes
	}
	for _, name := range slices.Sorted(maps.Keys(rp.tools)) {
		r := *rp.tools[name]
		switch {
		case r.votes > 0:
			r.MeanDecisionSec = float64(r.voteMS) / float64(r.votes) / 1000
		case all > 0:
			r.MeanDecisionSec = float64(allMS) / float64(all) / 1000
		}
		r.MinutesSaved = (float64(r.savedMS)/1000 + float64(r.savedEstimated)*r.MeanDecisionSec) / 60
		r.MinutesAdded = float64(r.addedApprovals) * r.MeanDecisionSec / 60
		rep.Tools = append(rep.Tools, r)
	}
	if rep.Regressions == nil {
		rep.Regressions = []Regression{}
	}
	if rep.Unreplayable == nil {
		rep.Unreplayable = []Unreplayed{}
	}
	return &rep
}
