// The gateway's admin UI: a conversation's trajectory, each turn's attempts as the gateway made
// them, with a replay of each recorded stream (an ES module of the page; no build step).

import { clear, h } from './dom.js';
import { fmtInt, fmtMs, fmtTime, fmtUsd, shortId } from './format.js';
import { onLeave } from './router.js';
import { badge, icon, metaItem, statusBadge, turnBadge } from './widgets.js';

export function attemptsOf(turn, usageById) {
  const attempts = new Map();
  const get = (number) => {
    if (!attempts.has(number)) attempts.set(number, { number, events: [] });
    return attempts.get(number);
  };
  for (const event of turn.events) {
    const p = event.payload;
    if (
      event.type === 'assistant/attempt' ||
      (event.type === 'assistant/message' && p.source !== 'client')
    ) {
      const attempt = get(p.attempt || attempts.size + 1);
      attempt.event = event;
      attempt.route = p.route || {};
      attempt.stream = p.stream || [];
      attempt.providerUsage = p.usage;
      if (event.type === 'assistant/attempt')
        attempt.outcome = p.reason === 'empty_prefix' ? 'cancelled' : 'error';
      else attempt.outcome = p.interrupted ? 'cancelled' : 'completed';
      attempt.reason = p.reason;
      attempt.message = event.type === 'assistant/message' ? p : null;
      for (const segment of p.segments || []) {
        if (segment.attempt !== attempt.number) get(segment.attempt).continued = true;
      }
    } else if (event.type === 'request/error') {
      const attempt = get(p.attempt || attempts.size);
      attempt.error = event;
      attempt.route = attempt.route || p.route || {};
    }
  }
  for (const attempt of attempts.values()) {
    attempt.usage = usageById.get(`${turn.id}:${attempt.number}`) || null;
  }
  return [...attempts.values()].sort((a, b) => a.number - b.number);
}

function expandStream(records) {
  // gateway.stream.compact.expand: every delta with its time (ms from the attempt's start).
  const out = [];
  for (const record of records || []) {
    if (Array.isArray(record.parts)) {
      let t = record.t0;
      record.parts.forEach((part, i) => {
        if (i) t += record.dt[i - 1];
        out.push({ t, kind: record.type, index: record.index, text: part, name: record.name });
      });
    } else {
      out.push({ t: record.t, kind: record.type, index: record.index, record });
    }
  }
  return out;
}

function streamSpan(records) {
  const deltas = expandStream(records);
  const first = deltas.find((d) => d.text !== undefined);
  return {
    first: first ? first.t : null,
    last: deltas.length ? deltas[deltas.length - 1].t : null,
  };
}

export function trajectoryView(root, conversationId, turns, usageById) {
  const list = h('div', { class: 'trajectory', 'data-testid': 'trajectory' });
  turns.forEach((turn, index) => {
    list.append(trajectoryTurn(conversationId, turn, index, usageById));
  });
  if (!turns.length) list.append(h('div', { class: 'empty', text: 'No turns yet.' }));
  root.append(list);
}

export function attemptTiming(attempt) {
  // Wall-clock end: when the event recording the attempt was written; start: end - duration.
  const span = streamSpan(attempt.stream);
  const duration = attempt.usage?.duration_ms ?? span.last;
  const ttft = attempt.usage?.ttft_ms ?? span.first;
  const recorded = (attempt.event || attempt.error)?.created_at;
  const end = recorded !== undefined ? recorded * 1000 : null;
  const start = end !== null && duration !== null && duration !== undefined ? end - duration : end;
  return { start, end, duration, ttft, lastDelta: span.last };
}

