// Package agent is Countersign's tool-calling loop. It talks to any
// OpenAI-compatible chat completion endpoint through go-openai, checks every
// proposed tool call (unknown tool, malformed or out-of-schema arguments are
// refused, never executed), asks the gate whether a human must look, and
// either runs the call or turns it into an approval request and waits for
// the decision recorded in the store. Decisions come only from the store:
// never from chat text, the model or tool output.
//
// Runs are durable. The conversation, the step, the batch of calls in
// progress (with each call's state and request id) and the counts are
// checkpointed in Redis after every step, under a lease with a heartbeat.
// A process that starts adopts runs whose lease lapsed and resumes their
// waits; a decision made while nothing ran is honoured then. Execution is
// claim → run → finish, at most once; a call found claimed without an
// outcome is re-sent only for tools that are RetrySafe (HTTP tools carry an
// Idempotency-Key), otherwise reported as outcome unknown.
//
// The package owns no clients: cmd/countersign builds the model client, the
// store, the gate and the bot and passes them in Options. See docs/agent.md.
package agent
