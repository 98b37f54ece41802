// The gateway's admin UI: usage over time, top spenders, rates and budgets (an ES module of the
// page; no build step).

import { clear, h } from './dom.js';
import { autoRefresh } from './autorefresh.js';
import { api, errorOf, isAdmin, names, ownTeamName, query, request, session } from './api.js';
import { budgetsPanel, ownBudgetPanel } from './budgets.js';
import { meter, stackedBars } from './charts.js';
import {
  fmtCompact,
  fmtInt,
  fmtMs,
  fmtPct,
  fmtUsd,
  pad,
  plural,
  shortId,
  utcDay,
} from './format.js';
import { applySoon, go } from './router.js';
import { errorBox, field, loading, pageHeader, panel, select, stat, table } from './widgets.js';

const PALETTE = [
  '#3b5bdb',
  '#12b886',
  '#f08c00',
  '#e64980',
  '#7048e8',
  '#1098ad',
  '#74b816',
  '#f03e3e',
  '#868e96',
];
// Rows a table of groups shows until asked for the rest: 344 users' rows are no one's reading.
const TOP = 20;
// The tables shown whole, by the report they show: kept while the page refreshes itself, not
// carried to another range or grouping.
const shownWhole = new Set();
const RANGES = {
  '24h': { seconds: 86400, granularity: 'hour', label: 'Last 24 hours' },
  '7d': { seconds: 7 * 86400, granularity: 'day', label: 'Last 7 days' },
  '30d': { seconds: 30 * 86400, granularity: 'day', label: 'Last 30 days' },
  month: { granularity: 'day', label: 'This month (UTC)' },
  'last-month': { granularity: 'day', label: 'Last month (UTC)' },
};

function rangeBounds(range, now) {
  // [from, to) in Unix seconds; months are UTC calendar months, as budgets count them.
  const d = new Date(now * 1000);
  if (range === 'month')
    return [Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000, Math.ceil(now)];
  if (range === 'last-month') {
    return [
      Date.UTC(d.getUTCFullYear(), d.getUTCMonth() - 1, 1) / 1000,
      Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000,
    ];
  }
  return [Math.floor(now - RANGES[range].seconds), Math.ceil(now)];
}

