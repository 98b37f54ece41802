// openai-node: a streaming chat completion, read to the end.
import OpenAI from "openai";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  const { data: stream, response } = await client.chat.completions
    .create({
      model: MODEL,
      stream: true,
      messages: [{ role: "user", content: "Capital of the UK?" }],
    })
    .withResponse();
  let text = "";
  let chunks = 0;
  let finish = null;
  for await (const chunk of stream) {
    chunks += 1;
    const choice = chunk.choices[0];
    text += choice?.delta?.content ?? "";
    finish = choice?.finish_reason ?? finish;
  }
  return { text, chunks, finish, conversationId: response.headers.get("x-conversation-id") };
});
