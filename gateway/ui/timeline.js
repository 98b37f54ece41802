// The gateway's admin UI: a conversation over time, every turn and each of its upstream attempts
// as a bar on one time axis, with time to first token, duration, tokens, cost and tool calls
// (an ES module of the page; no build step).

import { h } from './dom.js';
import { ZONE, fmtInt, fmtMs, fmtTime, fmtUsd, plural, shortId } from './format.js';
import { attemptTiming, attemptsOf } from './trajectory.js';
import { badge, turnBadge } from './widgets.js';

const MINUTE = 60000;
const HOUR = 60 * MINUTE;
const DAY = 24 * HOUR;
const TICK_STEPS_MS = [
  1,
  2,
  5,
  10,
  20,
  50,
  100,
  200,
  500,
  1000,
  2000,
  5000,
  10000,
  15000,
  30000,
  MINUTE,
  2 * MINUTE,
  5 * MINUTE,
  10 * MINUTE,
  15 * MINUTE,
  30 * MINUTE,
  HOUR,
  2 * HOUR,
  6 * HOUR,
  12 * HOUR,
  DAY,
  2 * DAY,
  7 * DAY,
  14 * DAY,
  28 * DAY,
];

export function fmtSpan(ms) {
  // A session may go on for days: past a minute, in minutes, hours and days.
  if (ms === null || ms === undefined || ms < MINUTE) return fmtMs(ms);
  const whole = Math.round(ms / 1000);
  const [d, h, m, s] = [
    Math.floor(whole / 86400),
    Math.floor(whole / 3600) % 24,
    Math.floor(whole / 60) % 60,
    whole % 60,
  ];
  if (d) return h ? `${d} d ${h} h` : `${d} d`;
  if (h) return m ? `${h} h ${m} min` : `${h} h`;
  return s ? `${m} min ${s} s` : `${m} min`;
}

function toolCalls(attempt) {
  // The tool calls the attempt's answer made (an answer that failed keeps what it delivered).
  const payload = attempt.message || attempt.event?.payload;
  const blocks = payload?.content || payload?.delivered?.content || [];
  return blocks.filter((b) => b.type === 'tool_call').map((b) => b.name || '?');
}

function tokensOf(usage) {
  return usage ? (usage.prompt_tokens || 0) + (usage.completion_tokens || 0) : null;
}

export function turnSpan(turn, attempts, now) {
  // From the turn's first event (its input) to its turn/end; one still open, to now.
  const start = turn.events[0].created_at * 1000;
  const ends = attempts.map((a) => a.timing.end).filter((v) => v !== null);
  const end = turn.end ? turn.end.created_at * 1000 : Math.max(now, ...ends);
  const starts = attempts.map((a) => a.timing.start).filter((v) => v !== null);
  // An attempt's start is its end less its duration: the clocks of the two differ by a little.
  return { start: Math.min(start, ...starts), end: Math.max(end, ...ends) };
}

export function groupTurns(events) {
  // A conversation's events, turn by turn in their order: each with its events and its end.
  const turns = [];
  const byId = new Map();
  for (const event of events) {
    let turn = byId.get(event.turn_id);
    if (!turn) {
      turn = { id: event.turn_id, conversation_id: event.conversation_id, events: [], end: null };
      byId.set(event.turn_id, turn);
      turns.push(turn);
    }
    turn.events.push(event);
    if (event.type === 'turn/end') turn.end = event;
  }
  return turns;
}

export function axisRow(span) {
  // The time axis over `span` ms from the first start, in about six round steps.
  const step = TICK_STEPS_MS.find((s) => span / s <= 6) || TICK_STEPS_MS[TICK_STEPS_MS.length - 1];
  const ticks = [];
  for (let t = 0; t <= span; t += step) ticks.push(t);
  return h(
    'div',
    { class: 'tl-row tl-axis-row', 'aria-hidden': 'true' },
    h('div', { class: 'tl-label' }),
    h(
      'div',
      { class: 'tl-axis' },
      ticks.map((t) =>
        h('span', {
          class: t / span > 0.85 ? 'tl-tick tl-tick-end' : 'tl-tick',
          style: { left: `${(t / span) * 100}%` },
          text: `+${fmtSpan(t)}`,
        }),
      ),
    ),
  );
}

