// The Vercel AI SDK: generateObject with a zod schema (structured output), on the default
// Responses provider.
import { createOpenAI } from "@ai-sdk/openai";
import { generateObject } from "ai";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const openai = createOpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY });
  const { object } = await generateObject({
    model: openai(MODEL),
    maxRetries: 0,
    schema: z.object({ city: z.string(), country: z.string() }),
    schemaName: "place",
    prompt: "Name a capital city.",
  });
  return { object };
});