export async function usagePage(root, params) {
  const groupBy = params.get('group_by') || 'model';
  // `tag:<key>`: by the values of one key of the requests' metadata (`tag:` alone: none named yet).
  const tagKey = groupBy.startsWith('tag:') ? groupBy.slice(4) : null;
  const fromDate = params.get('from') || '';
  const toDate = params.get('to') || '';
  const custom = Boolean(fromDate || toDate);
  const range = custom ? 'custom' : RANGES[params.get('range')] ? params.get('range') : '24h';
  const granularity = params.get('granularity') || (custom ? 'day' : RANGES[range].granularity);
  const team = isAdmin() ? params.get('team_id') || '' : '';
  const now = Date.now() / 1000;
  // Dates are UTC days, as the usage API reads them; `to` takes in the whole of its day.
  const [presetFrom, presetTo] = custom
    ? [Math.floor(now - 31 * 86400), Math.ceil(now)]
    : rangeBounds(range, now);
  const from = fromDate ? utcDay(fromDate) : presetFrom;
  const to = toDate ? utcDay(toDate) + 86400 : presetTo;
  const rangeLabel = custom
    ? `${fromDate || 'last 31 days'} to ${toDate || 'now'} (UTC)`
    : RANGES[range].label;
  const usageQuery = { group_by: groupBy, granularity, from, to, team_id: team };
  // The report as its URL names it: a preset range's bounds move on with the clock.
  const reportKey = params.toString();
  root.append(
    pageHeader(
      'Usage',
      isAdmin()
        ? "Spend and tokens over time, from every attempt's usage record (GET /v1/usage)."
        : `Team ${ownTeamName()}'s spend and tokens (read-only).`,
      autoRefresh('usage'),
    ),
  );
  const [teams, keys] = isAdmin()
    ? await Promise.all([
        api('/v1/gateway/teams').then((r) => r.data),
        api('/v1/gateway/keys').then((r) => r.data),
      ])
    : [[], []];
  // Names instead of raw ids where the master key can read them.
  const { teams: teamNames, keys: keyNames } = names(teams, keys);
  const nameOf = (g) => {
    if (g === '(none)' || g === 'other') return g;
    if (groupBy === 'team' && teamNames.has(g)) return `${teamNames.get(g)} (${g})`;
    if (groupBy === 'key' && keyNames.has(g)) return `${keyNames.get(g)} (${shortId(g)})`;
    return g;
  };
  const form = h(
    'form',
    { class: 'filters' },
    h(
      'div',
      { class: 'filter-grid' },
      field(
        'Group by',
        select(
          'group_by',
          [
            ['model', 'Model'],
            ['deployment', 'Deployment'],
            ['team', 'Team'],
            ['key', 'Key'],
            ['user', 'User'],
            ['tag', 'Metadata tag'],
          ],
          tagKey === null ? groupBy : 'tag',
          { 'data-testid': 'usage-group-by' },
        ),
      ),
      tagKey === null
        ? null
        : field(
            'Tag key',
            h('input', {
              name: 'tag',
              value: tagKey,
              placeholder: 'project',
              'data-testid': 'usage-tag-key',
            }),
          ),
      field(
        'Range',
        select(
          'range',
          [...Object.entries(RANGES).map(([k, v]) => [k, v.label]), ['custom', 'Custom dates']],
          range,
        ),
      ),
      field('From (UTC)', h('input', { type: 'date', name: 'from', value: fromDate })),
      field('To (UTC)', h('input', { type: 'date', name: 'to', value: toDate })),
      field(
        'Granularity',
        select(
          'granularity',
          [
            ['hour', 'Hour'],
            ['day', 'Day'],
          ],
          granularity,
        ),
      ),
      isAdmin()
        ? field(
            'Team',
            select(
              'team_id',
              [['', 'All teams'], ...teams.map((t) => [t.id, `${t.name} (${t.id})`])],
              team,
            ),
          )
        : null,
    ),
    h(
      'div',
      { class: 'filter-actions' },
      h(
        'button',
        {
          class: 'btn btn-small',
          type: 'button',
          'data-testid': 'usage-csv',
          onclick: (event) =>
            download(event.currentTarget, `/v1/usage${query({ ...usageQuery, format: 'csv' })}`),
        },
        'Export CSV',
      ),
      h(
        'button',
        {
          class: 'btn btn-small',
          type: 'button',
          'data-testid': 'requests-csv',
          onclick: (event) =>
            download(
              event.currentTarget,
              `/v1/usage/requests${query({ from, to, team_id: team, format: 'csv' })}`,
            ),
        },
        'Export requests (CSV)',
      ),
      h(
        'button',
        {
          class: 'btn btn-small btn-ghost',
          type: 'button',
          'data-testid': 'requests-jsonl',
          onclick: (event) =>
            download(
              event.currentTarget,
              `/v1/usage/requests${query({ from, to, team_id: team, format: 'jsonl' })}`,
            ),
        },
        'Requests (JSON Lines)',
      ),
      h('span', {
        class: 'field-hint',
        text: 'The report as shown (GET /v1/usage), or every request of the range one by one with its tokens, cost and prices (GET /v1/usage/requests).',
      }),
    ),
  );
  form.addEventListener('change', (event) =>
    applySoon(() => {
      const data = Object.fromEntries(new FormData(form).entries());
      if (data.group_by === 'tag') data.group_by = `tag:${(data.tag || '').trim()}`;
      delete data.tag;
      if (event.target.name === 'range') {
        if (data.range === 'custom') {
          data.from = new Date(from * 1000).toISOString().slice(0, 10);
        } else {
          data.from = '';
          data.to = '';
          data.granularity = RANGES[data.range].granularity;
        }
      }
      if (data.from || data.to) delete data.range;
      go('/usage', data);
    }, event.target),
  );
  form.addEventListener('submit', (event) => event.preventDefault());
  const body = h('div', {}, loading());
  root.append(panel(null, form), body);

  if (tagKey === '') {
    clear(body);
    body.append(
      h('div', {
        class: 'empty',
        'data-testid': 'usage-tag-wanted',
        text: "Name a metadata key to group by: a key of the requests' metadata, such as project.",
      }),
    );
    return;
  }
  const latencyGroup = ['model', 'deployment', 'team', 'key', 'user'].includes(groupBy)
    ? groupBy
    : 'model';
  const [report, latency] = await Promise.all([
    api(`/v1/usage${query(usageQuery)}`),
    api(`/v1/usage/latency${query({ group_by: latencyGroup, from, to, team_id: team })}`).catch(
      (error) => error,
    ),
  ]);
  const rows = report.data;
  clear(body);
  const COUNTS = [
    'requests',
    'attempts',
    'failed_attempts',
    'interrupted',
    'errors',
    'unpriced_requests',
  ];
  const totals = rows.reduce(
    (acc, r) => {
      acc.cost += r.cost_usd || 0;
      acc.prompt += r.prompt_tokens || 0;
      acc.completion += r.completion_tokens || 0;
      acc.delivered += r.completion_delivered || 0;
      for (const name of COUNTS) acc[name] += r[name] || 0;
      return acc;
    },
    {
      cost: 0,
      prompt: 0,
      completion: 0,
      delivered: 0,
      ...Object.fromEntries(COUNTS.map((n) => [n, 0])),
    },
  );
  body.append(
    h(
      'div',
      { class: 'stats', 'data-testid': 'usage-totals' },
      stat(
        'Spend',
        fmtUsd(totals.cost),
        totals.unpriced_requests
          ? `${rangeLabel} · ${plural(totals.unpriced_requests, 'request')} unpriced, not counted`
          : rangeLabel,
      ),
      stat(
        'Tokens',
        fmtCompact(totals.prompt + totals.completion),
        `${fmtInt(totals.prompt)} prompt · ${fmtInt(totals.completion)} completion`,
      ),
      stat(
        'Requests',
        fmtInt(totals.requests),
        `turns · ${plural(totals.attempts, 'upstream attempt')} · ${fmtInt(totals.delivered)} tokens delivered`,
        'stat-requests',
      ),
      stat(
        'Interrupted',
        fmtPct(totals.interrupted, totals.requests),
        `${plural(totals.interrupted, 'request')} cut short by the client`,
      ),
      stat(
        'Errors',
        fmtPct(totals.errors, totals.requests),
        `${plural(totals.errors, 'request')} failed`,
        'stat-errors',
      ),
      stat(
        'Failed attempts',
        fmtPct(totals.failed_attempts, totals.attempts),
        `${fmtInt(totals.failed_attempts)} of ${plural(totals.attempts, 'attempt')}, retried or fallen back included`,
        'stat-failed-attempts',
      ),
    ),
  );

  const bucket = granularity === 'hour' ? 3600 : 86400;
  const periods = [];
  for (let t = Math.floor(from / bucket) * bucket; t < to; t += bucket) periods.push(t);
  const groupTotals = new Map();
  for (const r of rows) {
    const g = r.group ?? '(none)';
    const acc = groupTotals.get(g) || {
      group: g,
      cost: 0,
      tokens: 0,
      prompt: 0,
      completion: 0,
      delivered: 0,
      requests: 0,
      attempts: 0,
      failed_attempts: 0,
      unpriced_requests: 0,
      interrupted: 0,
      errors: 0,
      estimated: 0,
    };
    acc.cost += r.cost_usd || 0;
    acc.prompt += r.prompt_tokens || 0;
    acc.completion += r.completion_tokens || 0;
    acc.tokens += (r.prompt_tokens || 0) + (r.completion_tokens || 0);
    acc.delivered += r.completion_delivered || 0;
    acc.requests += r.requests || 0;
    acc.interrupted += r.interrupted || 0;
    acc.errors += r.errors || 0;
    acc.attempts += r.attempts || 0;
    acc.failed_attempts += r.failed_attempts || 0;
    acc.unpriced_requests += r.unpriced_requests || 0;
    acc.estimated += r.estimated || 0;
    groupTotals.set(g, acc);
  }
  const ranked = [...groupTotals.values()].sort((a, b) => b.cost - a.cost || b.tokens - a.tokens);
  const shown = ranked.slice(0, PALETTE.length - 1).map((g) => g.group);
  // Colours by name, not by rank: a group keeps its colour from one range or filter to the next
  // (its name's hash picks the first free colour from there on).
  const colours = new Map();
  const free = PALETTE.slice(0, -1);
  for (const g of [...shown].sort()) {
    let at = [...String(g)].reduce((n, ch) => (n * 31 + ch.codePointAt(0)) >>> 0, 7) % free.length;
    while ([...colours.values()].includes(free[at])) at = (at + 1) % free.length;
    colours.set(g, free[at]);
  }
  const colour = (g) => colours.get(g) || PALETTE[PALETTE.length - 1];
  const series = (value) => {
    const data = new Map();
    for (const r of rows) {
      const t = Date.parse(r.period_start) / 1000;
      const g = shown.includes(r.group ?? '(none)') ? (r.group ?? '(none)') : 'other';
      const key = `${t}|${g}`;
      data.set(key, (data.get(key) || 0) + value(r));
    }
    return data;
  };
  const groups = ranked.length > shown.length ? [...shown, 'other'] : shown;
  const legend = h(
    'div',
    { class: 'legend' },
    groups.map((g) =>
      h(
        'span',
        { class: 'legend-item' },
        h('span', {
          class: 'swatch',
          style: { background: g === 'other' ? PALETTE[PALETTE.length - 1] : colour(g) },
        }),
        nameOf(g),
      ),
    ),
  );
  // Buckets are UTC hours and days (as the API makes them): labelled in UTC, whatever the
  // browser's time zone.
  const fmtTick = (t) => {
    const d = new Date(t * 1000);
    return granularity === 'hour'
      ? `${pad(d.getUTCHours())}:00`
      : `${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
  };
  const spendChart = stackedBars({
    periods,
    groups,
    data: series((r) => r.cost_usd || 0),
    colour: (g) => (g === 'other' ? PALETTE[PALETTE.length - 1] : colour(g)),
    format: (v) => `$${Number(v.toPrecision(3))}`,
    tick: fmtTick,
    name: 'spend',
    label: nameOf,
  });
  const tokenChart = stackedBars({
    periods,
    groups,
    data: series((r) => (r.prompt_tokens || 0) + (r.completion_tokens || 0)),
    colour: (g) => (g === 'other' ? PALETTE[PALETTE.length - 1] : colour(g)),
    format: fmtCompact,
    tick: fmtTick,
    name: 'tokens',
    label: nameOf,
  });
  body.append(
    h(
      'div',
      { class: 'grid-2' },
      panel(
        `Spend by ${groupBy} (USD, ${granularity === 'hour' ? 'hours' : 'days'} in UTC)`,
        totals.cost
          ? spendChart
          : h('div', {
              class: 'empty',
              text: rows.length
                ? 'No cost recorded: these deployments have no price.'
                : 'No usage in this range.',
            }),
        legend.cloneNode(true),
      ),
      panel(
        `Tokens by ${groupBy} (${granularity === 'hour' ? 'hours' : 'days'} in UTC)`,
        rows.length ? tokenChart : h('div', { class: 'empty', text: 'No usage in this range.' }),
        legend,
      ),
    ),
  );

  const maxCost = Math.max(...ranked.map((g) => g.cost), 0);
  // One above the other: the rates table has seven columns, too many for half the page.
  body.append(
    h(
      'div',
      {},
      panel(
        'Top spenders',
        table(
          [
            {
              label: groupBy[0].toUpperCase() + groupBy.slice(1),
              cell: (g) =>
                h(
                  'span',
                  { class: 'legend-item' },
                  h('span', { class: 'swatch', style: { background: colour(g.group) } }),
                  h('span', { class: 'clip', title: nameOf(g.group), text: nameOf(g.group) }),
                ),
            },
            { label: 'Spend', num: true, cell: (g) => fmtUsd(g.cost) },
            { label: 'Share', cell: (g) => meter(maxCost ? g.cost / maxCost : 0, colour(g.group)) },
            { label: 'Tokens', num: true, cell: (g) => fmtInt(g.tokens) },
          ],
          ranked.slice(0, 10),
          'No usage in this range.',
        ),
      ),
      panel(
        'Interrupted and error rates',
        topRows(
          'rates',
          ranked.map((g) => ({ ...g, attrs: { 'data-group': g.group } })),
          'by spend',
          reportKey,
          (shown) =>
            table(
              [
                {
                  label: groupBy[0].toUpperCase() + groupBy.slice(1),
                  cell: (g) =>
                    h('span', { class: 'clip', title: nameOf(g.group), text: nameOf(g.group) }),
                },
                { label: 'Requests', num: true, cell: (g) => fmtInt(g.requests) },
                {
                  label: 'Interrupted',
                  num: true,
                  cell: (g) => `${fmtInt(g.interrupted)} (${fmtPct(g.interrupted, g.requests)})`,
                },
                {
                  label: 'Errors',
                  num: true,
                  cell: (g) =>
                    h('span', {
                      class: g.errors ? 'text-bad' : null,
                      'data-testid': 'rate-errors',
                      text: `${fmtInt(g.errors)} (${fmtPct(g.errors, g.requests)})`,
                    }),
                },
                { label: 'Attempts', num: true, cell: (g) => fmtInt(g.attempts) },
                {
                  label: 'Failed attempts',
                  num: true,
                  cell: (g) =>
                    h('span', {
                      class: g.failed_attempts ? 'text-bad' : null,
                      'data-testid': 'rate-failed-attempts',
                      text: `${fmtInt(g.failed_attempts)} (${fmtPct(g.failed_attempts, g.attempts)})`,
                    }),
                },
                { label: 'Delivered', num: true, cell: (g) => fmtPct(g.delivered, g.completion) },
              ],
              shown,
              'No usage in this range.',
            ),
        ),
        h('p', {
          class: 'field-hint',
          text: 'Requests are turns, counted once in the group of their last attempt: errors are requests that failed, interrupted those cut short by their client. Attempts count every upstream call (a retry or fallback is one more); failed attempts include those a fallback then recovered. Delivered is the share of generated tokens that reached the client.',
        }),
      ),
      latencyPanel(latency, latencyGroup, nameOf, reportKey),
    ),
  );
  if (isAdmin()) body.append(await budgetsPanel(teams, team));
  else if (session.me.kind === 'key') body.append(await ownBudgetPanel(session.me));
}

function latencyPanel(latency, groupBy, nameOf, reportKey) {
  // Time to first token and duration percentiles of the range's attempts, by the same grouping.
  const title = `Latency by ${groupBy} (every attempt)`;
  if (latency instanceof Error) return panel(title, errorBox(latency));
  const cell = (field, p) => (g) =>
    h('span', { 'data-col': `${field.replace('_ms', '')}-${p}`, text: fmtMs(g[field][p]) });
  const rows = [...latency.data]
    .sort((a, b) => b.duration_ms.count - a.duration_ms.count)
    .map((g) => ({ ...g, attrs: { 'data-group': g.group ?? '(none)' } }));
  return panel(
    title,
    h(
      'div',
      { 'data-testid': 'latency' },
      topRows('latency', rows, 'by attempts', reportKey, (shown) =>
        table(
          [
            {
              label: groupBy[0].toUpperCase() + groupBy.slice(1),
              cell: (g) =>
                h('span', {
                  class: 'clip',
                  title: nameOf(g.group ?? '(none)'),
                  text: nameOf(g.group ?? '(none)'),
                }),
            },
            { label: 'Attempts', num: true, cell: (g) => fmtInt(g.duration_ms.count) },
            ...['p50', 'p95', 'p99'].map((p) => ({
              label: `TTFT ${p}`,
              num: true,
              cell: cell('ttft_ms', p),
            })),
            ...['p50', 'p95', 'p99'].map((p) => ({
              label: `Duration ${p}`,
              num: true,
              cell: cell('duration_ms', p),
            })),
          ],
          shown,
          'No attempts in this range.',
        ),
      ),
    ),
    h('p', {
      class: 'field-hint',
      text: 'Percentiles by nearest rank over the attempts that measured them (GET /v1/usage/latency): TTFT is the time to the first token, duration the whole attempt; a retry or fallback counts once per attempt, in its own group.',
    }),
  );
}

function topRows(name, rows, order, reportKey, draw) {
  // Table `name` drawn by `draw` with its first TOP rows (`rows` come ranked `order`), and a
  // button that shows the rest in place and takes them away again.
  if (rows.length <= TOP) return draw(rows);
  const key = `${reportKey}|${name}`;
  // The button stays where it is (and keeps the keyboard) while the table beside it changes.
  const slot = h('div', {});
  const note = h('span', { class: 'field-hint' });
  const button = h('button', {
    class: 'btn btn-small btn-ghost',
    type: 'button',
    'data-testid': `${name}-show-all`,
    onclick: () => {
      if (shownWhole.has(key)) shownWhole.delete(key);
      else shownWhole.add(key);
      fill();
    },
  });
  const fill = () => {
    const whole = shownWhole.has(key);
    slot.replaceChildren(draw(whole ? rows : rows.slice(0, TOP)));
    button.textContent = whole ? `Show the top ${TOP}` : `Show all ${fmtInt(rows.length)}`;
    button.setAttribute('aria-expanded', String(whole));
    note.textContent = whole
      ? `All ${fmtInt(rows.length)}, ${order}.`
      : `The top ${TOP} of ${fmtInt(rows.length)}, ${order}; the totals and exports count them all.`;
  };
  fill();
  return h('div', {}, slot, h('div', { class: 'top-rows-more' }, button, note));
}

async function download(button, path) {
  // The gateway names the file, with its range (Content-Disposition).
  button.disabled = true;
  try {
    const response = await request(path, {
      headers: { Accept: path.includes('jsonl') ? 'application/jsonl' : 'text/csv' },
    });
    if (!response.ok) throw await errorOf(response);
    const named = /filename="([^"]+)"/.exec(response.headers.get('Content-Disposition') || '');
    const url = URL.createObjectURL(await response.blob());
    const link = h('a', { href: url, download: named ? named[1] : 'usage.csv' });
    document.body.append(link);
    link.click();
    link.remove();
    setTimeout(() => URL.revokeObjectURL(url), 10000);
  } catch (error) {
    button.after(errorBox(error));
  } finally {
    button.disabled = false;
  }
}
