// The gateway's admin UI: a conversation as the user saw it, turn by turn (an ES module of the
// page; no build step).

import { append, h } from './dom.js';
import { api, enc, isAdmin } from './api.js';
import { userContent } from './attachments.js';
import { composer, redraw } from './composer.js';
import { ZONE, fmtInt, fmtTime, plural, shortId, textOf } from './format.js';
import { liveAnswer } from './live.js';
import { folded, prettyJson, richText } from './markdown.js';
import { requestPanel } from './request.js';
import { go, href } from './router.js';
import { badge, errorBox, icon, notice, turnBadge } from './widgets.js';

function contentBlocks(blocks, { interrupted }) {
  const out = [];
  for (const block of blocks || []) {
    if (block.type === 'reasoning') {
      out.push(
        h(
          'details',
          { class: 'reasoning' },
          h('summary', {}, 'Reasoning'),
          h('div', { class: 'reasoning-text', text: block.text || '' }),
        ),
      );
    } else if (block.type === 'text' && interrupted) {
      // Exactly as delivered: the text, not a rendering of it.
      out.push(
        h('div', { class: 'msg-text', 'data-testid': 'assistant-text', text: block.text || '' }),
      );
    } else if (block.type === 'text') {
      out.push(folded(richText(block.text || ''), (block.text || '').length));
    } else if (block.type === 'tool_call') {
      out.push(
        h(
          'div',
          { class: 'tool-call' },
          h(
            'div',
            { class: 'tool-head' },
            icon('tool', 14, 'inline-icon'),
            'Tool call ',
            h('code', { text: block.name || '?' }),
            h('span', { class: 'muted', text: ` ${block.id || ''}` }),
          ),
          h('pre', { class: 'code', text: prettyJson(block.arguments) }),
        ),
      );
    } else {
      out.push(h('div', { class: 'muted' }, `[${block.type} block]`));
    }
  }
  if (interrupted && !out.length) out.push(h('div', { class: 'msg-text muted', text: '' }));
  return out;
}

function truncatesOf(turns) {
  // `assistant/truncate` events (the log as recorded): message seq -> the latest one.
  const out = new Map();
  for (const turn of turns) {
    for (const event of turn.events) {
      if (event.type === 'assistant/truncate') out.set(event.payload.message_seq, event);
    }
  }
  return out;
}

function cutBlocks(blocks, chars) {
  // gateway.conversations.derive.cut_blocks: what a client showed of `chars` code points.
  const kept = [];
  let left = chars;
  for (const block of blocks || []) {
    if (block.type === 'text') {
      const text = [...(block.text || '')];
      if (text.length > left) {
        if (left > 0) kept.push({ ...block, text: text.slice(0, left).join('') });
        return kept;
      }
      left -= text.length;
    }
    kept.push(block);
  }
  return kept;
}

function textLength(blocks) {
  return (blocks || [])
    .filter((b) => b.type === 'text')
    .reduce((n, b) => n + [...(b.text || '')].length, 0);
}

export function chatView(root, conversationId, turns, branches, lastAlias, requests) {
  const list = h('div', { class: 'chat', 'data-testid': 'chat' });
  const truncates = truncatesOf(turns);
  let inheritedShown = false;
  const toolCalls = new Map(); // id -> still without a result
  turns.forEach((turn, index) => {
    const inherited = turn.conversation_id !== conversationId;
    if (inherited && !inheritedShown) {
      inheritedShown = true;
      list.append(h('div', { class: 'divider', text: 'Inherited from the parent conversation' }));
    }
    if (!inherited && inheritedShown) {
      inheritedShown = false;
      list.append(h('div', { class: 'divider', text: 'This branch' }));
    }
    list.append(
      chatTurn(
        conversationId,
        turn,
        index,
        inherited,
        branches,
        toolCalls,
        truncates,
        requests.get(turn.id),
      ),
    );
  });
  // Tool calls still without a result at the end: model history closes them too.
  if (toolCalls.size && list.lastElementChild)
    append(list.lastElementChild, syntheticResults(toolCalls));
  if (!turns.length) list.append(h('div', { class: 'empty', text: 'No turns yet.' }));
  root.append(list);
  if (isAdmin()) root.append(composer(conversationId, turns, lastAlias));
}

