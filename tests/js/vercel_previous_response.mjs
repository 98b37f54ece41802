// The Vercel AI SDK's Responses provider, two turns of a tool loop (stopWhen), the second
// continuing the first by `providerOptions.openai.previousResponseId`: the SDK sends that same
// id with every step of the turn, the step's input growing by the calls and their outputs.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, stepCountIs, tool } from "ai";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const sent = []; // [previous_response_id, input] of each request, as the SDK sent them
  const openai = createOpenAI({
    baseURL: BASE_URL,
    apiKey: GATEWAY_KEY,
    fetch: async (url, init) => {
      const body = JSON.parse(init.body);
      sent.push([body.previous_response_id ?? null, body.input]);
      return fetch(url, init);
    },
  });
  const tools = {
    weather: tool({
      description: "The weather in a city",
      inputSchema: z.object({ city: z.string() }),
      execute: async ({ city }) => ({ city, celsius: city === "Paris" ? 18 : 12 }),
    }),
  };
  const turn = (prompt, previousResponseId) =>
    generateText({
      model: openai(MODEL),
      maxRetries: 0,
      prompt,
      tools,
      stopWhen: stepCountIs(5),
      ...(previousResponseId ? { providerOptions: { openai: { previousResponseId } } } : {}),
    });
  const first = await turn("What is the weather in Paris?");
  const second = await turn("And in London?", first.response.id);
  return {
    texts: [first.text, second.text],
    steps: [first.steps.length, second.steps.length],
    responseIds: [first.response.id, second.response.id],
    sent,
  };
});
