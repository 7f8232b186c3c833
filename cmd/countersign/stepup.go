package main

import (
	"fmt"
	"strings"

	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/cmd/countersign/server/stepup"
)

// newStepUp builds the step-up page (COUNTERSIGN_PUBLIC_URL) and gives the
// lifecycle the store's links; nil without a public URL. A policy that
// asks step-up confirmations without one still starts (everything else
// works), loudly: those votes fail closed, each refused with a sentence
// naming the variable, since nobody can confirm them.
func (m *Main) newStepUp(lc *approval.Lifecycle) (*stepup.Page, error) {
	if m.Config.PublicURL == "" {
		tools := m.Policy.StepUpTools()
		if len(tools) > 0 {
			m.Logger.Error("COUNTERSIGN_PUBLIC_URL is not set, but the policy asks step-up confirmations: approvals of these tools are refused until it is",
				"tools", strings.Join(tools, ", "))
		}
		return nil, nil
	}
	lc.SetStepUps(m.Store)
	page, err := stepup.New(stepup.Options{Domain: lc, Keys: m.Store, Origin: m.Config.PublicURL, Prefix: server.PathStepUp,
		OIDC: stepup.OIDCFrom(m.Config.OIDCIssuer, m.Config.OIDCClientID, m.Config.OIDCClientSecret), Logger: m.Logger.With("component", "stepup")})
	if err != nil {
		return nil, fmt.Errorf("COUNTERSIGN_PUBLIC_URL: %w", err)
	}
	return page, nil
}

// stepUpOffers is the page as the bot's StepUpOffers, nil (no step-up)
// without one: a typed nil would not compare equal to nil in the bot.
func stepUpOffers(p *stepup.Page) bot.StepUpOffers {
	if p == nil {
		return nil
	}
	return p
}
