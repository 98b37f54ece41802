// Embeddings as JavaScript clients ask for them by default: openai-node sends
// `encoding_format: "base64"` unless told otherwise (and decodes the answer itself); the
// Vercel AI SDK's embedMany. MODELS: the aliases to ask, comma-separated.
import { createOpenAI } from "@ai-sdk/openai";
import { embedMany } from "ai";
import OpenAI from "openai";
import { BASE_URL, GATEWAY_KEY, run } from "./lib.mjs";

const INPUT = ["The food was delicious.", "The service was slow."];

run(async () => {
  const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  const openai = createOpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY });
  const result = {};
  for (const model of process.env.MODELS.split(",")) {
    const byDefault = await client.embeddings.create({ model, input: INPUT });
    const asFloat = await client.embeddings.create({
      model,
      input: INPUT,
      encoding_format: "float",
    });
    const vercel = await embedMany({
      model: openai.embedding(model),
      values: INPUT,
      maxRetries: 0,
    });
    result[model] = {
      byDefault: byDefault.data.map((d) => d.embedding),
      asFloat: asFloat.data.map((d) => d.embedding),
      vercel: vercel.embeddings,
    };
  }
  return result;
});