function trajectoryTurn(conversationId, turn, index, usageById) {
  const attempts = attemptsOf(turn, usageById);
  const end = turn.end?.payload;
  const turnStart = turn.events[0].created_at * 1000;
  const timings = attempts.map(attemptTiming);
  const origin = Math.min(turnStart, ...timings.map((t) => t.start).filter((v) => v !== null));
  const finish = Math.max(
    turn.end ? turn.end.created_at * 1000 : origin,
    ...timings.map((t) => t.end).filter((v) => v !== null),
  );
  const span = Math.max(finish - origin, 1);
  const metered = end?.metered;

  const lanes = h(
    'div',
    { class: 'timeline', 'data-testid': 'timeline' },
    h(
      'div',
      { class: 'timeline-axis' },
      h('span', { text: '0 ms' }),
      h('span', { text: fmtMs(span) }),
    ),
    attempts.map((attempt, i) => {
      const t = timings[i];
      const left = t.start === null ? 0 : ((t.start - origin) / span) * 100;
      const width =
        t.start === null || t.end === null ? 0 : Math.max(((t.end - t.start) / span) * 100, 0.6);
      const lane = h(
        'div',
        { class: 'lane' },
        h(
          'div',
          { class: 'lane-label' },
          `#${attempt.number} `,
          h('strong', { text: attempt.route.deployment || '?' }),
        ),
        h(
          'div',
          { class: 'lane-track' },
          h('div', {
            class: `lane-bar lane-${attempt.outcome || 'error'}`,
            style: { left: `${left}%`, width: `${width}%` },
            title: `${attempt.outcome}: ${fmtMs(t.duration)}`,
          }),
          t.ttft !== null && t.ttft !== undefined && t.start !== null
            ? h('div', {
                class: 'lane-mark',
                style: { left: `${((t.start + t.ttft - origin) / span) * 100}%` },
                title: `first token at ${fmtMs(t.ttft)}`,
              })
            : null,
        ),
      );
      return lane;
    }),
  );

  const cards = attempts.map((attempt, i) => attemptCard(turn, attempt, timings[i]));
  return h(
    'article',
    { class: 'traj-turn', 'data-turn-id': turn.id },
    h(
      'header',
      { class: 'turn-head' },
      h('span', { class: 'turn-number', text: `Turn ${index + 1}` }),
      h('code', { class: 'muted', title: turn.id, text: shortId(turn.id) }),
      h('span', { class: 'muted', text: fmtTime(turn.events[0].created_at) }),
      turnBadge(turn, end, turn.conversation_id !== conversationId),
      end?.reason ? h('span', { class: 'muted', text: end.reason.replace(/_/g, ' ') }) : null,
      turn.conversation_id !== conversationId ? badge('inherited', 'neutral') : null,
    ),
    h(
      'div',
      { class: 'traj-summary' },
      summaryStat('Attempts', String(attempts.length)),
      summaryStat('Duration', end ? fmtMs(end.duration_ms) : '—'),
      summaryStat(
        'Tokens',
        metered
          ? `${fmtInt(metered.prompt_tokens)} in · ${fmtInt(metered.completion_tokens)} out`
          : end?.usage
            ? `${fmtInt(end.usage.prompt_tokens)} in · ${fmtInt(end.usage.completion_tokens)} out`
            : '—',
      ),
      summaryStat('Delivered', metered ? `${fmtInt(metered.completion_delivered)} tokens` : '—'),
      summaryStat('Cost', metered ? fmtUsd(metered.cost_usd) : '—'),
      summaryStat('turn/end', turn.end ? `seq ${turn.end.seq}` : 'not yet'),
    ),
    attempts.length
      ? lanes
      : h('p', { class: 'muted', text: 'No upstream attempt: this turn only recorded input.' }),
    h('div', { class: 'attempts' }, cards),
  );
}

function summaryStat(label, value) {
  return h(
    'div',
    { class: 'stat-mini' },
    h('span', { class: 'stat-mini-label', text: label }),
    h('span', { class: 'stat-mini-value', text: value }),
  );
}

