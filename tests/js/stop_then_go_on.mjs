// openai-node as a chat UI that drops a partial answer when the user presses Stop. STEP=stop:
// stream the question, stop once CUT_AT characters arrived, print what was received. STEP=go_on:
// send the question and "Go on." (the partial answer left out, no conversation header), print
// the conversation it was recorded in and whether the history was repaired.
import OpenAI from "openai";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

const QUESTION = { role: "user", content: "Tell me a story." };

run(async () => {
  const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  if (process.env.STEP === "stop") {
    const { data: stream, response } = await client.chat.completions
      .create({ model: MODEL, stream: true, messages: [QUESTION] })
      .withResponse();
    let received = "";
    for await (const chunk of stream) {
      received += chunk.choices[0]?.delta?.content ?? "";
      if (received.length >= Number(process.env.CUT_AT)) break;
    }
    return { received, conversationId: response.headers.get("x-conversation-id") };
  }
  const { data: completion, response } = await client.chat.completions
    .create({ model: MODEL, messages: [QUESTION, { role: "user", content: "Go on." }] })
    .withResponse();
  return {
    text: completion.choices[0].message.content,
    conversationId: response.headers.get("x-conversation-id"),
    repaired: response.headers.get("x-gateway-history-repaired"),
  };
});