function chatTurn(conversationId, turn, index, inherited, branches, toolCalls, truncates, request) {
  const box = h('article', {
    class: inherited ? 'turn inherited' : 'turn',
    'data-turn-id': turn.id,
  });
  const end = turn.end?.payload;
  const messages = [];
  let answered = false;
  for (const event of turn.events) {
    const p = event.payload;
    if (event.type === 'user/message') {
      messages.push(...syntheticResults(toolCalls));
      messages.push(
        h(
          'div',
          { class: 'msg msg-user', 'data-seq': event.seq },
          h(
            'div',
            { class: 'msg-role' },
            'User',
            p.name ? h('span', { class: 'muted', text: ` (${p.name})` }) : null,
            seqTag(event),
          ),
          userContent(p.content),
        ),
      );
    } else if (event.type === 'tool/result') {
      toolCalls.delete(p.tool_call_id);
      messages.push(
        h(
          'div',
          { class: p.synthetic ? 'msg msg-tool synthetic' : 'msg msg-tool', 'data-seq': event.seq },
          h(
            'div',
            { class: 'msg-role' },
            'Tool result ',
            p.synthetic ? badge('synthetic', 'warn') : null,
            h('code', { class: 'muted', text: ` ${p.tool_call_id || ''}` }),
            seqTag(event),
          ),
          folded(
            h('pre', { class: 'code', text: prettyJson(textOf(p.content)) }),
            textOf(p.content).length,
          ),
        ),
      );
    } else if (
      event.type === 'assistant/attempt' &&
      p.delivered &&
      (p.delivered.content || []).length
    ) {
      // A fault after part of the answer reached the client: the user saw this text, the model
      // never will (it stays in the attempt, outside model history).
      const route = p.route || {};
      messages.push(
        h(
          'div',
          {
            class: 'msg msg-assistant not-in-history',
            'data-seq': event.seq,
            'data-testid': 'delivered-attempt',
          },
          h(
            'div',
            { class: 'msg-role' },
            'Assistant',
            h('span', {
              class: 'muted',
              text: ` · ${route.deployment || ''} · attempt ${p.attempt || '?'}`,
            }),
            seqTag(event),
          ),
          contentBlocks(p.delivered.content, { interrupted: true }),
          h(
            'div',
            { class: 'stopped', role: 'note', 'data-testid': 'not-in-history' },
            h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '⚠'),
            'Failed after delivery',
            h('span', {
              class: 'stopped-detail',
              text: ` · the client was shown this text (${p.delivered.delivery === 'acked' ? 'acknowledged' : 'sent'}), then the attempt failed (${(p.reason || 'error').replace(/_/g, ' ')}); it is not in the model's history`,
            }),
          ),
        ),
      );
    } else if (event.type === 'assistant/truncate') {
      // Shown on the message it shortens.
    } else if (event.type === 'assistant/message') {
      messages.push(...syntheticResults(toolCalls));
      if (p.source !== 'client') messages.push(fallbackNote(conversationId, turn, p));
      answered = true;
      const route = p.route || {};
      const truncate = truncates.get(event.seq);
      const shownBlocks = truncate
        ? cutBlocks(p.content, truncate.payload.content_chars)
        : p.content;
      const stopped = p.interrupted
        ? h(
            'div',
            { class: 'stopped', 'data-testid': 'stopped-marker', role: 'note' },
            h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '■'),
            'Stopped',
            h('span', {
              class: 'stopped-detail',
              text: ` · ${end?.reason ? end.reason.replace(/_/g, ' ') : 'interrupted'}; only the delivered text is kept (${p.delivery === 'acked' ? 'acknowledged by the client' : 'sent to the client'})`,
            }),
          )
        : null;
      messages.push(
        h(
          'div',
          {
            class: p.interrupted ? 'msg msg-assistant interrupted' : 'msg msg-assistant',
            'data-seq': event.seq,
            'data-testid': 'assistant-message',
          },
          h(
            'div',
            { class: 'msg-role' },
            'Assistant',
            p.source === 'client'
              ? badge('from client history', 'neutral')
              : h('span', { class: 'muted', text: ` · ${route.deployment || ''}` }),
            seqTag(event),
          ),
          contentBlocks(shownBlocks, { interrupted: p.interrupted }),
          stopped,
          truncate
            ? h(
                'div',
                { class: 'stopped truncated', role: 'note', 'data-testid': 'truncated-marker' },
                h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '✂'),
                'Truncated',
                h('span', {
                  class: 'stopped-detail',
                  text: ` · the client showed ${plural(truncate.payload.content_chars, 'character')} of the ${fmtInt(textLength(p.content))} delivered (assistant/truncate #${truncate.seq}); the model's history keeps only those`,
                }),
              )
            : null,
        ),
      );
      for (const block of p.content || [])
        if (block.type === 'tool_call') toolCalls.set(block.id, true);
    }
  }
  if (!answered && end) {
    const errors = turn.events.filter((e) => e.type === 'request/error');
    const last = errors[errors.length - 1];
    if (errors.length > 1) messages.push(fallbackNote(conversationId, turn, null));
    if (end.status === 'error') {
      messages.push(
        h(
          'div',
          { class: 'msg msg-error' },
          h('div', { class: 'msg-role' }, 'Error', seqTag(turn.end)),
          h('div', {
            class: 'msg-text',
            text: last
              ? `${last.payload.status || ''} ${last.payload.code || ''}: ${last.payload.message}`
              : end.reason || 'The turn failed.',
          }),
        ),
      );
    } else if (end.status === 'aborted' && end.reason !== 'items_added') {
      messages.push(
        h(
          'div',
          { class: 'msg msg-assistant interrupted' },
          h('div', { class: 'msg-role' }, 'Assistant', seqTag(turn.end)),
          h(
            'div',
            { class: 'stopped', 'data-testid': 'stopped-marker' },
            h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '■'),
            'Stopped',
            h('span', { class: 'stopped-detail', text: ' · before anything was delivered' }),
          ),
        ),
      );
    }
  }
  if (!answered && !turn.end && !inherited) {
    // Still streaming: what its client has been delivered so far, as it grows.
    messages.push(
      liveAnswer(conversationId, turn.id, (blocks) => contentBlocks(blocks, { interrupted: true })),
    );
  }
  const started = turn.events[0] ? turn.events[0].created_at : null;
  const branchesHere = branches.filter((b) => {
    const seqs = turn.events.map((e) => e.seq);
    return b.parent_seq >= Math.min(...seqs) && b.parent_seq <= Math.max(...seqs);
  });
  const actions = h('div', { class: 'turn-actions' });
  if (turn.end && isAdmin()) {
    actions.append(
      h(
        'button',
        {
          class: 'btn btn-small',
          type: 'button',
          'data-testid': 'branch-here',
          title: `A new conversation whose history ends at seq ${turn.end.seq}`,
          onclick: async (event) => {
            const button = event.currentTarget;
            button.disabled = true;
            try {
              const branch = await api(`/v1/conversations/${enc(conversationId)}/branches`, {
                method: 'POST',
                body: { at_seq: turn.end.seq },
              });
              go(`/conversations/${enc(branch.id)}`);
            } catch (error) {
              button.disabled = false;
              actions.append(errorBox(error));
            }
          },
        },
        icon('branch', 14, 'inline-icon'),
        'Branch here',
      ),
    );
  }
  if (!turn.end && !inherited && isAdmin())
    actions.append(cancelButton(conversationId, turn.id, actions));
  append(
    box,
    h(
      'header',
      { class: 'turn-head' },
      h('span', { class: 'turn-number', text: `Turn ${index + 1}` }),
      h('span', { class: 'muted', title: ZONE, text: fmtTime(started) }),
      turnBadge(turn, end, inherited),
      branchesHere.length
        ? h(
            'span',
            { class: 'branch-note' },
            icon('branch', 14, 'inline-icon'),
            `${branchesHere.length} branch${branchesHere.length > 1 ? 'es' : ''} from here: `,
            branchesHere.map((b) =>
              h(
                'a',
                { href: href(`/conversations/${enc(b.id)}`) },
                h('code', { text: shortId(b.id) }),
              ),
            ),
          )
        : null,
      actions,
    ),
    messages,
    request ? requestPanel(turn, request) : null,
  );
  return box;
}

