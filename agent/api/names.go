package api

// This file: the names people and models read for the Slack ids in a
// request's view.

import (
	"context"

	"github.com/countersign/countersign/approval"
)

// Names turns a Slack user id into the name people read (the user's real
// name, else display name). *bot.Bot provides it, wired in
// cmd/countersign: the API never imports the bot. Name returns "" when it
// has no name for id (an id Slack does not know, or Slack not reachable
// now); the view then shows the id.
type Names interface {
	Name(ctx context.Context, id string) string
}

// noNames names nobody: views show ids.
type noNames struct{}

func (noNames) Name(context.Context, string) string { return "" }

// nameOr is what n calls id, or id itself when n has no name for it.
func nameOr(ctx context.Context, n Names, id string) string {
	if id == "" {
		return ""
	}
	if name := n.Name(ctx, id); name != "" {
		return name
	}
	return id
}

// named is v with the names of its approvers beside their ids.
func named(ctx context.Context, n Names, v RequestView) RequestView {
	v.ApproverName = nameOr(ctx, n, v.Approver)
	v.ApproverNames = nil
	for _, id := range v.Approvers {
		v.ApproverNames = append(v.ApproverNames, nameOr(ctx, n, id))
	}
	return v
}

// show is r as its caller sees it, with names.
func (s *Server) show(ctx context.Context, r *approval.Request) RequestView {
	return named(ctx, s.names, view(r))
}