function attemptCard(_turn, attempt, timing) {
  const route = attempt.route || {};
  const outcome = attempt.outcome || 'error';
  const usage = attempt.usage;
  const error = attempt.error?.payload;
  const life = [['started', 0]];
  if (timing.ttft !== null && timing.ttft !== undefined) life.push(['first token', timing.ttft]);
  if (attempt.message) life.push(['delivered', timing.lastDelta]);
  life.push([
    outcome === 'cancelled' ? 'cancelled' : outcome === 'completed' ? 'completed' : 'error',
    timing.duration,
  ]);
  const replayBox = h('div', { class: 'replay', hidden: true, 'data-testid': 'replay' });
  const hasStream = (attempt.stream || []).some((r) => Array.isArray(r.parts));
  const card = h(
    'div',
    {
      class: `attempt attempt-${outcome}`,
      'data-testid': 'attempt',
      'data-attempt': attempt.number,
      'data-outcome': outcome,
      'data-deployment': route.deployment || '',
    },
    h(
      'div',
      { class: 'attempt-head' },
      h('span', { class: 'attempt-number', text: `Attempt ${attempt.number}` }),
      statusBadge(outcome === 'cancelled' ? 'cancelled' : outcome),
      h(
        'span',
        { class: 'attempt-route' },
        h('strong', { text: route.deployment || '?' }),
        h('span', { class: 'muted', text: ` · ${route.provider || '?'} · ${route.model || '?'}` }),
      ),
      attempt.continued ? badge('continued by a later attempt', 'info') : null,
      attempt.event
        ? h('span', { class: 'seq', text: `${attempt.event.type} #${attempt.event.seq}` })
        : null,
    ),
    h(
      'ol',
      { class: 'lifecycle' },
      life.map(([label, t]) =>
        h(
          'li',
          { class: `life-${label.replace(' ', '-')}` },
          h('span', { class: 'life-label', text: label }),
          h('span', {
            class: 'life-time',
            text: t === null || t === undefined ? '—' : `+${fmtMs(t)}`,
          }),
        ),
      ),
    ),
    h(
      'dl',
      { class: 'attempt-facts' },
      metaItem('Time to first token', fmtMs(timing.ttft)),
      metaItem('Duration', fmtMs(timing.duration)),
      metaItem(
        'Tokens',
        usage
          ? `${fmtInt(usage.prompt_tokens)} in · ${fmtInt(usage.completion_tokens)} out · ${fmtInt(usage.completion_delivered)} delivered${usage.reasoning_tokens ? ` · ${fmtInt(usage.reasoning_tokens)} reasoning` : ''}${usage.cached_tokens ? ` · ${fmtInt(usage.cached_tokens)} cached` : ''}`
          : attempt.providerUsage
            ? `${fmtInt(attempt.providerUsage.prompt_tokens)} in · ${fmtInt(attempt.providerUsage.completion_tokens)} out`
            : '—',
      ),
      metaItem(
        'Usage source',
        usage ? usage.usage_source : attempt.providerUsage ? 'provider' : '—',
      ),
      metaItem('Cost', usage ? fmtUsd(usage.cost_usd) : '—'),
      attempt.reason && attempt.event && attempt.event.type === 'assistant/attempt'
        ? metaItem('Recorded as', `assistant/attempt (${attempt.reason})`)
        : null,
    ),
    error
      ? h(
          'div',
          { class: 'attempt-fail', 'data-testid': 'attempt-error' },
          h('strong', { text: `${error.status || ''} ${error.code || ''}`.trim() }),
          h('span', { text: ` ${error.message || ''}` }),
          h('span', {
            class: 'muted',
            text: ` · ${error.retryable ? 'retryable' : 'not retryable'} · request/error #${attempt.error.seq}`,
          }),
        )
      : null,
    hasStream
      ? h(
          'div',
          { class: 'attempt-actions' },
          h(
            'button',
            {
              class: 'btn btn-small',
              type: 'button',
              'data-testid': 'replay-button',
              onclick: () => replay(replayBox, attempt.stream, 1),
            },
            icon('play', 12, 'inline-icon'),
            'Replay stream',
          ),
          h(
            'button',
            {
              class: 'btn btn-small btn-ghost',
              type: 'button',
              onclick: () => replay(replayBox, attempt.stream, 4),
            },
            'at 4× speed',
          ),
        )
      : null,
    replayBox,
  );
  return card;
}

function replay(box, records, speed) {
  if (box._stop) box._stop();
  box.hidden = false;
  const deltas = expandStream(records).filter((d) => d.text !== undefined);
  const last = deltas.length ? deltas[deltas.length - 1].t : 0;
  const clock = h('span', { class: 'replay-clock', text: '0 ms' });
  const reasoning = h('div', { class: 'reasoning-text' });
  const text = h('div', { class: 'msg-text', 'data-testid': 'replay-text' });
  const tools = h('div', { class: 'code' });
  const stateLabel = h('span', { class: 'muted', text: `playing at ${speed}×` });
  clear(box).append(
    h('div', { class: 'replay-head' }, h('strong', { text: 'Replay' }), clock, stateLabel),
    reasoning,
    text,
    tools,
  );
  const begun = performance.now();
  let next = 0;
  let timer = null;
  let stopped = false;
  const tick = () => {
    const elapsed = (performance.now() - begun) * speed;
    while (next < deltas.length && deltas[next].t <= elapsed) {
      const d = deltas[next++];
      if (d.kind === 'reasoning') reasoning.textContent += d.text;
      else if (d.kind === 'tool_call') tools.textContent += d.text;
      else text.textContent += d.text;
    }
    clock.textContent = `${fmtMs(Math.min(elapsed, last))} / ${fmtMs(last)}`;
    if (next >= deltas.length) {
      stateLabel.textContent = `finished: ${deltas.length} deltas at their recorded times`;
      box.dataset.done = 'true';
      return;
    }
    if (!stopped)
      timer = setTimeout(tick, Math.min(50, Math.max(0, (deltas[next].t - elapsed) / speed)));
  };
  delete box.dataset.done;
  box._stop = () => {
    stopped = true;
    clearTimeout(timer);
  };
  onLeave(box._stop);
  tick();
}
