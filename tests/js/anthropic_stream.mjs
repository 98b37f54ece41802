// @anthropic-ai/sdk: a streamed message (the gateway's /v1/messages), read with the helper.
import Anthropic from "@anthropic-ai/sdk";
import { GATEWAY_KEY, GATEWAY_URL, MODEL, run } from "./lib.mjs";

run(async () => {
  const client = new Anthropic({ baseURL: GATEWAY_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  const stream = client.messages.stream({
    model: MODEL,
    max_tokens: 200,
    messages: [{ role: "user", content: "Say hello." }],
  });
  let deltas = "";
  stream.on("text", (text) => {
    deltas += text;
  });
  const message = await stream.finalMessage();
  return {
    deltas,
    text: message.content.filter((b) => b.type === "text").map((b) => b.text).join(""),
    stopReason: message.stop_reason,
  };
});