export function timelineView(root, conversationId, turns, usageById) {
  const now = Date.now();
  const rows = turns.map((turn, index) => {
    const attempts = attemptsOf(turn, usageById).map((attempt) => ({
      ...attempt,
      timing: attemptTiming(attempt),
    }));
    return { turn, index, attempts, ...turnSpan(turn, attempts, now) };
  });
  const box = h('div', { class: 'session-timeline', 'data-testid': 'session-timeline' });
  if (!rows.length) {
    root.append(h('div', { class: 'empty', text: 'No turns yet.' }));
    return;
  }
  const origin = Math.min(...rows.map((r) => r.start));
  const finish = Math.max(...rows.map((r) => r.end));
  const span = Math.max(finish - origin, 1);
  const at = (ms) => ((ms - origin) / span) * 100;
  const widthOf = (from, to) => Math.max(((to - from) / span) * 100, 0.4);

  const all = rows.flatMap((r) => r.attempts);
  const cost = all.reduce((sum, a) => sum + (a.usage?.cost_usd || 0), 0);
  const tokens = all.reduce((sum, a) => sum + (tokensOf(a.usage) || 0), 0);
  const tools = all.reduce((sum, a) => sum + toolCalls(a).length, 0);
  box.append(
    h(
      'p',
      { class: 'tl-summary', 'data-testid': 'timeline-summary' },
      `${plural(rows.length, 'turn')} · ${plural(all.length, 'attempt')} over ${fmtSpan(span)} from ${fmtTime(origin / 1000)} (${ZONE}) · ${fmtInt(tokens)} tokens · ${fmtUsd(cost)} · ${plural(tools, 'tool call')}`,
    ),
  );

  box.append(axisRow(span));

  for (const row of rows) {
    const { turn, index, attempts } = row;
    const end = turn.end?.payload;
    const inherited = turn.conversation_id !== conversationId;
    const turnTools = attempts.flatMap(toolCalls);
    const turnTokens = attempts.reduce((sum, a) => sum + (tokensOf(a.usage) || 0), 0);
    const turnCost = attempts.reduce((sum, a) => sum + (a.usage?.cost_usd || 0), 0);
    const duration = row.end - row.start;
    box.append(
      h(
        'div',
        {
          class: 'tl-row tl-turn',
          'data-testid': 'tl-turn',
          'data-turn-id': turn.id,
          'data-start-ms': Math.round(row.start - origin),
          'data-duration-ms': Math.round(duration),
        },
        h(
          'div',
          { class: 'tl-label' },
          h(
            'div',
            { class: 'tl-name' },
            h('strong', { text: `Turn ${index + 1}` }),
            ' ',
            h('code', { class: 'muted', title: turn.id, text: shortId(turn.id) }),
            ' ',
            turnBadge(turn, end, inherited),
            inherited ? badge('inherited', 'neutral') : null,
          ),
          h(
            'div',
            { class: 'tl-facts' },
            h('span', { 'data-testid': 'tl-offset', text: `+${fmtSpan(row.start - origin)}` }),
            h('span', { 'data-testid': 'tl-duration', text: fmtSpan(duration) }),
            h('span', { text: `${fmtInt(turnTokens)} tokens` }),
            h('span', { text: fmtUsd(turnCost) }),
            turnTools.length ? h('span', { text: plural(turnTools.length, 'tool call') }) : null,
          ),
        ),
        h(
          'div',
          { class: 'tl-track' },
          h('div', {
            class: `tl-bar tl-bar-turn tl-${end ? end.status : 'open'}`,
            'data-testid': 'tl-bar',
            style: { left: `${at(row.start)}%`, width: `${widthOf(row.start, row.end)}%` },
            title: `Turn ${index + 1}: ${fmtSpan(duration)}`,
          }),
        ),
      ),
    );

    for (const attempt of attempts) {
      const t = attempt.timing;
      const route = attempt.route || {};
      const usage = attempt.usage;
      const names = toolCalls(attempt);
      const outcome = attempt.outcome || 'error';
      const bar = [];
      if (t.start !== null && t.end !== null) {
        const ttft = t.ttft ?? null;
        // Waiting for the first token, then streaming: the two parts of one bar.
        bar.push(
          h(
            'div',
            {
              class: `tl-bar tl-attempt-bar tl-${outcome}`,
              'data-testid': 'tl-bar',
              style: { left: `${at(t.start)}%`, width: `${widthOf(t.start, t.end)}%` },
              title: `#${attempt.number} ${route.deployment || '?'}: ${fmtMs(t.duration)}${ttft !== null ? `, first token at ${fmtMs(ttft)}` : ''}`,
            },
            ttft !== null && t.duration
              ? h('div', {
                  class: 'tl-wait',
                  style: { width: `${Math.min(100, (ttft / t.duration) * 100)}%` },
                })
              : null,
          ),
        );
      }
      box.append(
        h(
          'div',
          {
            class: 'tl-row tl-attempt',
            'data-testid': 'tl-attempt',
            'data-attempt': attempt.number,
            'data-outcome': outcome,
            'data-deployment': route.deployment || '',
            'data-start-ms': t.start === null ? '' : Math.round(t.start - origin),
            'data-duration-ms': t.duration ?? '',
          },
          h(
            'div',
            { class: 'tl-label' },
            h(
              'div',
              { class: 'tl-name' },
              `#${attempt.number} `,
              h('strong', { text: route.deployment || '?' }),
              h('span', { class: 'muted', text: ` ${outcome}` }),
            ),
            h(
              'div',
              { class: 'tl-facts' },
              h('span', { 'data-testid': 'tl-ttft', text: `TTFT ${fmtMs(t.ttft)}` }),
              h('span', { 'data-testid': 'tl-duration', text: fmtMs(t.duration) }),
              h('span', {
                'data-testid': 'tl-tokens',
                text: usage
                  ? `${fmtInt(usage.prompt_tokens)} in · ${fmtInt(usage.completion_tokens)} out`
                  : '— tokens',
              }),
              h('span', { 'data-testid': 'tl-cost', text: usage ? fmtUsd(usage.cost_usd) : '—' }),
              names.length
                ? h('span', {
                    'data-testid': 'tl-tools',
                    title: names.join(', '),
                    text: `${plural(names.length, 'tool call')}: ${names.join(', ')}`,
                  })
                : null,
            ),
          ),
          h('div', { class: 'tl-track' }, bar),
        ),
      );
    }
  }
  box.append(
    h('p', {
      class: 'field-hint',
      text: "Each turn from its input to its end, each attempt from its start to its end (its paler part: waiting for the first token). Times from the gateway's clock; the axis is from the first turn.",
    }),
  );
  root.append(box);
}
