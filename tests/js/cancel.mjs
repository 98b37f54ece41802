// Cancel a stream mid-answer, one way per STYLE, once at least CUT_AT characters of text have
// arrived; print the text this client received. The gateway must record exactly that (or, for
// bytes that reached this process's socket but were not read, a longer prefix of the same
// answer: docs/recording.md, "Delivery levels").
import { createOpenAI } from "@ai-sdk/openai";
import Anthropic from "@anthropic-ai/sdk";
import { streamText } from "ai";
import OpenAI from "openai";
import { BASE_URL, GATEWAY_KEY, GATEWAY_URL, MODEL, run } from "./lib.mjs";

const CUT_AT = Number(process.env.CUT_AT);
const QUESTION = "Tell me a story.";
const messages = [{ role: "user", content: QUESTION }];

const styles = {
  // An AbortController's signal passed with the request, aborted from inside the loop.
  async abort_controller(client) {
    const controller = new AbortController();
    const stream = await client.chat.completions.create(
      { model: MODEL, stream: true, messages },
      { signal: controller.signal },
    );
    let received = "";
    try {
      for await (const chunk of stream) {
        received += chunk.choices[0]?.delta?.content ?? "";
        if (received.length >= CUT_AT) controller.abort();
      }
    } catch (error) {
      if (!(error instanceof OpenAI.APIUserAbortError)) throw error;
    }
    return received;
  },
  // The stream's own controller.
  async controller_abort(client) {
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, messages });
    let received = "";
    for await (const chunk of stream) {
      received += chunk.choices[0]?.delta?.content ?? "";
      if (received.length >= CUT_AT) stream.controller.abort();
    }
    return received;
  },
  // Leaving the for-await loop (the iterator's return() aborts the request).
  async break(client) {
    const stream = await client.chat.completions.create({ model: MODEL, stream: true, messages });
    let received = "";
    for await (const chunk of stream) {
      received += chunk.choices[0]?.delta?.content ?? "";
      if (received.length >= CUT_AT) break;
    }
    return received;
  },
  // The streaming helper's abort(), from its content event.
  async helper_abort(client) {
    const runner = client.chat.completions.stream({ model: MODEL, messages });
    let received = "";
    let aborted = false;
    runner.on("content", (delta) => {
      if (aborted) return;
      received += delta;
      if (received.length >= CUT_AT) {
        aborted = true;
        runner.abort();
      }
    });
    await runner.done().catch((error) => {
      if (!(error instanceof OpenAI.APIUserAbortError)) throw error;
    });
    return received;
  },
  // The Responses API, leaving the for-await loop.
  async responses_break(client) {
    const stream = await client.responses.create({ model: MODEL, stream: true, input: QUESTION });
    let received = "";
    for await (const event of stream) {
      if (event.type === "response.output_text.delta") received += event.delta;
      if (received.length >= CUT_AT) break;
    }
    return received;
  },
  // The Vercel AI SDK: streamText's abortSignal, on its default Responses provider.
  async vercel_abort() {
    const openai = createOpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY });
    const controller = new AbortController();
    let received = "";
    const result = streamText({
      model: openai(MODEL),
      maxRetries: 0,
      messages,
      abortSignal: controller.signal,
      onError: () => {},
    });
    try {
      for await (const delta of result.textStream) {
        received += delta;
        if (received.length >= CUT_AT) controller.abort();
      }
    } catch (error) {
      if (error?.name !== "AbortError") throw error;
    }
    return received;
  },
  // @anthropic-ai/sdk (the gateway's /v1/messages): the stream helper's abort().
  async anthropic_abort() {
    const client = new Anthropic({ baseURL: GATEWAY_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
    const stream = client.messages.stream({ model: MODEL, max_tokens: 500, messages });
    let received = "";
    let aborted = false;
    stream.on("text", (delta) => {
      if (aborted) return;
      received += delta;
      if (received.length >= CUT_AT) {
        aborted = true;
        stream.abort();
      }
    });
    await stream.done().catch((error) => {
      if (!(error instanceof Anthropic.APIUserAbortError)) throw error;
    });
    return received;
  },
};

run(async () => {
  const client = new OpenAI({ baseURL: BASE_URL, apiKey: GATEWAY_KEY, maxRetries: 0 });
  const received = await styles[process.env.STYLE](client);
  return { received };
});
