// The Vercel AI SDK's Anthropic provider against the gateway's /v1/messages: a tool loop.
import { createAnthropic } from "@ai-sdk/anthropic";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const anthropic = createAnthropic({ baseURL: BASE_URL, apiKey: GATEWAY_KEY });
  const executed = [];
  const result = await generateText({
    model: anthropic(MODEL),
    maxRetries: 0,
    prompt: "What is the weather in Paris?",
    tools: {
      weather: tool({
        description: "The weather in a city",
        inputSchema: z.object({ city: z.string() }),
        execute: async ({ city }) => {
          executed.push(city);
          return { city, celsius: 18 };
        },
      }),
    },
    stopWhen: stepCountIs(5),
  });
  return { text: result.text, steps: result.steps.length, executed };
});
