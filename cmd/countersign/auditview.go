package main

import (
	"fmt"
	"net/http"
	"time"

	"github.com/countersign/countersign/approval/replay"

	"github.com/countersign/countersign/cmd/countersign/server"
	"github.com/countersign/countersign/cmd/countersign/server/auditweb"
)

// newAuditView builds the read-only audit view (COUNTERSIGN_AUDIT_VIEW),
// which the server mounts at server.PathAudit.
func (m *Main) newAuditView() (http.Handler, error) {
	cfg := m.Config
	proxies, err := auditweb.ParseTrustedProxies(cfg.AuditViewTrustedProxies) // checked by ValidateServe
	if err != nil {
		return nil, fmt.Errorf("COUNTERSIGN_AUDIT_VIEW_TRUSTED_PROXIES: %w", err)
	}
	view, err := auditweb.New(auditweb.Options{
		Entries:        m.Audit,
		Pending:        m.Store,
		Token:          cfg.AuditViewToken,
		User:           cfg.AuditViewUser,
		Password:       cfg.AuditViewPassword,
		SlackURL:       cfg.SlackWorkspaceURL,
		TrustedProxies: proxies,
		Names:          m.Bot, // users.info, conversations.info, usergroups.list, cached
		Suggest:        m.suggest,
		Now:            m.Now,
		Logger:         m.Logger.With("component", "auditweb"),
		Prefix:         server.PathAudit,
	})
	if err != nil {
		return nil, fmt.Errorf("COUNTERSIGN_AUDIT_VIEW: %w", err)
	}
	return view, nil
}

// suggest starts drafting the load page's rules from a window's approvals
// under the policy this process runs (policy suggest's, with its --min
// default).
func (m *Main) suggest(since time.Time) (*replay.Suggester, error) {
	return replay.NewSuggester(replay.SuggestOptions{
		Current: replay.Policy{Policy: m.Policy.Policy, Schemas: m.Policy}, Since: since, Min: 20})
}
