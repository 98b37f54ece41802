// The gateway's admin UI: the composer that continues a conversation as a client would (an ES
// module of the page; no build step).

import { append, clear, h } from './dom.js';
import { ApiError, api, enc, errorOf, request } from './api.js';
import { go, refreshInPlace } from './router.js';
import { readEvents } from './sse.js';
import { errorBox, field, select } from './widgets.js';

export async function redraw() {
  // The page drawn again in place (a live refresh, a cancel): a half-typed message stays.
  const draft = document.querySelector('[data-testid=composer-input]')?.value;
  await refreshInPlace();
  const input = document.querySelector('[data-testid=composer-input]');
  if (input && draft) input.value = draft;
}

export function composer(conversationId, turns, lastAlias) {
  const box = h('section', { class: 'panel composer', 'data-testid': 'composer' });
  const text = h('textarea', {
    name: 'message',
    rows: 3,
    placeholder: 'Continue this conversation…',
    'aria-label': 'Message',
    'data-testid': 'composer-input',
  });
  const model = select('model', [], '');
  const send = h(
    'button',
    { class: 'btn btn-primary', type: 'submit', 'data-testid': 'composer-send' },
    'Send',
  );
  const stop = h(
    'button',
    { class: 'btn btn-danger', type: 'button', hidden: true, 'data-testid': 'composer-stop' },
    'Stop',
  );
  const output = h('div', { class: 'composer-output' });
  api('/v1/models')
    .then((r) => {
      const ids = r.data.map((m) => m.id);
      append(
        model,
        ids.map((id) => h('option', { value: id }, id)),
      );
      model.value = ids.includes(lastAlias) ? lastAlias : ids[0] || '';
    })
    .catch((error) => output.append(errorBox(error)));
  let controller = null;
  stop.addEventListener('click', () => controller?.abort());
  const form = h(
    'form',
    {
      class: 'composer-form',
      onsubmit: async (event) => {
        event.preventDefault();
        const content = text.value.trim();
        if (!content) return;
        clear(output);
        send.disabled = true;
        stop.hidden = false;
        controller = new AbortController();
        const answer = h('div', { class: 'msg-text', 'data-testid': 'composer-answer' });
        const status = h('div', { class: 'composer-status muted', text: 'Sending…' });
        output.append(
          h(
            'div',
            { class: 'msg msg-user' },
            h('div', { class: 'msg-role', text: 'User' }),
            h('div', { class: 'msg-text', text: content }),
          ),
          h(
            'div',
            { class: 'msg msg-assistant' },
            h('div', { class: 'msg-role', text: 'Assistant' }),
            answer,
          ),
          status,
        );
        let target = conversationId;
        try {
          const history = await api(`/v1/conversations/${enc(conversationId)}/messages`);
          const before = turns.filter((t) => t.conversation_id === conversationId && t.end).length;
          const response = await request('/v1/chat/completions', {
            method: 'POST',
            headers: { 'X-Conversation-Id': conversationId, Accept: 'text/event-stream' },
            body: {
              model: model.value,
              stream: true,
              messages: [...history.data, { role: 'user', content }],
            },
            signal: controller.signal,
          });
          if (!response.ok) throw await errorOf(response);
          target = response.headers.get('X-Conversation-Id') || conversationId;
          status.textContent = `Streaming from ${response.headers.get('X-Gateway-Deployment') || 'the gateway'}…`;
          await readStream(response, (delta) => {
            answer.textContent += delta;
          });
          status.textContent = 'Recording the turn…';
          await waitForTurns(target, target === conversationId ? before + 1 : 1);
          text.value = '';
          go(`/conversations/${enc(target)}`);
        } catch (error) {
          if (error.name === 'AbortError') {
            status.textContent = 'Stopped: the gateway records what reached this page.';
            const own = turns.filter((t) => t.conversation_id === conversationId && t.end).length;
            await waitForTurns(target, target === conversationId ? own + 1 : 1).catch(() => {});
            go(`/conversations/${enc(target)}`);
          } else {
            status.remove();
            output.append(errorBox(error));
          }
        } finally {
          send.disabled = false;
          stop.hidden = true;
          controller = null;
        }
      },
    },
    text,
    h(
      'div',
      { class: 'composer-row' },
      field('Model', model),
      h('div', { class: 'composer-buttons' }, stop, send),
    ),
  );
  box.append(
    h('h2', { class: 'panel-title' }, 'Continue as the master key'),
    h('p', {
      class: 'field-hint composer-hint',
      text: "Sends this conversation's model history and your message to /v1/chat/completions with X-Conversation-Id, as a client would, and streams the answer here.",
    }),
    form,
    output,
  );
  return box;
}

async function readStream(response, onText) {
  await readEvents(response, (_event, data) => {
    if (data === '[DONE]') return true;
    let chunk;
    try {
      chunk = JSON.parse(data);
    } catch {
      return false;
    }
    if (chunk.error)
      throw new ApiError(0, chunk.error.message || 'The stream failed.', chunk.error.code);
    const delta = chunk.choices?.[0]?.delta;
    if (delta?.content) onText(delta.content);
    return false;
  });
}

async function waitForTurns(conversationId, count) {
  for (let i = 0; i < 50; i++) {
    const events = await api(`/v1/conversations/${enc(conversationId)}/events`);
    const own = events.data.filter(
      (e) => e.type === 'turn/end' && e.conversation_id === conversationId,
    );
    if (own.length >= count) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
