// The gateway's admin UI: a page of the conversation list on one time axis (a user's, a key's, a
// session's conversations: whatever the filters found), each conversation a row and each of its
// turns a bar from its input to its end, so what ran at once, what waited and what failed shows
// at a glance; a conversation's own Timeline tab has its attempts (an ES module of the page; no
// build step).

import { h } from './dom.js';
import { api, enc } from './api.js';
import { ZONE, fmtTime, fmtUsd, plural, shortId } from './format.js';
import { axisRow, fmtSpan, groupTurns, turnSpan } from './timeline.js';
import { errorBox, statusBadge } from './widgets.js';

const AT_ONCE = 6; // event reads in flight at a time: a page holds up to 100 conversations

async function eventsOf(conversations) {
  // Each conversation's events, or the error reading them.
  const read = new Array(conversations.length);
  let next = 0;
  const reader = async () => {
    while (next < conversations.length) {
      const at = next++;
      read[at] = await api(`/v1/conversations/${enc(conversations[at].id)}/events`).then(
        (r) => r.data,
        (error) => error,
      );
    }
  };
  await Promise.all(Array.from({ length: Math.min(AT_ONCE, conversations.length) }, reader));
  return read;
}

export async function listTimeline(conversations, link) {
  const now = Date.now();
  const read = await eventsOf(conversations);
  const rows = conversations.map((c, i) => {
    if (read[i] instanceof Error) return { c, error: read[i], turns: [], start: null };
    // Its own turns: a branch's inherited ones are its parent's, on the parent's row.
    const turns = groupTurns(read[i])
      .filter((turn) => turn.conversation_id === c.id)
      .map((turn) => ({ turn, ...turnSpan(turn, [], now) }));
    if (!turns.length) return { c, turns, start: null };
    return {
      c,
      turns,
      start: Math.min(...turns.map((t) => t.start)),
      end: Math.max(...turns.map((t) => t.end)),
    };
  });
  const timed = rows.filter((r) => r.start !== null).sort((a, b) => a.start - b.start);
  const box = h('div', { class: 'session-timeline list-timeline', 'data-testid': 'list-timeline' });
  if (!timed.length) {
    box.append(h('div', { class: 'empty', text: 'No turns to show.' }));
  } else {
    const origin = timed[0].start;
    const span = Math.max(Math.max(...timed.map((r) => r.end)) - origin, 1);
    const at = (ms) => ((ms - origin) / span) * 100;
    const widthOf = (from, to) => Math.max(((to - from) / span) * 100, 0.4);
    const turnCount = timed.reduce((sum, r) => sum + r.turns.length, 0);
    box.append(
      h(
        'p',
        { class: 'tl-summary', 'data-testid': 'list-timeline-summary' },
        `${plural(timed.length, 'conversation')} · ${plural(turnCount, 'turn')} over ${fmtSpan(span)} from ${fmtTime(origin / 1000)} (${ZONE})`,
      ),
      axisRow(span),
    );
    for (const { c, turns, start, end } of timed) {
      box.append(
        h(
          'div',
          {
            class: 'tl-row tl-conversation',
            'data-testid': 'tl-conversation',
            'data-conversation-id': c.id,
            'data-start-ms': Math.round(start - origin),
            'data-duration-ms': Math.round(end - start),
          },
          h(
            'div',
            { class: 'tl-label' },
            h(
              'div',
              { class: 'tl-name' },
              h('a', { href: link(c), text: c.preview || '(no user message)' }),
            ),
            h(
              'div',
              { class: 'tl-facts' },
              h('code', { title: c.id, text: shortId(c.id) }),
              statusBadge(c.status),
              h('span', { 'data-testid': 'tl-offset', text: `+${fmtSpan(start - origin)}` }),
              h('span', {
                'data-testid': 'tl-turns',
                text: `${plural(turns.length, 'turn')} over ${fmtSpan(end - start)}`,
              }),
              c.usage ? h('span', { text: fmtUsd(c.usage.cost_usd) }) : null,
            ),
          ),
          h(
            'div',
            { class: 'tl-track' },
            turns.map(({ turn, start: from, end: to }, index) => {
              const status = turn.end ? turn.end.payload.status : 'open';
              return h('div', {
                class: `tl-bar tl-bar-turn tl-${status}`,
                'data-testid': 'tl-bar',
                'data-status': status,
                'data-start-ms': Math.round(from - origin),
                'data-duration-ms': Math.round(to - from),
                style: { left: `${at(from)}%`, width: `${widthOf(from, to)}%` },
                title: `Turn ${index + 1} (${status === 'open' ? 'in progress' : status}): ${fmtSpan(to - from)} from +${fmtSpan(from - origin)}`,
              });
            }),
          ),
        ),
      );
    }
  }
  const left = rows.filter((r) => r.start === null);
  for (const { c, error } of left) {
    box.append(
      h(
        'div',
        { class: 'tl-row', 'data-testid': 'tl-conversation', 'data-conversation-id': c.id },
        h(
          'div',
          { class: 'tl-label' },
          h(
            'div',
            { class: 'tl-name' },
            h('a', { href: link(c), text: c.preview || '(no user message)' }),
          ),
        ),
        error ? errorBox(error) : h('div', { class: 'muted', text: 'No turns yet.' }),
      ),
    );
  }
  box.append(
    h('p', {
      class: 'field-hint',
      text: "The conversations of this page of the list, by their first turn; each turn from its input to its end (open ones to now). A conversation's own Timeline shows its attempts.",
    }),
  );
  return box;
}
