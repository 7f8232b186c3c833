package bot

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"time"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
	"github.com/countersign/countersign/approval/duration"
)

// Budgets of the work done before answering Slack.
const (
	// precheckBudget bounds the approver check before opening a modal: the
	// trigger_id dies after 3 s, and the check is repeated on submit.
	precheckBudget = time.Second
	// storeBudget bounds a store read made before answering Slack (an edit
	// is validated against its request), well inside syncBudget.
	storeBudget = 1500 * time.Millisecond
)

// onInteraction answers an interactive payload. Button clicks are queued;
// view submissions are validated here, before answering, so field errors
// show in the modal, and the decision itself is queued.
func (b *Bot) onInteraction(ctx context.Context, payload []byte) (any, error) {
	var ic interaction
	if err := json.Unmarshal(withoutBlocks(payload), &ic); err != nil {
		return nil, errBadPayload
	}
	enterprise := ""
	if ic.Enterprise != nil {
		enterprise = ic.Enterprise.ID
	}
	if !slackIDs(enterprise, ic.Team.ID, ic.User.ID, ic.User.TeamID, ic.Channel.ID, ic.Container.ChannelID) {
		return nil, errBadPayload // ids of no Slack shape: refused, never stored
	}
	if foreign := b.foreignTeam(enterprise, ic.Team.ID, ic.User.TeamID); foreign != "" {
		// Another organisation's member (Slack Connect, an org-wide
		// install): nothing they click or submit decides anything here.
		return b.refuseForeign(ctx, ic, foreign)
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
	case actionCancelRun:
		return approval.VerdictCancel, true
	case actionRunNow:
		return approval.VerdictRunNow, true
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
	if act.ActionID == actionVouchPasskey {
		b.vouchPasskey(ctx, ic)
		return
	}
	if act.ActionID == actionRevokePasskey {
		b.revokePasskey(ctx, ic)
		return
	}
	if act.ActionID == actionMarkWrong || act.ActionID == actionLooksRight {
		b.feedbackClick(ctx, ic)
		return
	}
	verdict, ok := verdictOf(act.ActionID)
	if !ok {
		return
	}
	who := ic.clicker()
	card := ic.clickedMessage()
	id, digest, _, ok := parseRef(act.Value)
	if !ok || !approval.ValidID("req", id) {
		b.log.Warn("click with malformed value", "user", who.user, "action", clip.Bytes(act.ActionID, approval.MaxField))
		return
	}
	d := approval.Decision{RequestID: id, Verdict: verdict, Approver: who.user, At: b.now(), Digest: digest}
	if (verdict == approval.VerdictApprove || verdict == approval.VerdictRunNow) && b.decideOnCopy(ctx, card, who, d, act.ActionID == actionApproveAllow) {
		return
	}
	r, err := b.records.Request(ctx, id)
	if err == nil {
		r, err = b.bindClicked(ctx, r, ic)
	}
	if err != nil {
		b.refuse(ctx, cmp.Or(r, &approval.Request{ID: id}), who, verdict, err)
		return
	}
	if err := onCard(r, card); err != nil {
		// A decision counts only when made on the request's own card,
		// never from a copy of its button elsewhere.
		b.refuse(ctx, r, who, verdict, err)
		return
	}
	if verdict == approval.VerdictApprove || verdict == approval.VerdictRunNow {
		b.decide(ctx, r, who, d, act.ActionID == actionApproveAllow)
		return
	}
	// Refuse early what is certain to be refused, so nobody fills in a modal
	// for nothing. Everything is checked again on submit.
	switch {
	case r.Status.Decided():
		b.refuse(ctx, r, who, verdict, approval.NewDecidedError(r))
		return
	case !r.Allows(verdict):
		b.refuse(ctx, r, who, verdict, approval.ErrVerdictNotAllowed)
		return
	case digest != r.Digest:
		b.refuse(ctx, r, who, verdict, approval.ErrStaleArgs)
		return
	}
	pctx, cancel := context.WithTimeout(ctx, precheckBudget)
	err = b.lifecycle.MayDecide(pctx, r, who.user, verdict, false)
	cancel()
	if errors.Is(err, approval.ErrNotApprover) || errors.Is(err, approval.ErrSelfApproval) {
		b.refuse(ctx, r, who, verdict, err)
		return
	}
	meta := modalMeta{ID: r.ID, Digest: digest, Card: r.Card, ResponseURL: who.responseURL}.String()
	var view slack.ModalViewRequest
	switch verdict {
	case approval.VerdictReject:
		view = textModal(callbackReject, "Reject request", "Reject", blockReason,
			"Why? (the requester and the agent will see this)", r, meta)
		addChoices(&view, r, "Pick a reason (offered by the agent)")
	case approval.VerdictRespond:
		if r.Kind == approval.KindContact {
			view = textModal(callbackRespond, "Answer", "Send", blockResponse, "Your answer (given to the agent)", r, meta)
			addChoices(&view, r, "Pick an answer (suggested by the agent)")
			break
		}
		view = textModal(callbackRespond, "Respond instead", "Send", blockResponse,
			fmt.Sprintf("Your answer, given to the model instead of running %s", clip.Runes(r.Tool, 100)), r, meta)
	case approval.VerdictEdit:
		_, declared := b.policy.Tool(r.Tool)
		view = editModal(r, b.editFieldsOf(r), declared, meta)
	case approval.VerdictCancel:
		view = textModal(callbackCancel, "Cancel this call", "Cancel it", blockReason,
			"Why? (optional; the requester and the agent will see this)", r, meta)
		view.Close = plain("Back")
		if in, ok := view.Blocks.BlockSet[len(view.Blocks.BlockSet)-1].(*slack.InputBlock); ok {
			in.Optional = true
		}
	}
	// No retry: the trigger_id is single use and dies after 3 s.
	if _, err := b.views.OpenViewContext(ctx, ic.TriggerID, view); err != nil {
		b.log.Error("views.open", "request_id", r.ID, "user", who.user, "err", err)
		b.tell(ctx, who, "Slack didn't let me open the form in time. Please click again.")
	}
}

// onCard checks that a click at clicked came from r's own card: the
// message bound to r (Lifecycle.BindCard) and no other. A card not bound
// yet is bound by the click on it first (bindClicked); until a binding is
// recorded nothing counts as the card, so there is no instant at which a
// click on another message could decide r.
func onCard(r *approval.Request, clicked approval.CardRef) error {
	if !r.Card.Bound() || clicked.Channel != r.Card.Channel || clicked.TS != r.Card.TS {
		return errNotOnCard
	}
	return nil
}

// modalMeta is a modal's private_metadata: the request and digest the
// card showed, the card, and the response_url of the click that opened it
// (a view submission carries none of its own).
type modalMeta struct {
	ID, Digest  string
	Card        approval.CardRef
	ResponseURL string
}

func (m modalMeta) String() string {
	return strings.Join([]string{m.ID, m.Digest, m.Card.Channel, m.Card.TS, m.ResponseURL}, "|")
}

func parseModalMeta(s string) (modalMeta, bool) {
	parts := strings.SplitN(s, "|", 5)
	if len(parts) < 4 || parts[0] == "" || parts[1] == "" {
		return modalMeta{}, false
	}
	m := modalMeta{ID: parts[0], Digest: parts[1], Card: approval.CardRef{Channel: parts[2], TS: parts[3]}}
	if len(parts) == 5 {
		m.ResponseURL = parts[4]
	}
	return m, true
}

// textModal is the Reject and Respond modal: one required text input.
func textModal(callback, title, submit, blockID, label string, r *approval.Request, meta string) slack.ModalViewRequest {
	el := slack.NewPlainTextInputBlockElement(nil, "text")
	el.Multiline = true
	el.MaxLength = maxInitialValue
	about := fmt.Sprintf("%s requested %s", code(clip.Runes(r.Tool, 100)), requestedBy(r))
	if r.Kind == approval.KindContact {
		about = fmt.Sprintf("Question asked %s\n%s", callerText(r), quote(litFit(questionOf(r).Msg, 1000)))
	}
	return slack.ModalViewRequest{
		Type:            slack.VTModal,
		CallbackID:      callback,
		Title:           plain(clip.Runes(title, maxModalTitle)),
		Submit:          plain(submit),
		Close:           plain("Cancel"),
		PrivateMetadata: meta,
		Blocks: slack.Blocks{BlockSet: []slack.Block{
			contextBlock(about),
			slack.NewInputBlock(blockID, plain(label), nil, el),
		}},
	}
}

// onViewSubmission validates a modal submission synchronously and queues
// the decision. It returns the response_action "errors" payload when a
// field needs fixing, nil to close the modal.
func (b *Bot) onViewSubmission(ctx context.Context, ic interaction) (any, error) {
	meta, ok := parseModalMeta(ic.View.PrivateMetadata)
	if !ok || !approval.ValidID("req", meta.ID) {
		return nil, nil
	}
	id, digest := meta.ID, meta.Digest
	user := ic.User.ID
	who := clicker{user: user, responseURL: meta.ResponseURL, channel: meta.Card.Channel}
	values := ic.View.State.Values
	d := approval.Decision{RequestID: id, Approver: user, Digest: digest}
	switch ic.View.CallbackID {
	case callbackWrong:
		v, _ := formValue(values, blockReason)
		if v.Value == nil || strings.TrimSpace(*v.Value) == "" {
			return viewErrors(map[string]string{blockReason: "Please say what was wrong."}), nil
		}
		f := approval.Feedback{Wrong: true, By: user, Reason: strings.TrimSpace(*v.Value)}
		return nil, b.submit(ctx, func(ctx context.Context) { b.feedback(ctx, id, meta.Card, who, f) })
	case callbackCancel:
		d.Verdict = approval.VerdictCancel
		if v, _ := formValue(values, blockReason); v.Value != nil {
			d.Text = strings.TrimSpace(*v.Value)
		}
	case callbackReject, callbackRespond:
		block := blockReason
		d.Verdict = approval.VerdictReject
		if ic.View.CallbackID == callbackRespond {
			block, d.Verdict = blockResponse, approval.VerdictRespond
		}
		v, _ := formValue(values, block)
		if v.Value != nil {
			d.Text = strings.TrimSpace(*v.Value)
		}
		// A choice the caller offered may stand for the text.
		d.Choice = pickedChoice(values)
		if d.Text == "" && d.Choice == "" {
			msg := "Please give a reason."
			if d.Verdict == approval.VerdictRespond {
				msg = "Please write the answer."
			}
			if _, offered := values[blockChoice]; offered {
				msg = strings.TrimSuffix(msg, ".") + ", or pick one above."
			}
			return viewErrors(map[string]string{block: msg}), nil
		}
	case callbackEdit:
		// The edit is validated against the request before answering, so
		// field errors show in the modal; a store slower than storeBudget
		// gets a field error too (nothing is recorded), never a late answer.
		rctx, cancel := context.WithTimeout(ctx, storeBudget)
		r, err := b.records.Request(rctx, id)
		cancel()
		if err != nil && !errors.Is(err, approval.ErrNotFound) {
			b.log.Error("edit not validated: store unavailable", "request_id", id, "user", user, "err", err)
			return viewErrors(map[string]string{anyBlock(values): storeNotAnsweringText}), nil
		}
		if err != nil {
			return nil, b.submit(ctx, func(ctx context.Context) {
				b.refuse(ctx, &approval.Request{ID: id}, who, approval.VerdictEdit, err)
			})
		}
		// An edit is a new proposal: judged here (schema, deny rules) so
		// problems show on their fields, and again when recorded.
		args, errs := b.judgeEdit(r, b.editFieldsOf(r), values)
		if len(errs) > 0 {
			return viewErrors(errs), nil
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
		r, err := b.records.Request(ctx, id)
		if err != nil {
			b.refuse(ctx, &approval.Request{ID: id}, who, d.Verdict, err)
			return
		}
		if err := onCard(r, meta.Card); err != nil {
			b.refuse(ctx, r, who, d.Verdict, err)
			return
		}
		if err := applyChoice(r, &d); err != nil {
			b.refuse(ctx, r, who, d.Verdict, err)
			return
		}
		d.At = b.now()
		b.decide(ctx, r, who, d, false)
	})
}

// anyBlock is the first (by name) input block of a submission: where an
// error that belongs to no one field is shown.
func anyBlock(values map[string]map[string]inputValue) string {
	blocks := slices.Sorted(maps.Keys(values))
	if len(blocks) == 0 {
		return blockArgsJSON
	}
	return blocks[0]
}

func viewErrors(errs map[string]string) map[string]any {
	return map[string]any{"response_action": "errors", "errors": errs}
}

// decide checks that the clicker may decide r and hands d to the
// lifecycle owner, which records it, audits it, wakes the agent and has
// the card redrawn. With allow (Approve + allow), an approval that decides
// r also pre-authorises further calls like it (grant). A refusal changes
// nothing: the clicker gets an ephemeral explanation and the audit gets an
// entry.
func (b *Bot) decide(ctx context.Context, r *approval.Request, who clicker, d approval.Decision, allow bool) {
	if r.Status.Decided() {
		b.refuse(ctx, r, who, d.Verdict, approval.NewDecidedError(r))
		return
	}
	// Who may decide (approvers, four-eyes, who may grant) is the
	// lifecycle's judgement, made in Decide.
	after, err := b.lifecycle.Decide(ctx, r, d, approval.DecideOptions{Allow: allow})
	if errors.Is(err, approval.ErrStepUpRequired) && b.stepUp != nil {
		b.offerStepUp(ctx, r, who, d, allow)
		return
	}
	if errors.Is(err, approval.ErrNotReplicated) {
		b.notReplicated(ctx, r, who, d, err)
		return
	}
	if err != nil {
		b.refuse(ctx, r, who, d.Verdict, err)
		return
	}
	b.recorded(ctx, r, who, d, allow, after)
}

// notReplicated answers a decision recorded but not confirmed by a
// replica (ErrNotReplicated): not refused, the clicker decides again to
// be sure.
func (b *Bot) notReplicated(ctx context.Context, r *approval.Request, who clicker, d approval.Decision, err error) {
	b.log.Warn("decision recorded but not confirmed by a replica", "request_id", r.ID, "user", d.Approver, "verdict", d.Verdict, "err", err)
	b.tell(ctx, who, "Recorded, but Redis could not yet confirm a copy on its replica (it may be failing over). If the card still offers its buttons in a moment, decide again.")
}

// recorded logs decision d on r, recorded (after), and tells the clicker
// when the pre-authorisation of an Approve + allow could not be saved.
func (b *Bot) recorded(ctx context.Context, r *approval.Request, who clicker, d approval.Decision, allow bool, after *approval.Request) {
	b.log.Info("decision recorded", "request_id", r.ID, "tool", r.Tool, "user", d.Approver, "verdict", d.Verdict, "status", after.Status)
	if allow && after.Status == approval.StatusApproved && after.Grant == nil {
		b.tell(ctx, who, "Approved. The pre-authorisation could not be saved, so further calls will ask again.")
	}
}

// decideOnCopy decides an Approve or a Run now (d) on the copy of the
// request this process drew on the clicked card (the card writer's, at
// the record's revision), without reading the record: the decision is
// recorded only while the record is still that copy (Lifecycle.Decide,
// Decision.Rev), and judged again on the record if it changed. It reports
// whether the click was answered; false (no such copy, or a decision not
// recorded: a refusal, a step-up, the deadline) leaves the click to be
// decided from the record, which says why.
func (b *Bot) decideOnCopy(ctx context.Context, card approval.CardRef, who clicker, d approval.Decision, allow bool) bool {
	r := b.cards.current(d.RequestID)
	if r == nil || onCard(r, card) != nil {
		return false
	}
	after, err := b.lifecycle.Decide(ctx, r, d, approval.DecideOptions{Allow: allow})
	switch {
	case errors.Is(err, approval.ErrNotReplicated):
		b.notReplicated(ctx, r, who, d, err)
	case err != nil:
		return false
	default:
		b.recorded(ctx, r, who, d, allow, after)
	}
	return true
}

// offerStepUp answers a vote that needs a confirmation: nothing is
// counted; the approver alone gets the one-time link to the step-up page.
func (b *Bot) offerStepUp(ctx context.Context, r *approval.Request, who clicker, d approval.Decision, allow bool) {
	url, err := b.stepUp.OfferStepUp(ctx, r, d, allow)
	if err != nil {
		b.log.Error("step-up link not made", "request_id", r.ID, "user", d.Approver, "err", err)
		b.tell(ctx, who, "Your vote needs a passkey confirmation, but the link could not be made: nothing was counted. Try again in a moment.")
		return
	}
	words := "your vote needs a passkey confirmation"
	if r.StepUp != nil {
		words = r.StepUp.Words()
	}
	b.tell(ctx, who, fmt.Sprintf("Nothing is counted yet: %s. <%s|Confirm your vote here> (the link works once, for %s, and only for you).",
		words, url, duration.Format(approval.StepUpLinkTTL)))
}

// verdictMarkWrong and verdictLooksRight name feedback clicks in refusals
// and their audit entries (they are not decisions).
const (
	verdictMarkWrong  approval.Verdict = "mark_wrong"
	verdictLooksRight approval.Verdict = "looks_right"
)

// feedbackClick handles Mark as wrong (and Wrong) — a modal asks why —
// and Looks right, recorded at once. Only approvers of the request judge
// it; what is certain to be refused is refused before any modal opens.
func (b *Bot) feedbackClick(ctx context.Context, ic interaction) {
	act := ic.Actions[0]
	who := ic.clicker()
	verdict := verdictMarkWrong
	if act.ActionID == actionLooksRight {
		verdict = verdictLooksRight
	}
	id, _, _, ok := parseRef(act.Value)
	if !ok {
		b.log.Warn("click with malformed value", "user", who.user, "action", act.ActionID)
		return
	}
	r, err := b.records.Request(ctx, id)
	if err == nil {
		r, err = b.bindClicked(ctx, r, ic)
	}
	if err == nil && verdict == verdictLooksRight {
		b.feedback(ctx, id, ic.clickedMessage(), who, approval.Feedback{By: who.user})
		return
	}
	if err == nil {
		err = onCard(r, ic.clickedMessage())
	}
	switch {
	case err != nil:
	case !r.Markable() && r.Feedback != nil:
		err = approval.ErrAlreadyMarked
	case !r.Markable():
		err = approval.ErrNotFinal
	default:
		pctx, cancel := context.WithTimeout(ctx, precheckBudget)
		err = b.authorize(pctx, r, who.user)
		cancel()
		if !errors.Is(err, approval.ErrNotApprover) && !errors.Is(err, approval.ErrSelfApproval) {
			err = nil // a failed lookup is checked again on submit
		}
	}
	if err != nil {
		if r == nil {
			r = &approval.Request{ID: id}
		}
		b.refuse(ctx, r, who, verdict, err)
		return
	}
	meta := modalMeta{ID: r.ID, Digest: r.Digest, Card: r.Card, ResponseURL: who.responseURL}.String()
	view := textModal(callbackWrong, "Mark as wrong", "Mark wrong", blockReason,
		"What was wrong? (kept in the audit as an eval case)", r, meta)
	if _, err := b.views.OpenViewContext(ctx, ic.TriggerID, view); err != nil {
		b.log.Error("views.open", "request_id", r.ID, "user", who.user, "err", err)
		b.tell(ctx, who, "Slack didn't let me open the form in time. Please click again.")
	}
}

// feedback checks that the clicker may judge request id, clicked on its
// card, and hands f to the lifecycle owner (record → audit → card).
func (b *Bot) feedback(ctx context.Context, id string, card approval.CardRef, who clicker, f approval.Feedback) {
	verdict := verdictLooksRight
	if f.Wrong {
		verdict = verdictMarkWrong
	}
	r, err := b.records.Request(ctx, id)
	if err != nil {
		b.refuse(ctx, &approval.Request{ID: id}, who, verdict, err)
		return
	}
	if err := onCard(r, card); err != nil {
		b.refuse(ctx, r, who, verdict, err)
		return
	}
	if err := b.authorize(ctx, r, who.user); err != nil {
		b.refuse(ctx, r, who, verdict, err)
		return
	}
	f.At = b.now()
	if _, err := b.lifecycle.Feedback(ctx, id, f); err != nil {
		b.refuse(ctx, r, who, verdict, err)
		return
	}
	b.log.Info("feedback recorded", "request_id", r.ID, "tool", r.Tool, "user", who.user, "wrong", f.Wrong)
}

// revokeGrant handles Revoke pre-authorisation: any approver of the
// request, or whoever gave the grant, may end it early.
func (b *Bot) revokeGrant(ctx context.Context, ic interaction) {
	who := ic.clicker()
	user := who.user
	card := ic.clickedMessage()
	id, grantID, ok := strings.Cut(ic.Actions[0].Value, "|")
	if !ok || !approval.ValidID("req", id) {
		b.log.Warn("revoke click with malformed value", "user", user)
		return
	}
	r, err := b.records.Request(ctx, id)
	if err == nil {
		r, err = b.bindClicked(ctx, r, ic)
	}
	if err == nil {
		err = onCard(r, card)
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
		b.refuse(ctx, r, who, "revoke_grant", err)
		return
	}
	if _, err := b.lifecycle.RevokeGrant(ctx, r, grantID, user); err != nil {
		b.refuse(ctx, r, who, "revoke_grant", err)
	}
}

// refuse tells the clicker why nothing changed and audits the refusal.
func (b *Bot) refuse(ctx context.Context, r *approval.Request, who clicker, v approval.Verdict, err error) {
	code := refusalCode(err)
	log := b.log.With("request_id", r.ID, "tool", r.Tool, "user", who.user, "verdict", v, "reason", code)
	if isRefusal(err) {
		log.Info("click refused", "err", err)
	} else {
		log.Error("click failed", "err", err)
	}
	b.lifecycle.DecisionRefused(ctx, r, who.user, v, code, "")
	text := userText(err)
	if errors.Is(err, approval.ErrNotApprover) && r.Tool != "" {
		text += " " + whoDecides(r, b.policy.Slack.ApprovalsChannel)
	}
	b.tell(ctx, who, text)
}

// refuseForeign answers a click or submission from another organisation:
// audited, logged, the clicker told; nothing changes.
func (b *Bot) refuseForeign(ctx context.Context, ic interaction, team string) (any, error) {
	id := ""
	if len(ic.Actions) > 0 {
		id, _, _, _ = parseRef(ic.Actions[0].Value)
	} else if m, ok := parseModalMeta(ic.View.PrivateMetadata); ok {
		id = m.ID
	}
	if !approval.ValidID("req", id) {
		id = ""
	}
	who := ic.clicker()
	team = clip.Runes(team, 40)
	b.log.Warn("payload from another workspace refused", "request_id", clip.Runes(id, 64), "user", clip.Runes(who.user, 40), "team", team, "type", ic.Type)
	if ic.Type != "block_actions" && ic.Type != "view_submission" {
		return nil, nil
	}
	err := b.submit(ctx, func(ctx context.Context) {
		b.lifecycle.DecisionRefused(ctx, &approval.Request{ID: clip.Runes(id, 64)}, clip.Runes(who.user, 40), "", "foreign_team", team)
		b.tell(ctx, who, "This approval belongs to another workspace, so your click changed nothing.")
	})
	return nil, err // a modal closes; the refusal goes to the clicker
}