function cancelButton(conversationId, turnId, actions) {
  // Stops the request as its client's own cancel would: the turn ends interrupted, with what
  // the client had received, and the page drawn again shows it so.
  return h(
    'button',
    {
      class: 'btn btn-small btn-danger',
      type: 'button',
      'data-testid': 'cancel-turn',
      title: 'Stop this request upstream and end its turn',
      onclick: async (event) => {
        const button = event.currentTarget;
        button.disabled = true;
        button.textContent = 'Cancelling…';
        try {
          await api(`/v1/conversations/${enc(conversationId)}/turns/${enc(turnId)}/cancel`, {
            method: 'POST',
          });
          await redraw();
        } catch (error) {
          if (error.status === 409) {
            await redraw(); // it ended meanwhile, or is ending: shown as it is now
            return;
          }
          button.disabled = false;
          button.textContent = 'Cancel';
          actions.append(
            error.status === 404
              ? notice(
                  'No gateway process this one can reach is running this request: it may have ended just now, or run on a replica that shares no Redis with this one.',
                  'warn',
                )
              : errorBox(error),
          );
        }
      },
    },
    'Cancel',
  );
}

function syntheticResults(toolCalls) {
  // A tool call with no recorded result before the next message gets a synthetic one in model
  // history (derive): shown where it goes, marked.
  const out = [...toolCalls.keys()].map((callId) =>
    h(
      'div',
      { class: 'msg msg-tool synthetic', 'data-testid': 'synthetic-result' },
      h(
        'div',
        { class: 'msg-role' },
        'Tool result ',
        badge('synthetic', 'warn'),
        h('code', { class: 'muted', text: ` ${callId}` }),
      ),
      h('div', {
        class: 'msg-text',
        text: 'ABORTED_BEFORE_DISPATCH: no result was recorded, so model history carries this synthetic one.',
      }),
    ),
  );
  toolCalls.clear();
  return out;
}

