package bot

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
)

// Modal callback ids and their input blocks.
const (
	callbackReject  = "cs_reject"
	callbackRespond = "cs_respond"
	callbackEdit    = "cs_edit"

	blockReason   = "reason"
	blockResponse = "response"

	// precheckBudget bounds the approver check before opening a modal: the
	// trigger_id dies after 3 s, and the check is repeated on submit.
	precheckBudget = time.Second
)

// interaction holds the fields of an interactive payload the bot reads
// (block_actions, view_submission, view_closed).
type interaction struct {
	Type      string `json:"type"`
	TriggerID string `json:"trigger_id"`
	User      struct {
		ID string `json:"id"`
	} `json:"user"`
	Channel struct {
		ID string `json:"id"`
	} `json:"channel"`
	Container struct {
		ChannelID string `json:"channel_id"`
		MessageTS string `json:"message_ts"`
	} `json:"container"`
	Message struct {
		TS string `json:"ts"`
	} `json:"message"`
	Actions []struct {
		ActionID string `json:"action_id"`
		BlockID  string `json:"block_id"`
		Value    string `json:"value"`
	} `json:"actions"`
	View struct {
		ID              string `json:"id"`
		CallbackID      string `json:"callback_id"`
		PrivateMetadata string `json:"private_metadata"`
		State           struct {
			Values map[string]map[string]inputValue `json:"values"`
		} `json:"state"`
	} `json:"view"`
}

// onInteraction answers an interactive payload. Button clicks are queued;
// view submissions are validated here, before answering, so field errors
// show in the modal, and the decision itself is queued.
func (b *Bot) onInteraction(ctx context.Context, payload []byte) (any, error) {
	var ic interaction
	if err := json.Unmarshal(payload, &ic); err != nil {
		return nil, errBadPayload
	}
	switch ic.Type {
	case "block_actions":
		if len(ic.Actions) == 0 {
			return nil, nil
		}
		return nil, b.submit(ctx, func(ctx context.Context) { b.handleClick(ctx, ic) })
	case "view_submission":
		return b.onViewSubmission(ctx, ic)
	}
	return nil, nil
}

// verdictOf maps a button to the decision it starts.
func verdictOf(actionID string) (approval.Verdict, bool) {
	switch actionID {
	case actionApprove, actionApproveAllow:
		return approval.VerdictApprove, true
	case actionEdit:
		return approval.VerdictEdit, true
	case actionRespond:
		return approval.VerdictRespond, true
	case actionReject:
		return approval.VerdictReject, true
	}
	return "", false
}

