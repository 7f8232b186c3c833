// test.mjs: runs the example once against Countersign (COUNTERSIGN_URL,
// COUNTERSIGN_API_KEY) and a model API (OPENAI_BASE_URL). A person decides
// the card meanwhile. Its last line on stdout is {"ran": [arguments the
// tool ran with], "output": the agent's final answer}; exit 0 on success.
import { mkdtemp, rm } from "node:fs/promises";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { setTracingDisabled } from "@openai/agents";
import { refundAgent, runWithCountersign } from "./agent.mjs";

setTracingDisabled(true);
const ran = [];
const agent = refundAgent(async (args) => {
  ran.push(args);
  return `refund of ${args.amount} for order ${args.order_id} created`;
});
const dir = await mkdtemp(join(tmpdir(), "countersign-openai-agents-"));
try {
  const result = await runWithCountersign(agent, "Order 1234 arrived damaged; refund it.", { stateFile: join(dir, "run-state.json") });
  console.log(JSON.stringify({ ran, output: String(result.finalOutput ?? "") }));
} finally {
  await rm(dir, { recursive: true, force: true });
}
