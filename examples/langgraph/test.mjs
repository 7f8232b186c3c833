// test.mjs: run by cmd/countersign/examples_test.go against a real
// Countersign and a fake OpenAI-compatible model (see ../README.md, "The
// runner"). It asks the agent for a refund; the runner decides on the card.
// Prints one JSON line: the calls the tool ran with, and the model's answer.
import { END, MemorySaver, START, StateGraph } from "@langchain/langgraph";
import { ChatOpenAI } from "@langchain/openai";
import { tool } from "@langchain/core/tools";
import { z } from "zod";
import { Countersign } from "../countersign.mjs";
import { ReviewState, reviewNode, runUntilDone, toolsNode } from "./countersign-review.mjs";

const ran = [];
const issueRefund = tool(
  async (args) => {
    ran.push(args);
    return `refund of ${args.amount} for order ${args.order_id} created`;
  },
  {
    name: "issue_refund",
    description: "Refund an order",
    schema: z.object({ order_id: z.string(), amount: z.number(), reason: z.string() }),
  },
);

const cs = new Countersign();
const model = new ChatOpenAI({
  model: "gpt-4.1-mini",
  apiKey: process.env.OPENAI_API_KEY ?? "fake",
  configuration: { baseURL: process.env.OPENAI_BASE_URL },
}).bindTools([issueRefund]);

const graph = new StateGraph(ReviewState)
  .addNode("agent", async (state) => ({ messages: [await model.invoke(state.messages)] }))
  .addNode("review", reviewNode, { ends: ["tools", "agent"] })
  .addNode("tools", toolsNode(cs, [issueRefund]))
  .addEdge(START, "agent")
  .addConditionalEdges("agent", (s) => (s.messages.at(-1).tool_calls?.length ? "review" : END))
  .addEdge("tools", "agent")
  .compile({ checkpointer: new MemorySaver() });

const out = await runUntilDone(graph, cs, {
  messages: [{ role: "user", content: "Order 1234 arrived damaged; refund the customer 80 dollars." }],
});
console.log(JSON.stringify({ ran, output: String(out.messages.at(-1).content) }));