// handleClick runs in the worker pool: Approve decides at once; Reject,
// Edit and Respond open their modal.
func (b *Bot) handleClick(ctx context.Context, ic interaction) {
	act := ic.Actions[0]
	if act.ActionID == actionRevokeGrant {
		b.revokeGrant(ctx, ic)
		return
	}
	verdict, ok := verdictOf(act.ActionID)
	if !ok {
		return
	}
	user := ic.User.ID
	card := ic.clickedMessage()
	id, digest, _, ok := parseRef(act.Value)
	if !ok {
		b.log.Warn("click with malformed value", "user", user, "action", act.ActionID)
		return
	}
	r, err := b.requests.Request(ctx, id)
	if err != nil {
		b.refuse(ctx, &approval.Request{ID: id}, user, verdict, card.Channel, err)
		return
	}
	if !fromCard(r, card, b.policy.Slack.ApprovalsChannel) {
		// A decision counts only when made on the request's own card in
		// the approvals channel, never from a copy of its button elsewhere.
		b.refuse(ctx, r, user, verdict, card.Channel, errNotOnCard)
		return
	}
	if r.Card.TS == "" {
		r.Card = card
	}
	if verdict == approval.VerdictApprove {
		b.decide(ctx, r, approval.Decision{RequestID: id, Verdict: verdict, Approver: user, At: b.now(), Digest: digest},
			act.ActionID == actionApproveAllow)
		return
	}
	// Refuse early what is certain to be refused, so nobody fills in a modal
	// for nothing. Everything is checked again on submit.
	switch {
	case r.Status.Decided():
		b.refuse(ctx, r, user, verdict, card.Channel, decidedError(r))
		return
	case !r.Allows(verdict):
		b.refuse(ctx, r, user, verdict, card.Channel, approval.ErrVerdictNotAllowed)
		return
	case digest != r.Digest:
		b.refuse(ctx, r, user, verdict, card.Channel, approval.ErrStaleArgs)
		return
	}
	pctx, cancel := context.WithTimeout(ctx, precheckBudget)
	err = b.authorize(pctx, r, user)
	cancel()
	if errors.Is(err, approval.ErrNotApprover) || errors.Is(err, approval.ErrSelfApproval) {
		b.refuse(ctx, r, user, verdict, card.Channel, err)
		return
	}
	meta := strings.Join([]string{r.ID, digest, r.Card.Channel, r.Card.TS}, "|")
	var view slack.ModalViewRequest
	switch verdict {
	case approval.VerdictReject:
		view = textModal(callbackReject, "Reject request", "Reject", blockReason,
			"Why? (the requester and the agent will see this)", r, meta)
	case approval.VerdictRespond:
		view = textModal(callbackRespond, "Respond instead", "Send", blockResponse,
			fmt.Sprintf("Your answer, given to the model instead of running %s", cutRunes(r.Tool, 100)), r, meta)
	case approval.VerdictEdit:
		view = editModal(r, editFields(toolSchema(b.policy, r.Tool)), meta)
	}
	// No retry: the trigger_id is single use and dies after 3 s.
	if _, err := b.api.OpenViewContext(ctx, ic.TriggerID, view); err != nil {
		b.log.Error("views.open", "request_id", r.ID, "user", user, "err", err)
		b.ephemeral(ctx, card.Channel, user, "Slack didn't let me open the form in time. Please click again.")
	}
}

// clickedMessage is the message whose button was clicked.
func (ic interaction) clickedMessage() approval.CardRef {
	return approval.CardRef{Channel: cmp(ic.Container.ChannelID, ic.Channel.ID), TS: cmp(ic.Container.MessageTS, ic.Message.TS)}
}

// fromCard reports whether a click at clicked came from r's card: the card
// the store recorded, or, before it is recorded, a message in the approvals
// channel.
func fromCard(r *approval.Request, clicked approval.CardRef, approvalsChannel string) bool {
	if r.Card.TS != "" {
		return clicked.Channel == r.Card.Channel && clicked.TS == r.Card.TS
	}
	return clicked.Channel != "" && clicked.Channel == approvalsChannel
}

func cmp(a, b string) string {
	if a != "" {
		return a
	}
	return b
}

// textModal is the Reject and Respond modal: one required text input.
func textModal(callback, title, submit, blockID, label string, r *approval.Request, meta string) slack.ModalViewRequest {
	el := slack.NewPlainTextInputBlockElement(nil, "text")
	el.Multiline = true
	el.MaxLength = maxInitialValue
	return slack.ModalViewRequest{
		Type:            slack.VTModal,
		CallbackID:      callback,
		Title:           plain(cutRunes(title, maxModalTitle)),
		Submit:          plain(submit),
		Close:           plain("Cancel"),
		PrivateMetadata: meta,
		Blocks: slack.Blocks{BlockSet: []slack.Block{
			contextBlock(fmt.Sprintf("`%s` requested by %s · request `%s`", esc(cutRunes(r.Tool, 100)), mention(r.Requester), esc(r.ID))),
			slack.NewInputBlock(blockID, plain(label), nil, el),
		}},
	}
}

