package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/countersign/countersign/agent"
	"github.com/countersign/countersign/agent/api"
	"github.com/countersign/countersign/approval"
)

// newAPI builds the HTTP API (/v1) on the process's gate, lifecycle owner
// and store: the keys of the policy file's api key, the previews of the
// declared tools that have one, their schemas.
func (m *Main) newAPI(gate *approval.Gate, lc *approval.Lifecycle, tools []agent.Tool) (*api.Server, error) {
	keys := make([]api.Key, 0, len(m.Policy.API.Keys))
	for _, k := range m.Policy.API.Keys {
		keys = append(keys, api.Key{Name: k.Name, SHA256: k.SHA256, Tools: k.Tools, SlackUser: k.SlackUser, RatePerMinute: k.RatePerMinute})
	}
	s, err := api.New(api.Options{
		Lifecycle: lc, Requests: m.Store, Gate: gate, Audit: m.auditor, Keys: keys,
		Preview: agent.Previews(tools, func(name string) bool {
			spec, ok := m.Policy.Tool(name)
			return ok && spec.Preview != nil
		}),
		Validate: m.Policy.ValidateDeclaredArgs, // an external tool has no schema here
		Now:      m.Now,
		Logger:   m.Logger.With("component", "api"),
	})
	if err != nil {
		return nil, fmt.Errorf("api: %w", err)
	}
	return s, nil
}

// webhooks builds the API's webhook sender from the policy file's
// api.webhooks, each secret read from its environment variable.
func (m *Main) webhooks(client *http.Client) (*api.Webhooks, error) {
	var eps []api.Endpoint
	for i, w := range m.Policy.API.Webhooks {
		secret := m.Env(w.SecretEnv)
		if secret == "" {
			return nil, fmt.Errorf("policy api.webhooks[%d].secret_env: environment variable %s is empty; it must hold the signing secret", i, w.SecretEnv)
		}
		eps = append(eps, api.Endpoint{Name: w.Name, URL: w.URL, Secret: []byte(secret)})
	}
	hc := &http.Client{Transport: client.Transport, Timeout: 10 * time.Second}
	hooks, err := api.NewWebhooks(api.WebhookOptions{Endpoints: eps, Audit: m.auditor, Client: hc, Now: m.Now,
		Sleep: m.WebhookSleep, Logger: m.Logger.With("component", "webhooks")})
	if err != nil {
		return nil, fmt.Errorf("webhooks: %w", err)
	}
	return hooks, nil
}
