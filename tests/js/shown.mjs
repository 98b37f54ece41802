// A slow renderer with clients/js/gateway-shown.mjs, one SDK per STYLE: it renders PIECES pieces
// of text, says so (a `READY {json}` line), waits for the test's go on stdin (the gateway has
// recorded the whole answer as delivered), then the user presses Stop. Prints what it showed
// and the gateway's answer to the helper's report.
import { createInterface } from "node:readline";
import { createOpenAI } from "@ai-sdk/openai";
import Anthropic from "@anthropic-ai/sdk";
import { streamText } from "ai";
import OpenAI from "openai";
import { GatewayShown, trackShown } from "../../clients/js/gateway-shown.mjs";
import { BASE_URL, GATEWAY_KEY, GATEWAY_URL, MODEL, run } from "./lib.mjs";

const PIECES = Number(process.env.PIECES);
const QUESTION = "Three tips, please.";
const messages = [{ role: "user", content: QUESTION }];
const stdin = createInterface({ input: process.stdin })[Symbol.asyncIterator]();

// WATCH_REPORTS: the test sees each answer to the helper's report (`REPORT status`), and a
// turn_in_progress answer waits for its go, so that it can let the turn end in between.
if (process.env.WATCH_REPORTS) {
  const fetch = globalThis.fetch;
  globalThis.fetch = async (input, init) => {
    const response = await fetch(input, init);
    if (String(input).endsWith("/truncate")) {
      process.stdout.write(`REPORT ${response.status}\n`);
      if (response.status === 409) await stdin.next();
    }
    return response;
  };
}

/** The app has rendered PIECES pieces: tell the test, and wait until it says stop. */
async function readyToStop(response) {
  const conversationId = response.headers.get("x-conversation-id");
  process.stdout.write(`READY ${JSON.stringify({ conversationId })}\n`);
  await stdin.next();
}

/** Render pieces of an SDK stream (wrapped by trackShown) until PIECES, then stop. */
async function renderThenStop(stream, response, pieceOf) {
  let shown = "";
  let rendered = 0;
  for await (const item of stream) {
    const text = pieceOf(item);
    if (!text) continue;
    shown += text;
    rendered += 1;
    if (rendered === PIECES) {
      await readyToStop(response);
      break; // Stop: the helper reports before the loop goes on
    }
  }
  return { shown, truncation: stream.tracker.truncation };
}

const styles = {
  async openai_chat() {
    const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
    const { data, response } = await client.chat.completions
      .create({ model: MODEL, stream: true, messages })
      .withResponse();
    const stream = trackShown(data, response, client);
    return renderThenStop(stream, response, (chunk) => chunk.choices[0]?.delta?.content);
  },
  async openai_responses() {
    const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
    const { data, response } = await client.responses
      .create({ model: MODEL, stream: true, input: QUESTION })
      .withResponse();
    const stream = trackShown(data, response, client);
    return renderThenStop(stream, response, (event) =>
      event.type === "response.output_text.delta" ? event.delta : "",
    );
  },
  async anthropic() {
    const client = new Anthropic({ baseURL: GATEWAY_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
    const { data, response } = await client.messages
      .create({ model: MODEL, max_tokens: 200, stream: true, messages })
      .withResponse();
    const stream = trackShown(data, response, client);
    return renderThenStop(stream, response, (event) =>
      event.type === "content_block_delta" && event.delta.type === "text_delta"
        ? event.delta.text
        : "",
    );
  },
  // The stream helper's events, counted by hand: a piece is shown once rendered.
  async anthropic_events() {
    const client = new Anthropic({ baseURL: GATEWAY_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
    const stream = client.messages.stream({ model: MODEL, max_tokens: 200, messages });
    const { response } = await stream.withResponse();
    const shown = new GatewayShown({ apiKey: client.apiKey, manual: true }).attach(response);
    let text = "";
    let rendered = 0;
    await new Promise((stopPressed) => {
      stream.on("text", (delta) => {
        if (rendered === PIECES) return; // stopped: nothing more is rendered
        text += delta;
        shown.shown(delta);
        rendered += 1;
        if (rendered === PIECES) stopPressed();
      });
    });
    await readyToStop(response);
    stream.abort();
    await stream.done().catch((error) => {
      if (!(error instanceof Anthropic.APIUserAbortError)) throw error;
    });
    await shown.report();
    return { shown: text, truncation: shown.truncation };
  },
  // streamText with an AbortController: the app goes on reading after abort(), as the AI SDK
  // expects (it may still hand over pieces it had buffered, which the app renders), until the
  // stream ends; the helper reports then.
  async vercel() {
    const shown = new GatewayShown();
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, fetch: shown.fetch });
    const controller = new AbortController();
    const result = streamText({
      model: openai(MODEL),
      maxRetries: 0,
      messages,
      abortSignal: controller.signal,
      onAbort: shown.onAbort,
      onError: () => {},
    });
    let text = "";
    let rendered = 0;
    for await (const delta of shown.wrap(result.textStream)) {
      text += delta;
      rendered += 1;
      if (rendered === PIECES) {
        await readyToStop(shown.response);
        controller.abort();
      }
    }
    await shown.settled();
    return { shown: text, truncation: shown.truncation };
  },
};

run(async () => {
  try {
    return await styles[process.env.STYLE]();
  } finally {
    process.stdin.destroy(); // nothing more to read: let the process end
  }
});
