package main

import (
	"context"
	"fmt"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/approval"
	"github.com/countersign/countersign/bot"
	"github.com/countersign/countersign/store"
)

// newAPI builds the HTTP API (/v1) on the process's lifecycle owner
// and store: the policy file's api keys, the deployment's secret that keys
// request ids (read from Redis, created by the first process) and the
// previews of the declared tools that have one (the lifecycle judges
// every call).
func (m *Main) newAPI(ctx context.Context, lc *approval.Lifecycle, tools []agent.Tool) (*api.Server, error) {
	secret, err := m.Store.Secret(ctx)
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	m.deploymentSecret = secret
	s, err := api.New(api.Options{
		Lifecycle: lc, Requests: m.Store, Audit: m.Audit, Keys: m.Policy.API.Keys, IDSecret: secret,
		Preview: agent.Previews(tools, m.Policy.HasPreview),
		Now:     m.Now,
		Logger:  m.Logger.With("component", "api"),
		Names:   m.Bot, // approver_name: users.info, cached
		// One budget per key for every replica, in Redis.
		Limiter: m.Store.Limiter(),
		// A hook that went away is seen by every replica: it may come
		// back through any of them within the grace period.
		Polls:         m.Store.Polls(),
		WithdrawGrace: m.Config.APIWithdrawGrace,
		// Parked long polls give their connections back to the server.
		Reuse: m.front.Reuse,
	})
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	return s, nil
}

// The API names approvers through the bot and spends keys' budgets in
// the store.
var (
	_ api.Names   = (*bot.Bot)(nil)
	_ api.Limiter = (*store.Limiter)(nil)
	_ api.Polls   = (*store.Polls)(nil)
)

// botNames names through the process's bot once it is built: the webhooks
// are built before it (the lifecycle needs them, the bot needs the
// lifecycle), and deliver only once requests are decided, after Start.
type botNames struct{ m *Main }

func (n botNames) Name(ctx context.Context, id string) string {
	if n.m.Bot == nil {
		return ""
	}
	return n.m.Bot.Name(ctx, id)
}

// webhooks builds the API's webhook sender from the policy file's
// api.webhooks, each secret read from its environment variable.
func (m *Main) webhooks() (*api.Webhooks, error) {
	eps, err := api.Endpoints(m.Policy.API.Webhooks, m.Env)
	if err != nil {
		return nil, err
	}
	hooks, err := api.NewWebhooks(api.WebhookOptions{Endpoints: eps, Audit: m.Audit, Now: m.Now,
		Logger: m.Logger.With("component", "webhooks"), Names: botNames{m},
		Secret: func(tool string) []string { return m.Policy.Policy.Tools[tool].Secret }})
	if err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	return hooks, nil
}