// onViewSubmission validates a modal submission synchronously and queues
// the decision. It returns the response_action "errors" payload when a
// field needs fixing, nil to close the modal.
func (b *Bot) onViewSubmission(ctx context.Context, ic interaction) (any, error) {
	id, digest, card, ok := parseRef(ic.View.PrivateMetadata)
	if !ok {
		return nil, nil
	}
	user := ic.User.ID
	values := ic.View.State.Values
	d := approval.Decision{RequestID: id, Approver: user, Digest: digest}
	switch ic.View.CallbackID {
	case callbackReject, callbackRespond:
		block := blockReason
		d.Verdict = approval.VerdictReject
		if ic.View.CallbackID == callbackRespond {
			block, d.Verdict = blockResponse, approval.VerdictRespond
		}
		v, _ := formValue(values, block)
		if v.Value == nil || strings.TrimSpace(*v.Value) == "" {
			msg := "Please give a reason."
			if d.Verdict == approval.VerdictRespond {
				msg = "Please write the answer."
			}
			return viewErrors(map[string]string{block: msg}), nil
		}
		d.Text = strings.TrimSpace(*v.Value)
	case callbackEdit:
		r, err := b.requests.Request(ctx, id)
		if err != nil {
			return nil, b.submit(ctx, func(ctx context.Context) {
				b.refuse(ctx, &approval.Request{ID: id}, user, approval.VerdictEdit, card.Channel, err)
			})
		}
		schema := b.policy.Schema(r.Tool)
		if schema == nil {
			b.log.Error("tool has no usable schema; edit refused", "tool", r.Tool)
			return viewErrors(map[string]string{firstBlock(editFields(toolSchema(b.policy, r.Tool)), values): "Internal error: the tool's schema is not usable."}), nil
		}
		fields := editFields(toolSchema(b.policy, r.Tool))
		args, errs := applyEdit(r.Args, fields, values, schema)
		if len(errs) > 0 {
			return viewErrors(errs), nil
		}
		// Deny rules bind approvers too; the agent checks again before
		// running, this only says so while the modal is open.
		if as, err := b.gate.Assess(approval.ToolCall{Tool: r.Tool, Args: args}, r.Requester); err == nil && as.Denied != nil {
			return viewErrors(map[string]string{deniedBlock(as.Denied, fields, values): "The policy refuses this: " + as.Denied.Reason}), nil
		}
		d.Verdict, d.Args = approval.VerdictEdit, args
		if jsonEqual(args, r.Args) {
			// Nothing changed: an edit with no change is an approval.
			d.Verdict, d.Args = approval.VerdictApprove, nil
		}
	default:
		return nil, nil
	}
	return nil, b.submit(ctx, func(ctx context.Context) {
		r, err := b.requests.Request(ctx, id)
		if err != nil {
			b.refuse(ctx, &approval.Request{ID: id}, user, d.Verdict, card.Channel, err)
			return
		}
		if r.Card.TS == "" {
			r.Card = card
		}
		d.At = b.now()
		b.decide(ctx, r, d, false)
	})
}

// deniedBlock is the modal field a deny rule's refusal is shown on: the
// first field the rule reads, else the first field.
func deniedBlock(d *approval.Denial, fields []field, values map[string]map[string]inputValue) string {
	if refs, err := approval.ArgRefs(d.Rule); err == nil {
		for _, f := range fields {
			if _, shown := values[f.blockID]; shown && slices.Contains(refs, f.name) {
				return f.blockID
			}
		}
	}
	return firstBlock(fields, values)
}

func viewErrors(errs map[string]string) map[string]any {
	return map[string]any{"response_action": "errors", "errors": errs}
}

