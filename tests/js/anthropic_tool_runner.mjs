// @anthropic-ai/sdk: client.beta.messages.toolRunner(), a tool loop run to its end. The SDK
// sends each turn over a server-held message thread (`thread`) until the server says it
// cannot thread the request; then it sends the full history every turn.
import Anthropic from "@anthropic-ai/sdk";
import { betaTool } from "@anthropic-ai/sdk/helpers/beta/json-schema";
import { GATEWAY_KEY, GATEWAY_URL, MODEL, run } from "./lib.mjs";

run(async () => {
  const client = new Anthropic({ baseURL: GATEWAY_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  const executed = [];
  const weather = betaTool({
    name: "weather",
    description: "The weather in a city",
    inputSchema: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    run: async ({ city }) => {
      executed.push(city);
      return JSON.stringify({ city, celsius: 18 });
    },
  });
  const runner = client.beta.messages.toolRunner({
    model: MODEL,
    max_tokens: 200,
    messages: [{ role: "user", content: "What is the weather in Paris?" }],
    tools: [weather],
  });
  const final = await runner.runUntilDone();
  return {
    text: final.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
    stopReason: final.stop_reason,
    executed,
  };
});
