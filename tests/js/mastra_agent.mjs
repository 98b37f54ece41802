// Mastra: an Agent with a tool on the AI SDK's Chat Completions provider, asked twice, the
// second time with the first run's messages (a chat kept by the app). Mastra sends the first
// run's tool steps back merged into one assistant message holding every call, the results
// after it.
import { Agent } from "@mastra/core/agent";
import { createTool } from "@mastra/core/tools";
import { createOpenAI } from "@ai-sdk/openai";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const openai = createOpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY });
  const weather = createTool({
    id: "weather",
    description: "The weather in a city",
    inputSchema: z.object({ city: z.string() }),
    execute: async ({ city }) => ({ city, celsius: city === "Paris" ? 18 : 12 }),
  });
  const agent = new Agent({
    id: "weather-agent",
    name: "weather-agent",
    instructions: "Answer about the weather.",
    model: openai.chat(MODEL),
    tools: { weather },
  });
  const question = { role: "user", content: "Weather in Paris and London?" };
  const first = await agent.generate([question], { maxSteps: 5 });
  const messages = [question, ...first.response.messages, { role: "user", content: "And Rome?" }];
  const second = await agent.generate(messages, { maxSteps: 5 });
  return { texts: [first.text, second.text], steps: [first.steps.length, second.steps.length] };
});
