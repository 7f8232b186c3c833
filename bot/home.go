package bot

import (
	"cmp"
	"context"
	"fmt"
	"strings"

	"github.com/slack-go/slack"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/approval/clip"
)

// Overview sizes: App Home has room for 100 blocks; a slash command answer
// over Socket Mode must stay under 20 KB.
const (
	homePending    = 40
	homeRecent     = 10
	commandPending = 10
	commandRecent  = 5
)

// publishHome shows user the requests waiting for them and their own
// recent requests on the App Home tab.
func (b *Bot) publishHome(ctx context.Context, user string) {
	blocks, err := b.overview(ctx, user, homePending, homeRecent)
	if err != nil {
		b.log.Error("app home", "user", user, "err", err)
		blocks = []slack.Block{mrkdwnSection("Internal error.")}
	}
	blocks = append(blocks, b.passkeyBlocks(ctx, user)...)
	err = b.retry(ctx, "views.publish", func(ctx context.Context) error {
		_, err := b.views.PublishViewContext(ctx, slack.PublishViewContextRequest{
			UserID: user,
			View:   slack.HomeTabViewRequest{Type: slack.VTHomeTab, Blocks: slack.Blocks{BlockSet: blocks}},
		})
		return err
	})
	if err != nil {
		b.log.Error("views.publish", "user", user, "err", err)
	}
}

