// test.mjs: run by cmd/countersign/examples_test.go against a real
// Countersign and a fake OpenAI-compatible model (see ../README.md, "The
// runner"). It asks the agent for a refund; the runner decides on the card.
// Prints one JSON line: the calls the tool ran with, and the model's answer.
import { streamText, tool, stepCountIs } from "ai";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";
import { Countersign } from "../countersign.mjs";
import { countersignApproval } from "./countersign-approval.mjs";

const ran = [];
const tools = {
  issue_refund: tool({
    description: "Refund an order",
    inputSchema: z.object({ order_id: z.string(), amount: z.number(), reason: z.string() }),
    execute: async (args) => {
      ran.push(args);
      return `refund of ${args.amount} for order ${args.order_id} created`;
    },
  }),
};

const openai = createOpenAI({ baseURL: process.env.OPENAI_BASE_URL, apiKey: process.env.OPENAI_API_KEY ?? "fake" });
const { toolApproval, guard } = countersignApproval(new Countersign());
const result = streamText({
  model: openai.chat("gpt-4.1-mini"),
  tools: guard(tools),
  toolApproval,
  stopWhen: stepCountIs(5),
  prompt: "Order 1234 arrived damaged; refund the customer 80 dollars.",
});
console.log(JSON.stringify({ ran, output: await result.text }));