// decide checks that the clicker may decide r, records d, audits the
// outcome and redraws the card. With allow (Approve + allow), an approval
// that decides r also pre-authorises further calls like it (grant). A
// refusal changes nothing: the clicker gets an ephemeral explanation and
// the audit gets an entry.
func (b *Bot) decide(ctx context.Context, r *approval.Request, d approval.Decision, allow bool) {
	channel := cmp(r.Card.Channel, b.policy.Slack.ApprovalsChannel)
	if r.Status.Decided() {
		b.refuse(ctx, r, d.Approver, d.Verdict, channel, decidedError(r))
		return
	}
	switch {
	case allow && !offersGrant(r):
		b.refuse(ctx, r, d.Approver, d.Verdict, channel, errGrantNotOffered)
		return
	case allow && d.Approver == r.Requester:
		b.refuse(ctx, r, d.Approver, d.Verdict, channel, errSelfGrant)
		return
	}
	if err := b.authorize(ctx, r, d.Approver); err != nil {
		b.refuse(ctx, r, d.Approver, d.Verdict, channel, err)
		return
	}
	after, err := b.requests.DecideThen(ctx, d, func(after *approval.Request) {
		b.auditDecision(ctx, r, after, d)
		if allow && after.Status == approval.StatusApproved {
			// Before the agent wakes, so its next call already sees it.
			after.Grant = b.grant(ctx, r, d, channel)
		}
	})
	if err != nil {
		b.refuse(ctx, r, d.Approver, d.Verdict, channel, err)
		if errors.Is(err, approval.ErrStaleArgs) || errors.Is(err, approval.ErrAlreadyDecided) || errors.Is(err, approval.ErrExpired) {
			b.refreshCard(ctx, r)
		}
		return
	}
	if after.Card.TS == "" {
		after.Card = r.Card
	}
	b.log.Info("decision recorded", "request_id", r.ID, "tool", r.Tool, "user", d.Approver, "verdict", d.Verdict, "status", after.Status)
	if err := b.updateCard(ctx, after); err != nil {
		b.log.Error("card not updated after decision", "request_id", r.ID, "err", err)
	}
}

// grant saves the pre-authorisation given with d's approval of r and
// audits it; on failure the approver is told that later calls will ask
// again, and nil is returned.
func (b *Bot) grant(ctx context.Context, r *approval.Request, d approval.Decision, channel string) *approval.Grant {
	g := &approval.Grant{
		ID: approval.NewID("grant"), Tool: r.Tool, Requester: r.Requester, Origin: r.Origin,
		GrantedBy: d.Approver, RequestID: r.ID, Created: d.At, Expires: d.At.Add(r.Preauthorize),
	}
	if err := b.requests.PutGrant(ctx, g); err != nil {
		b.log.Error("pre-authorisation not saved; the approval stands", "request_id", r.ID, "user", d.Approver, "err", err)
		b.ephemeral(ctx, channel, d.Approver, "Approved. The pre-authorisation could not be saved, so further calls will ask again.")
		return nil
	}
	b.auditLog(ctx, approval.Record{Event: approval.EventGranted, RequestID: r.ID, RunID: r.RunID, Actor: d.Approver, Tool: r.Tool,
		Data: map[string]any{"grant_id": g.ID, "requester": g.Requester, "channel": g.Origin.Channel, "thread_ts": g.Origin.ThreadTS,
			"expires": g.Expires}})
	return g
}

// revokeGrant handles Revoke pre-authorisation: any approver of the
// request, or whoever gave the grant, may end it early.
func (b *Bot) revokeGrant(ctx context.Context, ic interaction) {
	user := ic.User.ID
	card := ic.clickedMessage()
	id, grantID, ok := strings.Cut(ic.Actions[0].Value, "|")
	if !ok {
		b.log.Warn("revoke click with malformed value", "user", user)
		return
	}
	r, err := b.requests.Request(ctx, id)
	if err == nil && !fromCard(r, card, b.policy.Slack.ApprovalsChannel) {
		err = errNotOnCard
	}
	if err == nil && r.Grant != nil && r.Grant.GrantedBy != user {
		// Four-eyes does not apply to ending a permission: the requester
		// may revoke too. Rights are those of an approver of the request.
		err = b.authorize(ctx, &approval.Request{ID: r.ID, Approvers: r.Approvers}, user)
	}
	if err != nil {
		if r == nil {
			r = &approval.Request{ID: id}
		}
		b.refuse(ctx, r, user, "revoke_grant", card.Channel, err)
		return
	}
	g, err := b.requests.RevokeGrant(ctx, id, grantID, user)
	if err != nil {
		b.refuse(ctx, r, user, "revoke_grant", card.Channel, err)
		return
	}
	b.auditLog(ctx, approval.Record{Event: approval.EventGrantRevoked, RequestID: r.ID, RunID: r.RunID, Actor: user, Tool: r.Tool,
		Data: map[string]any{"grant_id": g.ID, "granted_by": g.GrantedBy, "revoked_by": g.RevokedBy}})
	r.Grant = g
	if r.Card.TS == "" {
		r.Card = card
	}
	if err := b.updateCard(ctx, r); err != nil {
		b.log.Error("card not updated after revoking a grant", "request_id", r.ID, "err", err)
	}
}

