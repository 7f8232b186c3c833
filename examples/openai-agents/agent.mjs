// agent.mjs: an OpenAI Agents SDK agent whose sensitive tool is approved
// in Slack through Countersign.
//
// The tool says needsApproval: the SDK stops the run with an interruption.
// approveWithCountersign asks Countersign for each interruption, keeps the
// run serialised (RunState) while a person decides, then resumes it with
// approve or reject. The tool itself claims the approved request before
// it runs (exactly one claim wins) and reports what came of it.
import { writeFile, readFile } from "node:fs/promises";
import { randomUUID } from "node:crypto";
import { Agent, RunState, run, tool } from "@openai/agents";
import { Countersign, CountersignError, why } from "../countersign.mjs";

const cs = new Countersign();

/** callID names a call for Countersign: unique per run, stable across retries. */
const callID = (runId, item) => `${runId}:${item.rawItem.callId}`;

/** countersigned wraps a tool's run: claim first, run with the approved arguments, report. */
export function countersigned(name, runTool) {
  return async (input, ctx, details) => {
    const runId = ctx?.context?.countersignRunId;
    // The same call id returns the same, approved, request.
    const r = await cs.request({ tool: name, arguments: input, callId: `${runId}:${details?.toolCall?.callId}`, runId });
    let claim;
    try {
      claim = await cs.claimWhenReady(r.id); // waits when the policy in force asks more approvals
    } catch (err) {
      if (err instanceof CountersignError && err.status === 409) return `Not run: ${err.message}`;
      throw err;
    }
    const args = claim.request.arguments; // an approver may have edited them
    try {
      const out = await runTool(args);
      await cs.result(r.id, claim.claim_token, "executed", String(out));
      return out;
    } catch (err) {
      await cs.result(r.id, claim.claim_token, "failed", String(err.message ?? err));
      throw err;
    }
  };
}

/**
 * runWithCountersign runs agent on input; each tool call that needs
 * approval goes to Countersign, the run waits serialised in stateFile,
 * and resumes with the decision.
 */
export async function runWithCountersign(agent, input, { stateFile, signal } = {}) {
  const context = { countersignRunId: randomUUID() };
  let result = await run(agent, input, { context });
  while (result.interruptions?.length > 0) {
    const asked = [];
    for (const item of result.interruptions) {
      const args = JSON.parse(item.arguments ?? "{}");
      asked.push({ item, request: await cs.request({ tool: item.name, arguments: args, callId: callID(context.countersignRunId, item), runId: context.countersignRunId }) });
    }
    // While a person decides, the run is a string: it could wait in a
    // database and resume in another process.
    await writeFile(stateFile, result.state.toString());
    const decided = [];
    for (const { request } of asked) {
      try {
        decided.push(await cs.decision(request, signal));
      } catch (err) {
        if (request.id) await cs.cancel(request.id).catch(() => {}); // withdrawn: the card says so
        throw err;
      }
    }
    const state = await RunState.fromString(agent, await readFile(stateFile, "utf8"));
    state.getInterruptions().forEach((item, i) => {
      const r = decided[i];
      if (r.status === "approved") state.approve(item);
      else state.reject(item, { message: why(r) });
    });
    result = await run(agent, state);
  }
  return result;
}

/** refundAgent is the example's agent: one tool, issue_refund, that needs approval. */
export function refundAgent(issueRefund) {
  const issue_refund = tool({
    name: "issue_refund",
    description: "Refund part or all of an order to the customer.",
    parameters: {
      type: "object",
      properties: { order_id: { type: "string" }, amount: { type: "number" }, reason: { type: "string" } },
      required: ["order_id", "amount", "reason"],
      additionalProperties: false,
    },
    strict: true,
    needsApproval: true,
    execute: countersigned("issue_refund", issueRefund),
  });
  return new Agent({ name: "Support", instructions: "You help customers with their orders.", model: "gpt-4.1-mini", tools: [issue_refund] });
}
