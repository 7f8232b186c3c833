// Package slacksim is an in-process fake Slack workspace.
//
// It serves the parts of the Slack Web API, Socket Mode and HTTP event
// delivery that Countersign's bot uses, closely enough that the real
// github.com/slack-go/slack client (pointed at [Workspace.APIURL]) and its
// socketmode package cannot tell the difference in the cases we care about:
// tokens are checked, the bot must be a channel member to post, Block Kit
// limits are enforced, trigger_ids are single use and expire after three
// seconds, ephemeral messages are private, rate limits answer HTTP 429 with
// Retry-After, and every envelope must be acknowledged.
//
// The same Workspace backs the browser demo: [Workspace.Handler] serves a
// Slack-like web page at "/" that lets a person act as any seeded user,
// with live updates over Server-Sent Events.
//
// Tests and the demo seed a workspace with [Workspace.AddUser],
// [Workspace.AddChannel], [Workspace.AddUsergroup] and
// [Workspace.JoinChannel], act as people with [Workspace.PostMessage],
// [Workspace.Click], [Workspace.SubmitView], [Workspace.SlashCommand] and
// [Workspace.OpenHome], and inspect the result with [Workspace.Messages],
// [Workspace.Ephemerals], [Workspace.OpenViews], [Workspace.CallLog] and
// [Workspace.WaitFor].
//
// Time is injected through [Options.Now]; nothing in the package needs a
// test to sleep. The package imports nothing else of Countersign's.
package slacksim
