// openai-node: structured output with zodResponseFormat and chat.completions.parse.
import OpenAI from "openai";
import { zodResponseFormat } from "openai/helpers/zod";
import { z } from "zod";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  const Place = z.object({ city: z.string(), country: z.string() });
  const completion = await client.chat.completions.parse({
    model: MODEL,
    messages: [{ role: "user", content: "Name a capital city." }],
    response_format: zodResponseFormat(Place, "place"),
  });
  const message = completion.choices[0].message;
  return { parsed: message.parsed, content: message.content };
});
