// countersign-approval.mjs: the Vercel AI SDK (ai 7) asks Countersign
// before a tool runs. countersignApproval(cs) gives the two pieces to pass
// to generateText / streamText / ToolLoopAgent:
//   toolApproval: proposes each call to Countersign and waits for a person;
//                 approved → "approved", anything else → "denied" with the
//                 approver's reason (the model reads it).
//   guard(tools): wraps each tool's execute so that it claims the request
//                 first (exactly one executor runs it), runs with the
//                 arguments the approver approved (an edit changes them) and
//                 reports the result to Countersign.
import { randomUUID } from "node:crypto";

export function countersignApproval(cs, { runId = randomUUID() } = {}) {
  const approved = new Map(); // toolCallId → the approved request

  const toolApproval = async ({ toolCall }) => {
    try {
      const r = await cs.ask({
        tool: toolCall.toolName,
        arguments: toolCall.input,
        callId: `${runId}:${toolCall.toolCallId}`,
        runId,
      });
      if (r.status !== "approved") return { type: "denied", reason: cs.why(r) };
      approved.set(toolCall.toolCallId, r);
      return { type: "approved" };
    } catch (err) {
      // Fail closed: no answer from Countersign is a "no".
      return { type: "denied", reason: `Approval unavailable, the call did not run: ${err.message}` };
    }
  };

  const guard = (tools) =>
    Object.fromEntries(
      Object.entries(tools).map(([name, t]) => [
        name,
        {
          ...t,
          execute: async (input, options) => {
            const r = approved.get(options.toolCallId);
            if (!r) throw new Error(`${name}: no approval from Countersign for call ${options.toolCallId}`);
            approved.delete(options.toolCallId);
            return cs.run(r, input, (args) => t.execute(args, options));
          },
        },
      ]),
    );

  return { toolApproval, guard };
}
