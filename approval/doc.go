// Package approval is Countersign's domain: proposed tool calls, approval
// requests and decisions, the policy that decides whether a human must look,
// the gate that applies it, and the audit entry format with its hash chain.
//
// It knows nothing of Slack, Redis or OpenAI. Adapters (store, bot, agent)
// implement or consume the small interfaces they declare and exchange the
// plain types defined here.
package approval
