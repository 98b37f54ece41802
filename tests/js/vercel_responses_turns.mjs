// The Vercel AI SDK's default Responses provider, two turns of a chat kept by the client
// (`messages`), with `store` on (its default: earlier output goes back as item_reference items)
// or off (STORE=false: sent inline).
import { createOpenAI } from "@ai-sdk/openai";
import { generateText } from "ai";
import { BASE_URL, GATEWAY_KEY, MODEL, run } from "./lib.mjs";

run(async () => {
  const sent = []; // the input items of each request, as the SDK sent them
  const openai = createOpenAI({
    baseURL: BASE_URL,
    apiKey: GATEWAY_KEY,
    fetch: async (url, init) => {
      sent.push(JSON.parse(init.body).input);
      return fetch(url, init);
    },
  });
  const store = process.env.STORE !== "false";
  const providerOptions = store ? {} : { openai: { store: false } };
  const messages = [{ role: "user", content: "Capital of the UK?" }];
  const turn = () =>
    generateText({ model: openai(MODEL), maxRetries: 0, messages, providerOptions });
  const first = await turn();
  messages.push(...first.response.messages, { role: "user", content: "And of France?" });
  const second = await turn();
  return {
    texts: [first.text, second.text],
    responseIds: [first.response.id, second.response.id],
    sent,
  };
});
