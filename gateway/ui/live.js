// The admin UI: a streaming turn's answer as its client has it, while it runs (an ES module of
// the page; no build step). Read from the gateway's live view, server-sent events read through
// fetch: an EventSource cannot send the key.

import { append, clear, h } from './dom.js';
import { request } from './api.js';
import { redraw } from './composer.js';
import { onLeave } from './router.js';
import { readEvents } from './sse.js';

// `render(blocks)`: the blocks as the Chat view draws an answer's. The box follows what the
// client has been delivered; when the turn ends the page is drawn again from the record.
export function liveAnswer(conversationId, turnId, render) {
  const body = h('div', { class: 'msg-text muted', text: 'Waiting for the first delivered text…' });
  const box = h(
    'div',
    { class: 'msg msg-assistant live-answer', 'data-testid': 'live-answer', 'aria-live': 'polite' },
    h(
      'div',
      { class: 'msg-role' },
      'Assistant',
      h('span', { class: 'muted', text: ' · as its client has it so far' }),
    ),
    body,
  );
  const stop = new AbortController();
  onLeave(() => stop.abort());
  follow(
    `/v1/conversations/${encodeURIComponent(conversationId)}/turns/${encodeURIComponent(turnId)}/live`,
    stop.signal,
    (name, data) => {
      if (name === 'answer') {
        clear(body);
        body.className = '';
        append(body, render(data.content));
      } else if (name === 'end') {
        stop.abort();
        redraw();
      } else if (name === 'elsewhere') {
        // Run by another replica (the page's own refresh shows its end): said, not waited for.
        body.textContent = 'The live answer is shown only by the replica running the turn.';
      }
    },
  ).catch(() => {
    if (!stop.signal.aborted) body.textContent = 'The live answer cannot be followed right now.';
  });
  return box;
}

async function follow(path, signal, onEvent) {
  const response = await request(path, { headers: { Accept: 'text/event-stream' }, signal });
  if (!response.ok) throw new Error(`live view: ${response.status}`);
  await readEvents(response, (name, data) => {
    onEvent(name, JSON.parse(data));
  });
}
