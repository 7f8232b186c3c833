package mcp

import (
	"context"
	"fmt"
	"maps"
	"slices"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/countersign/countersign/agent/api/client"
)

// This file: what the gateway lists of its upstreams (tools, resources,
// templates, prompts) and under which names.

// listTools (re)registers the upstream's tools on the gateway's server.
func (g *Gateway) listTools(ctx context.Context, up *upstream, cs *mcp.ClientSession) error {
	caps := cs.InitializeResult().Capabilities
	if caps == nil || caps.Tools == nil {
		return nil
	}
	var names []string
	var tools []*mcp.Tool
	for t, err := range cs.Tools(ctx, nil) {
		if err != nil {
			return fmt.Errorf("mcp upstream %s: list tools: %w", up.name, err)
		}
		tools = append(tools, t)
	}
	for _, t := range tools {
		exposed := *t
		exposed.Name = g.exposedName(up, t.Name)
		if exposed.InputSchema == nil {
			exposed.InputSchema = map[string]any{"type": "object"}
		}
		names = append(names, exposed.Name)
		g.server.AddTool(&exposed, g.gated(up, t))
	}
	g.mu.Lock()
	old := g.toolNames[up.name]
	g.toolNames[up.name] = names
	g.mu.Unlock()
	var gone []string
	for _, n := range old {
		if !slices.Contains(names, n) {
			gone = append(gone, n)
		}
	}
	if len(gone) > 0 {
		g.server.RemoveTools(gone...)
	}
	return nil
}

// listPassThrough registers the upstream's resources, resource templates
// and prompts, each read from the upstream that owns it once the API lets
// the read through (gatedRead, gatedPrompt), and removes those it no
// longer lists (it is called again when the upstream says its resources
// or prompts changed, and when it restarts).
func (g *Gateway) listPassThrough(ctx context.Context, up *upstream, cs *mcp.ClientSession) error {
	caps := cs.InitializeResult().Capabilities
	if caps == nil {
		return nil
	}
	now := &listed{prompts: map[string]string{}}
	read := g.gatedRead(up)
	if caps.Resources != nil {
		for r, err := range cs.Resources(ctx, nil) {
			if err != nil {
				return fmt.Errorf("mcp upstream %s: list resources: %w", up.name, err)
			}
			now.resources = append(now.resources, r.URI)
			g.server.AddResource(r, read)
		}
		for rt, err := range cs.ResourceTemplates(ctx, nil) {
			if err != nil {
				return fmt.Errorf("mcp upstream %s: list resource templates: %w", up.name, err)
			}
			now.templates = append(now.templates, rt.URITemplate)
			g.server.AddResourceTemplate(rt, read)
		}
	}
	if caps.Prompts != nil {
		for p, err := range cs.Prompts(ctx, nil) {
			if err != nil {
				return fmt.Errorf("mcp upstream %s: list prompts: %w", up.name, err)
			}
			name := p.Name
			exposed := *p
			exposed.Name = g.exposedName(up, name)
			now.prompts[exposed.Name] = name
			g.server.AddPrompt(&exposed, g.gatedPrompt(up, name))
		}
	}
	gone := g.relist(up, now)
	if len(gone.resources) > 0 {
		g.server.RemoveResources(gone.resources...)
	}
	if len(gone.templates) > 0 {
		g.server.RemoveResourceTemplates(gone.templates...)
	}
	if len(gone.prompts) > 0 {
		g.server.RemovePrompts(slices.Collect(maps.Keys(gone.prompts))...)
	}
	return nil
}

func (g *Gateway) exposedName(up *upstream, name string) string {
	if g.opts.Prefix {
		return up.name + Separator + name
	}
	return name
}

// annotations are the upstream tool's MCP hints as the API takes them;
// none at all is MCP's default (destructive, open-world).
func annotations(t *mcp.Tool) *client.Annotations {
	a := &client.Annotations{}
	if t.Annotations == nil {
		return a
	}
	ro := t.Annotations.ReadOnlyHint
	a.ReadOnly = &ro
	a.Destructive = t.Annotations.DestructiveHint
	a.OpenWorld = t.Annotations.OpenWorldHint
	return a
}
