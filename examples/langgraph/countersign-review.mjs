// countersign-review.mjs: LangGraph's human-in-the-loop, answered in Slack
// through Countersign. The graph pauses in reviewNode with interrupt(), in
// the shape of LangChain's HumanInTheLoopMiddleware ({actionRequests} out,
// {decisions: [{type: "approve"} | {type: "edit", editedAction} |
// {type: "reject", message}]} back); review() computes that resume value
// from Countersign (propose, long poll); toolsNode claims each approved
// call before it runs and reports the result.
import { randomUUID } from "node:crypto";
import { Annotation, Command, MessagesAnnotation, interrupt } from "@langchain/langgraph";
import { AIMessage, ToolMessage } from "@langchain/core/messages";

/** ReviewState is MessagesAnnotation plus the Countersign request of each approved call. */
export const ReviewState = Annotation.Root({
  ...MessagesAnnotation.spec,
  approvals: Annotation({ reducer: (a, b) => ({ ...a, ...b }), default: () => ({}) }),
});

/** reviewNode pauses the graph until a person decided every tool call of the last AI message. */
export function reviewNode(state) {
  const last = state.messages.at(-1);
  const calls = last.tool_calls ?? [];
  const { decisions } = interrupt({
    actionRequests: calls.map((c) => ({ name: c.name, args: c.args, id: c.id })),
    reviewConfigs: calls.map((c) => ({ actionName: c.name, allowedDecisions: ["approve", "edit", "reject"] })),
  });
  const approvals = {};
  const refusals = [];
  const toolCalls = calls.map((c, i) => {
    const d = decisions[i];
    if (d.type === "reject") {
      refusals.push(new ToolMessage({ tool_call_id: c.id, name: c.name, content: d.message, status: "error" }));
      return c;
    }
    approvals[c.id] = d.requestId ?? "";
    return d.type === "edit" ? { ...c, args: d.editedAction.args } : c;
  });
  // The AI message keeps every call (with the edited arguments), so each
  // tool message answers one; same id: the reducer replaces it.
  const updated = new AIMessage({ id: last.id, content: last.content, tool_calls: toolCalls });
  const goto = Object.keys(approvals).length > 0 ? "tools" : "agent";
  return new Command({ goto, update: { messages: [updated, ...refusals], approvals } });
}

/** review asks Countersign about every action of an interrupt and returns the resume value. */
export async function review(cs, { actionRequests }, { runId }) {
  const decisions = await Promise.all(
    actionRequests.map(async (a) => {
      let r;
      try {
        r = await cs.ask({ tool: a.name, arguments: a.args, callId: `${runId}:${a.id}`, runId });
      } catch (err) {
        return { type: "reject", message: `Approval unavailable, the call did not run: ${err.message}` };
      }
      if (r.status !== "approved") return { type: "reject", message: cs.why(r) };
      if (r.edited) return { type: "edit", editedAction: { name: a.name, args: r.arguments }, requestId: r.id };
      return { type: "approve", requestId: r.id };
    }),
  );
  return { decisions };
}

/** toolsNode runs the approved calls not yet answered: claim, run, report. */
export function toolsNode(cs, tools) {
  const byName = Object.fromEntries(tools.map((t) => [t.name, t]));
  return async (state) => {
    const i = state.messages.findLastIndex((m) => AIMessage.isInstance(m) && m.tool_calls?.length);
    const ai = state.messages[i];
    const answered = new Set(state.messages.slice(i + 1).map((m) => m.tool_call_id));
    const out = [];
    for (const c of ai.tool_calls.filter((c) => !answered.has(c.id))) {
      try {
        const approved = { status: "approved", id: state.approvals[c.id] ?? "" };
        const output = await cs.run(approved, c.args, (args) => byName[c.name].invoke(args));
        out.push(new ToolMessage({ tool_call_id: c.id, name: c.name, content: String(output) }));
      } catch (err) {
        out.push(new ToolMessage({ tool_call_id: c.id, name: c.name, content: `Did not run: ${err.message}`, status: "error" }));
      }
    }
    return { messages: out };
  };
}

/** runUntilDone invokes the graph and answers each interrupt from Countersign. */
export async function runUntilDone(graph, cs, input, { threadId = randomUUID() } = {}) {
  const config = { configurable: { thread_id: threadId } };
  let out = await graph.invoke(input, config);
  while (out.__interrupt__?.length) {
    const resume = await review(cs, out.__interrupt__[0].value, { runId: threadId });
    out = await graph.invoke(new Command({ resume }), config);
  }
  return out;
}
