// The Vercel AI SDK: generateText with a tool and a multi-step loop (stopWhen), on the default
// Responses provider (`openai(model)`) or on Chat Completions (API=chat); with CONVERSATION set,
// on a stored conversation (`providerOptions.openai.conversation`).
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const openai = createOpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY });
  const model = process.env.API === "chat" ? openai.chat(MODEL) : openai(MODEL);
  const executed = [];
  const result = await generateText({
    model,
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
    ...(process.env.CONVERSATION
      ? { providerOptions: { openai: { conversation: process.env.CONVERSATION } } }
      : {}),
  });
  return {
    text: result.text,
    steps: result.steps.length,
    executed,
    finishReason: result.finishReason,
    toolCalls: result.steps.flatMap((s) => s.toolCalls.map((c) => [c.toolCallId, c.toolName])),
  };
});