// auditDecision records a decision the store accepted: decided when final,
// approval_counted for a vote (or an edit) short of the quorum. It runs
// before the agent is woken (Requests.DecideThen).
func (b *Bot) auditDecision(ctx context.Context, r, after *approval.Request, d approval.Decision) {
	ev := approval.EventDecided
	// created and decision_ms let audit stats and the decision-time metric
	// time a decision without finding the request's first entry.
	data := map[string]any{"verdict": d.Verdict, "digest": d.Digest, "status": after.Status,
		"created": r.Created, "decision_ms": d.At.Sub(r.Created).Milliseconds()}
	if after.Status == approval.StatusPending {
		ev = approval.EventApprovalVote
		data["approvals"] = len(after.Approvals)
		data["quorum"] = max(after.Quorum, 1)
	}
	if d.Text != "" {
		data["text"] = d.Text
	}
	if d.Verdict == approval.VerdictEdit {
		data["args"] = d.Args
		data["original_args"] = r.Args
		data["new_digest"] = after.Digest
	}
	b.auditLog(ctx, approval.Record{Event: ev, RequestID: r.ID, RunID: r.RunID, Actor: d.Approver, Tool: r.Tool, Data: data, Secret: b.secretFields(r.Tool)})
}

// refreshCard redraws the card from the store's current copy.
func (b *Bot) refreshCard(ctx context.Context, r *approval.Request) {
	cur, err := b.requests.Request(ctx, r.ID)
	if err != nil {
		return
	}
	if cur.Card.TS == "" {
		cur.Card = r.Card
	}
	_ = b.updateCard(ctx, cur)
}

// refuse tells the clicker why nothing changed and audits the refusal.
func (b *Bot) refuse(ctx context.Context, r *approval.Request, user string, v approval.Verdict, channel string, err error) {
	code := refusalCode(err)
	log := b.log.With("request_id", r.ID, "tool", r.Tool, "user", user, "verdict", v, "reason", code)
	if isRefusal(err) {
		log.Info("click refused", "err", err)
	} else {
		log.Error("click failed", "err", err)
	}
	b.auditLog(ctx, approval.Record{
		Event: approval.EventDecisionRefuse, RequestID: r.ID, RunID: r.RunID, Actor: user, Tool: r.Tool,
		Data: map[string]any{"verdict": v, "reason": code},
	})
	if channel == "" {
		channel = b.policy.Slack.ApprovalsChannel
	}
	b.ephemeral(ctx, channel, user, userText(err))
}

func (b *Bot) auditLog(ctx context.Context, rec approval.Record) {
	if _, err := b.audit.Append(ctx, rec); err != nil {
		b.log.Error("audit append failed", "event", rec.Event, "request_id", rec.RequestID, "err", err)
	}
}

// secretFields names the tool's argument properties never to be audited in
// clear.
func (b *Bot) secretFields(tool string) []string {
	if tp, ok := b.policy.Policy.Tools[tool]; ok {
		return tp.Secret
	}
	return nil
}

// decidedError describes an already final request for the clicker.
func decidedError(r *approval.Request) error {
	de := &approval.DecidedError{RequestID: r.ID, Status: r.Status}
	if r.Decision != nil {
		de.By, de.At = r.Decision.Approver, r.Decision.At
	}
	return de
}
