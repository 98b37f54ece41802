// The gateway's admin UI: budgets against their consumption (an ES module of the page; no build
// step).

import { h } from './dom.js';
import { api, query } from './api.js';
import { fmtUsd, limitsText, periodStart, shortId } from './format.js';
import { badge, panel } from './widgets.js';

export async function budgetsPanel(teams, onlyTeam) {
  const keys = await api(`/v1/gateway/keys${query({ team_id: onlyTeam })}`).then((r) => r.data);
  const now = Date.now() / 1000;
  const scoped = [
    ...teams
      .filter((t) => !onlyTeam || t.id === onlyTeam)
      .filter((t) => t.limits?.budget)
      .map((t) => ({ kind: 'team', id: t.id, label: t.name, budget: t.limits.budget })),
    ...keys
      .filter((k) => !k.revoked_at && k.limits && k.limits.budget)
      .map((k) => ({
        kind: 'key',
        id: k.id,
        label: k.name || `${k.key_prefix}…`,
        budget: k.limits.budget,
      })),
  ];
  const spent = new Map();
  const wanted = new Set(scoped.map((b) => `${b.kind}|${b.budget.period}`));
  await Promise.all(
    [...wanted].map(async (pair) => {
      const [kind, period] = pair.split('|');
      const report = await api(
        `/v1/usage${query({ group_by: kind, granularity: 'day', from: periodStart(period, now), to: Math.ceil(now) + 1 })}`,
      );
      for (const r of report.data) {
        const key = `${kind}|${period}|${r.group}`;
        spent.set(key, (spent.get(key) || 0) + (r.cost_usd || 0));
      }
    }),
  );
  const bars = scoped.map((b) =>
    budgetBar(b, spent.get(`${b.kind}|${b.budget.period}|${b.id}`) || 0),
  );
  return panel(
    'Budgets',
    bars.length
      ? h('div', { class: 'budgets' }, bars)
      : h('div', {
          class: 'empty',
          text: 'No team or key has a budget. Set one under Keys & teams.',
        }),
    h('p', {
      class: 'field-hint',
      text: "Consumption in each budget's current period; the marks are the 80% warning threshold and the limit.",
    }),
  );
}

function budgetBar(b, used) {
  // `used` is null when the gateway could not read the spend (its store away).
  const fraction = (used ?? 0) / b.budget.usd;
  const level = fraction >= 1 ? 'over' : fraction >= 0.8 ? 'warn' : 'ok';
  const fill = h('div', {
    class: `budget-fill budget-${level}`,
    style: { width: `${Math.min(fraction, 1) * 100}%` },
  });
  return h(
    'div',
    { class: 'budget', 'data-testid': 'budget', 'data-kind': b.kind },
    h(
      'div',
      { class: 'budget-head' },
      h(
        'span',
        {},
        badge(b.kind, 'neutral'),
        ' ',
        h('strong', { text: b.label }),
        h('code', { class: 'muted', text: ` ${shortId(b.id)}` }),
      ),
      h('span', {
        class: `budget-figure budget-text-${level}`,
        text:
          used === null
            ? `spend unknown, of ${fmtUsd(b.budget.usd)}`
            : `${fmtUsd(used)} of ${fmtUsd(b.budget.usd)} · ${(fraction * 100).toFixed(1)}%`,
      }),
    ),
    h(
      'div',
      { class: 'budget-track' },
      fill,
      h('div', { class: 'budget-threshold', style: { left: '80%' }, title: '80%: warning' }),
      h('div', {
        class: 'budget-threshold budget-threshold-max',
        style: { left: 'calc(100% - 2px)' },
        title: '100%',
      }),
    ),
    h('div', {
      class: 'budget-foot muted',
      text: `per ${b.budget.period} (UTC) · ${b.budget.mode === 'hard' ? 'hard: requests are refused at 100%' : 'soft: requests pass with a warning header'}`,
    }),
  );
}

export async function ownBudgetPanel(me) {
  // A team key's own limits and its team's, each budget with what it has spent this period, as
  // the gateway's limiter counts it (`GET /v1/me`, read afresh: the spend moves).
  const { budget } = await api('/v1/me');
  const scopes = [
    {
      kind: 'key',
      id: me.key_id,
      label: me.key_name ? `This key (${me.key_name})` : 'This key',
      limits: budget?.key,
    },
    {
      kind: 'team',
      id: me.team_id,
      label: `Team ${me.team_name || me.team_id}`,
      limits: budget?.team,
    },
  ];
  const items = scopes.map((scope) => {
    const limits = scope.limits || {};
    const others = limitsText({ ...limits, budget: null });
    if (limits.budget) {
      const bar = budgetBar({ ...scope, budget: limits.budget }, limits.spent_usd ?? null);
      if (others !== '—')
        bar.append(h('div', { class: 'budget-foot muted', text: `also ${others}` }));
      return bar;
    }
    return h(
      'div',
      { class: 'budget', 'data-testid': 'budget', 'data-kind': scope.kind },
      h(
        'div',
        { class: 'budget-head' },
        h('span', {}, badge(scope.kind, 'neutral'), ' ', h('strong', { text: scope.label })),
        h('span', { class: 'budget-figure muted', text: 'no budget' }),
      ),
      h('div', { class: 'budget-foot muted', text: others === '—' ? 'no limits' : others }),
    );
  });
  return panel(
    'Budgets',
    h('div', { class: 'budgets', 'data-testid': 'own-budgets' }, items),
    h('p', {
      class: 'field-hint',
      text: "This key's and its team's consumption in each budget's current period; the marks are the 80% warning threshold and the limit.",
    }),
  );
}