function seqTag(event) {
  return h('span', {
    class: 'seq',
    title: `${event.type}, seq ${event.seq}`,
    text: `#${event.seq}`,
  });
}

function failureText(error) {
  const route = error.payload.route || {};
  const what = error.payload.status || (error.payload.code || 'an error').replace(/_/g, ' ');
  return `${route.deployment || route.model || 'a deployment'} failed with ${what}`;
}

function fallbackNote(conversationId, turn, answer) {
  // The attempts that failed before this answer (or before the turn gave up), said where the
  // answer is: "a failed with 529, answered by b"; the Trajectory tab has each attempt.
  const before = (e) => !answer || e.payload.attempt < answer.attempt;
  const errors = turn.events.filter((e) => e.type === 'request/error' && before(e));
  if (!errors.length) return null;
  const by = answer?.route?.deployment;
  const failed = errors.map(failureText);
  const again = by && errors.every((e) => e.payload.route?.deployment === by);
  let outcome = `answered by ${by || 'another deployment'}`;
  if (!answer) outcome = 'no attempt answered';
  else if (again) outcome = `retried, answered by ${by}`;
  return h(
    'div',
    { class: 'attempt-note', role: 'note', 'data-testid': 'fallback-note' },
    h('span', { class: 'attempt-note-icon', 'aria-hidden': 'true' }, '↻'),
    h('span', { text: `${failed.join('; ')}; ${outcome}. ` }),
    h(
      'a',
      { href: href(`/conversations/${enc(conversationId)}`, { view: 'trajectory' }) },
      'Each attempt in Trajectory',
    ),
  );
}
