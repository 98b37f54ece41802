// The gateway's admin UI: the deployments' live health (an ES module of the page; no build step).

import { clear, h } from './dom.js';
import { api, query } from './api.js';
import { fmtInt, fmtMs, fmtPct, fmtTime, plural } from './format.js';
import { onLeave } from './router.js';
import { errorBox, loading, pageHeader, panel, stat, statusBadge, table } from './widgets.js';

export async function deploymentsPage(root) {
  const stamp = h('span', { class: 'muted' });
  root.append(
    pageHeader(
      'Deployments',
      'Live health from this gateway process, refreshed every 5 seconds; error rates from the last 24 hours of usage.',
      stamp,
    ),
  );
  const body = h('div', {}, loading());
  root.append(body);
  const refresh = async () => {
    const now = Date.now() / 1000;
    const [live, usage] = await Promise.all([
      api('/v1/gateway/deployments'),
      api(
        `/v1/usage${query({ group_by: 'deployment', granularity: 'day', from: Math.floor(now - 86400), to: Math.ceil(now) + 1 })}`,
      ),
    ]);
    const recent = new Map();
    for (const r of usage.data) {
      const acc = recent.get(r.group) || { attempts: 0, failed: 0 };
      acc.attempts += r.attempts;
      acc.failed += r.failed_attempts;
      recent.set(r.group, acc);
    }
    const rows = live.data.map((d) => ({
      ...d,
      recent: recent.get(d.name) || { attempts: 0, failed: 0 },
      attrs: { 'data-deployment': d.name },
    }));
    const counts = {};
    for (const d of rows) counts[d.state] = (counts[d.state] || 0) + 1;
    clear(body).append(
      h(
        'div',
        { class: 'stats' },
        stat(
          'Deployments',
          String(rows.length),
          plural(new Set(rows.map((d) => d.alias)).size, 'alias', 'aliases'),
        ),
        stat('Healthy', String(counts.healthy || 0)),
        stat('Cooling down', String(counts.cooling || 0), 'skipped until their cooldown ends'),
        stat('Half-open', String(counts.half_open || 0), 'one probe request decides'),
        stat('In flight', String(rows.reduce((sum, d) => sum + d.in_flight, 0))),
      ),
      panel(
        null,
        table(
          [
            {
              label: 'Deployment',
              cell: (d) =>
                h(
                  'div',
                  {},
                  h('strong', { text: d.name }),
                  h('div', { class: 'muted', text: `${d.alias} · ${d.provider} · ${d.model}` }),
                ),
            },
            {
              label: 'Health',
              cell: (d) =>
                h(
                  'div',
                  {},
                  statusBadge(d.state),
                  d.state === 'cooling'
                    ? h('div', {
                        class: 'muted',
                        text: `${d.cooldown_remaining_s.toFixed(1)} s left`,
                      })
                    : null,
                ),
            },
            {
              label: 'In flight',
              num: true,
              cell: (d) => `${d.in_flight}${d.max_concurrency ? ` / ${d.max_concurrency}` : ''}`,
            },
            { label: 'TTFT (avg)', num: true, cell: (d) => fmtMs(d.ttft_ms) },
            {
              label: 'Since start',
              num: true,
              cell: (d) => `${fmtInt(d.successes)} ok · ${fmtInt(d.failures)} failed`,
            },
            { label: 'Error rate', cell: (d) => rateMeter(d.failures, d.successes + d.failures) },
            {
              label: '24 h failed attempts',
              cell: (d) => rateMeter(d.recent.failed, d.recent.attempts),
            },
            {
              label: 'Last error',
              cell: (d) =>
                d.last_error
                  ? h('span', {
                      class: 'text-bad small',
                      text:
                        typeof d.last_error === 'string'
                          ? d.last_error
                          : JSON.stringify(d.last_error),
                    })
                  : h('span', { class: 'muted', text: '—' }),
            },
          ],
          rows,
          'No deployments configured.',
        ),
      ),
    );
    stamp.textContent = `updated ${fmtTime(now)}`;
  };
  await refresh();
  const timer = setInterval(
    () =>
      refresh().catch((error) => {
        clear(body).append(errorBox(error));
      }),
    5000,
  );
  onLeave(() => clearInterval(timer));
}

function rateMeter(part, whole) {
  if (!whole) return h('span', { class: 'muted', text: '—' });
  const fraction = part / whole;
  const level = fraction >= 0.25 ? 'over' : fraction >= 0.05 ? 'warn' : 'ok';
  return h(
    'div',
    { class: 'rate' },
    h(
      'div',
      { class: 'meter' },
      h('div', {
        class: `meter-fill budget-${level}`,
        style: { width: `${Math.max(fraction * 100, fraction ? 2 : 0)}%` },
      }),
    ),
    h('span', { class: 'rate-text', text: fmtPct(part, whole) }),
  );
}