// overview lists pending requests user may decide (oldest first, with
// deadlines) and user's own recent requests.
func (b *Bot) overview(ctx context.Context, user string, maxPending, maxRecent int) ([]slack.Block, error) {
	pending, err := b.home.Pending(ctx)
	if err != nil {
		return nil, fmt.Errorf("pending requests: %w", err)
	}
	var mine []*approval.Request
	for _, r := range pending {
		if b.authorize(ctx, r, user) == nil {
			mine = append(mine, r)
		}
	}
	blocks := []slack.Block{slack.NewHeaderBlock(plain("Waiting for your decision"))}
	if len(mine) == 0 {
		blocks = append(blocks, mrkdwnSection("Nothing is waiting for you. 🎉"))
	}
	for i, r := range mine {
		if i == maxPending {
			blocks = append(blocks, contextBlock(fmt.Sprintf("…and %d more in %s", len(mine)-i, channelRef(b.policy.Slack.ApprovalsChannel))))
			break
		}
		line := fmt.Sprintf("%s · %s risk · asked by %s · due %s", code(clip.Runes(r.Tool, 100)), riskOf(r), requester(r), slackDate(r.Deadline))
		if r.Mode == approval.ModeAfter {
			line = fmt.Sprintf("%s · %s risk · asked by %s · runs %s unless cancelled", code(clip.Runes(r.Tool, 100)), riskOf(r), requester(r), slackDate(r.Deadline))
		}
		if max(r.Quorum, 1) > 1 {
			line += " · " + quorumText(r)
		}
		if r.Preview.Summary != "" {
			line += "\n" + litFit(r.Preview.Summary, 300)
		}
		in := channelRef(cmp.Or(r.Card.Channel, b.policy.Slack.ApprovalsChannel))
		if pl := b.cardLink(ctx, r.Card); pl != "" {
			line += "\n" + link(pl, "Open the card") + " in " + in
		} else {
			line += "\nIn " + in
		}
		blocks = append(blocks, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	grants, err := b.grantLines(ctx, user, maxPending)
	if err != nil {
		return nil, err
	}
	if len(grants) > 0 {
		blocks = append(blocks, slack.NewDividerBlock(), slack.NewHeaderBlock(plain("Pre-authorisations in force")))
		blocks = append(blocks, grants...)
	}
	recent, err := b.home.RecentByRequester(ctx, user, maxRecent)
	if err != nil {
		return nil, fmt.Errorf("recent requests of %s: %w", user, err)
	}
	blocks = append(blocks, slack.NewDividerBlock(), slack.NewHeaderBlock(plain("Your recent requests")))
	if len(recent) == 0 {
		blocks = append(blocks, mrkdwnSection("You have not asked for anything that needed approval yet."))
	}
	for _, r := range recent {
		line := fmt.Sprintf("%s · %s · asked %s", code(clip.Runes(r.Tool, 100)), statusLabel(r), slackDate(r.Created))
		switch {
		case r.Status == approval.StatusPending && r.Mode == approval.ModeAfter:
			line += " · runs " + slackDate(r.Deadline) + " unless cancelled"
		case r.Status == approval.StatusPending:
			line += " · due " + slackDate(r.Deadline)
		}
		if pl := b.cardLink(ctx, r.Card); pl != "" {
			line += " · " + link(pl, "card")
		}
		blocks = append(blocks, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	return blocks, nil
}

// cardLink is the permalink of the card at ref, "" when it is not up yet
// or Slack cannot say where it is. The lists link each request to its
// card, never show a bare request id: a person cannot open one.
func (b *Bot) cardLink(ctx context.Context, ref approval.CardRef) string {
	if !ref.Bound() {
		return ""
	}
	return b.permalink(ctx, ref.Channel, ref.TS)
}

// grantLines lists the grants in force that concern user: given by them,
// covering their calls, or for a tool they may approve. Each links to the
// card of the request approved with it, which offers Revoke.
func (b *Bot) grantLines(ctx context.Context, user string, limit int) ([]slack.Block, error) {
	grants, err := b.home.ActiveGrants(ctx)
	if err != nil {
		return nil, fmt.Errorf("active grants: %w", err)
	}
	var out []slack.Block
	for _, g := range grants {
		tp := b.policy.Policy.Tools[g.Tool]
		concerns := user == g.Requester || user == g.GrantedBy ||
			b.authorize(ctx, &approval.Request{ID: g.RequestID, Approvers: tp.Approvers}, user) == nil
		if !concerns {
			continue
		}
		if len(out) == limit {
			out = append(out, contextBlock("…and more: see the cards in "+channelRef(b.policy.Slack.ApprovalsChannel)))
			break
		}
		card := "its card"
		if r, err := b.records.Request(ctx, g.RequestID); err == nil {
			if pl := b.cardLink(ctx, r.Card); pl != "" {
				card = link(pl, card)
			}
		}
		line := fmt.Sprintf("🔓 %s for %s in %s without a card · allowed by %s · until %s\nRevoke on %s in %s",
			code(clip.Runes(g.Tool, 100)), mention(g.Requester), channelRef(g.Origin.Channel), mention(g.GrantedBy), slackDate(g.Expires),
			card, channelRef(b.policy.Slack.ApprovalsChannel))
		out = append(out, mrkdwnSection(plainFit(line, maxSectionText)))
	}
	return out, nil
}

func statusLabel(r *approval.Request) string {
	switch r.Status {
	case approval.StatusPending:
		if r.Mode == approval.ModeAfter {
			return "⏱ in its cancel window"
		}
		return "⏳ waiting (" + quorumText(r) + ")"
	case approval.StatusExecuted:
		return "✅ ran"
	case approval.StatusFailed:
		return "⚠️ failed"
	}
	s := statusWord(r.Status)
	if r.Decision != nil && r.Decision.Approver != "" && r.Status != approval.StatusExpired {
		s += " by " + mention(r.Decision.Approver)
	}
	return s
}

// onCommand answers /countersign at once with an ephemeral message.
func (b *Bot) onCommand(ctx context.Context, cmd command) (any, error) {
	if !slackIDs(cmd.UserID, cmd.ChannelID, cmd.TeamID, cmd.EnterpriseID, cmd.UserTeamID) {
		return nil, errBadPayload // ids of no Slack shape: refused, never stored
	}
	if foreign := b.foreignTeam(cmd.EnterpriseID, cmd.TeamID, cmd.UserTeamID); foreign != "" {
		b.log.Warn("slash command from another workspace refused", "user", clip.Runes(cmd.UserID, 40), "team", clip.Runes(foreign, 40))
		return ephemeralAnswer("Countersign here serves another workspace, so it cannot answer you.", nil), nil
	}
	switch strings.ToLower(strings.TrimSpace(cmd.Text)) {
	case "", "pending", "list":
		blocks, err := b.overview(ctx, cmd.UserID, commandPending, commandRecent)
		if err != nil {
			b.log.Error("slash command", "user", cmd.UserID, "err", err)
			return ephemeralAnswer(userText(err), nil), nil
		}
		return ephemeralAnswer("Requests waiting for you", blocks), nil
	case "passkey":
		return b.passkeyCommand(ctx, cmd)
	}
	name := cmp.Or(cmd.Command, "/countersign")
	return ephemeralAnswer(fmt.Sprintf("Usage: %s lists the requests waiting for your decision and your recent requests; %s asks a colleague to vouch for your passkey registration.",
		code(name+" pending"), code(name+" passkey")), nil), nil
}
