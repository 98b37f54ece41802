// Tell the gateway how much of a streamed answer your app showed, so the model remembers that.
//
// The gateway records what reached the client's socket. An app that renders slowly (Markdown,
// speech) has often received more than it showed when the user pressed Stop. These helpers
// count the text the app took (or, with `manual: true`, what it says it showed) and report it
// to `POST /v1/conversations/{id}/turns/{turn_id}/truncate` (docs/clients.md):
//
//   const { data, response } = await client.chat.completions
//     .create({ model, messages, stream: true }).withResponse();
//   const stream = trackShown(data, response, client); // `client`: for its apiKey
//   for await (const chunk of stream) {
//     render(chunk);
//     if (stopPressed()) break; // reports what was shown before the loop goes on
//   }
//
// openai-node (chat completions and Responses streams), @anthropic-ai/sdk (`messages.create`
// with `stream: true`) and the Vercel AI SDK (`streamText`: `fetch` and `onAbort` below). No
// dependencies; needs a global `fetch` (Node 18+, browsers). Against a server that is not the
// gateway (no `X-Gateway-Turn-Id`), nothing is reported.

// A turn is recorded as ended a moment after its stream closes (the gateway first learns what
// the client's socket acknowledged); until then the truncate answers `409 turn_in_progress`.
const END_WAIT_MS = 15_000;
const AUTH_HEADERS = ["authorization", "x-api-key", "api-key"];

/** The gateway refused the report: `status` and `body` are its answer. */
export class ShownReportError extends Error {
  constructor(status, body) {
    super(`truncate answered ${status}: ${body?.error?.message ?? JSON.stringify(body)}`);
    this.name = "ShownReportError";
    this.status = status;
    this.body = body;
  }
}

/** Code points, as the gateway counts (a string's length counts UTF-16 units). */
function chars(text) {
  let count = 0;
  for (const _ of text) count += 1;
  return count;
}

/**
 * The answer text a stream item carries, as the gateway counts it: a chat chunk's first
 * choice, an Anthropic text delta, a Responses output text delta, or a string (the AI SDK's
 * `textStream`). Reasoning does not count.
 */
export function textOf(item) {
  if (typeof item === "string") return item;
  if (item?.type === "content_block_delta") {
    return item.delta?.type === "text_delta" ? item.delta.text : "";
  }
  if (item?.type === "response.output_text.delta") return item.delta ?? "";
  // Chat chunks: the gateway records the first choice only.
  const choice = item?.choices?.find((c) => c.index === 0);
  return choice?.delta?.content ?? "";
}

/** One answer's count of what was shown, and its report. */
export class GatewayShown {
  /**
   * @param {{apiKey?: string, manual?: boolean}} [options] `apiKey` (an SDK client has one,
   *   so the client itself will do) goes with the report, unless `fetch` below saw the
   *   request's own key; `manual`: count only what `shown()` is given.
   */
  constructor({ apiKey, manual = false } = {}) {
    this.manual = manual;
    this.receivedChars = 0; // code points of answer text the SDK handed to the app
    this.shownChars = 0;
    this.response = null; // the answer's HTTP response: its headers name the turn
    this.truncation = null; // the gateway's answer to the report
    this.authHeaders = apiKey ? { authorization: `Bearer ${apiKey}` } : {};
    this.reporting = null;
    this.aborted = false;
    this.wrapping = false;
    // For the AI SDK: pass as the provider's `fetch` and as `streamText`'s `onAbort`.
    this.fetch = this.fetch.bind(this);
    this.onAbort = () => {
      this.aborted = true;
      // A wrapped stream may still hand the app pieces the SDK had buffered: its end reports.
      if (!this.wrapping) this.report().catch(() => {}); // settled() shows a failure
    };
  }

  /** The answer's response (from `withResponse()`), whose headers name its turn. */
  attach(response) {
    this.response = response;
    return this;
  }

  /** Count `text` as shown (with `manual: true`; otherwise every piece taken counts). */
  shown(text) {
    this.shownChars += chars(text);
  }

  took(item) {
    const count = chars(textOf(item));
    this.receivedChars += count;
    if (!this.manual) this.shownChars += count;
  }

  /**
   * A `fetch` for an SDK's options (`createOpenAI({ fetch })`): it attaches the answer's
   * response and keeps the request's key for the report. One answer per GatewayShown.
   */
  async fetch(input, init) {
    const response = await globalThis.fetch(input, init);
    const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : {}));
    for (const name of AUTH_HEADERS) {
      if (headers.has(name)) this.authHeaders[name] = headers.get(name);
    }
    this.attach(response);
    return response;
  }

  /**
   * Iterate an SDK stream, counting what the app takes. Leaving the loop early (break,
   * return, throw) reports; so does its end after an abort (`onAbort`), or with less shown
   * than received.
   */
  async *wrap(stream) {
    let finished = false;
    let failed = false;
    this.wrapping = true;
    try {
      for await (const item of stream) {
        this.took(item);
        yield item;
      }
      finished = true;
    } catch (error) {
      failed = true;
      throw error;
    } finally {
      this.wrapping = false;
      if (!finished || this.aborted || this.shownChars < this.receivedChars) {
        // The app's own error is the one to see; the report is still made.
        const reporting = this.report();
        await (failed ? reporting.catch(() => null) : reporting);
      }
    }
  }

  /**
   * Report what was shown (once; later calls return the same promise): the gateway's answer
   * (the text it now records is its `content`), or null when the response names no turn.
   */
  report() {
    this.reporting ??= this.#send();
    return this.reporting;
  }

  /** The report's outcome if one was made (onAbort), else null. */
  settled() {
    return this.reporting ?? Promise.resolve(null);
  }

  async #send() {
    const headers = this.response?.headers;
    const conversationId = headers?.get("x-conversation-id");
    const turnId = headers?.get("x-gateway-turn-id");
    if (!conversationId || !turnId) return null;
    // The gateway's API root is where the SDK's own request went: .../v1/chat/completions,
    // .../v1/responses, .../v1/messages.
    const url = new URL(this.response.url);
    const at = url.pathname.lastIndexOf("/v1/");
    if (at < 0) return null;
    const root = url.pathname.slice(0, at + "/v1".length);
    url.pathname = `${root}/conversations/${encodeURIComponent(conversationId)}/turns/${encodeURIComponent(turnId)}/truncate`;
    url.search = "";
    const request = {
      method: "POST",
      headers: { ...this.authHeaders, "content-type": "application/json" },
      body: JSON.stringify({ content_chars: this.shownChars }),
    };
    const deadline = Date.now() + END_WAIT_MS;
    let delay = 50;
    for (;;) {
      const answer = await globalThis.fetch(url, request);
      const body = await answer.json().catch(() => null);
      const inProgress = answer.status === 409 && body?.error?.code === "turn_in_progress";
      if (inProgress && Date.now() + delay < deadline) {
        await new Promise((resolve) => setTimeout(resolve, delay));
        delay = Math.min(delay * 2, 500);
        continue;
      }
      if (answer.status !== 200) throw new ShownReportError(answer.status, body);
      this.truncation = body;
      return body;
    }
  }
}

/**
 * An SDK stream (`data` of `withResponse()`) that counts what the app takes and reports on an
 * early exit; its `tracker` is the GatewayShown (`shown()`, `truncation`, `report()`).
 */
export function trackShown(stream, response, options) {
  const tracker = new GatewayShown(options).attach(response);
  const iterable = tracker.wrap(stream);
  iterable.tracker = tracker;
  return iterable;
}
