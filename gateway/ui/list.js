// The gateway's admin UI: the conversation list, a request log (an ES module of the page; no
// build step).

import { append, clear, h } from './dom.js';
import { adminKeyName, api, enc, isAdmin, query, session } from './api.js';
import { ZONE, fmtAgo, fmtInt, fmtMs, fmtTime, fmtUsd, plural, utcDay } from './format.js';
import { applySoon, go, href } from './router.js';
import { badge, field, idCell, loading, pageHeader, panel, select, statusBadge, table } from './widgets.js';

const PAGE_STACK = new Map(); // filters -> the cursors of the pages before this one
let listHash = null; // the list as last shown (filters and page), for the way back to it

export function listLink() {
  return listHash || href('/conversations');
}

export async function conversationsPage(root, params) {
  const filters = {
    q: params.get('q') || '',
    team_id: params.get('team_id') || '',
    key_id: params.get('key_id') || '',
    model: params.get('model') || '',
    status: params.get('status') || '',
    since: params.get('since') || '',
    until: params.get('until') || '',
    stopped: params.get('stopped') || '',
    failed: params.get('failed') || '',
    limit: params.get('limit') || '20',
  };
  const after = params.get('after') || '';
  const signature = JSON.stringify(filters);
  listHash = location.hash || null;
  root.append(pageHeader('Conversations', isAdmin()
    ? 'Every recorded conversation, newest first. Open one to read it as the user saw it, or its attempts as the gateway made them.'
    : `The conversations of team ${session.me.team_id}, newest first (read-only).`));
  const form = h('form', { class: 'filters', 'data-testid': 'conversation-filters' });
  const results = h('div', {}, loading());
  root.append(panel(null, form), results);

  const [models, teams, keys] = await Promise.all([
    api('/v1/models').then((r) => r.data.map((m) => m.id)).catch(() => []),
    isAdmin() ? api('/v1/gateway/teams').then((r) => r.data).catch(() => []) : [],
    isAdmin() ? api('/v1/gateway/keys').then((r) => r.data).catch(() => []) : [],
  ]);
  const controls = [
    field('Search', h('input', { type: 'search', name: 'q', value: filters.q, placeholder: 'First message, or a conversation, turn or response id', 'data-testid': 'filter-q' })),
    isAdmin() ? field('Team', select('team_id', [['', 'All teams'], ...teams.map((t) => [t.id, `${t.name} (${t.id})`])], filters.team_id)) : null,
    isAdmin() ? field('Key', select('key_id', [['', 'All keys'], ...keys.map((k) => [k.id, `${k.name || k.key_prefix + '…'} · ${k.team_id}`])], filters.key_id)) : null,
    field('Model', select('model', [['', 'All models'], ...models.map((m) => [m, m])], filters.model)),
    field('Status', select('status', [['', 'Any status'], ['completed', 'Completed'], ['interrupted', 'Interrupted'], ['error', 'Error'], ['active', 'In progress']], filters.status, { 'data-testid': 'filter-status' })),
    field('From (UTC)', h('input', { type: 'date', name: 'since', value: filters.since })),
    field('To (UTC)', h('input', { type: 'date', name: 'until', value: filters.until })),
    field('Per page', select('limit', [['20', '20'], ['50', '50'], ['100', '100']], filters.limit)),
    h('fieldset', { class: 'field checks' }, h('legend', { class: 'field-label', text: 'Had' }),
      h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'stopped', value: 'true', checked: filters.stopped === 'true', 'data-testid': 'filter-stopped' }), 'a stopped turn'),
      h('label', { class: 'check' }, h('input', { type: 'checkbox', name: 'failed', value: 'true', checked: filters.failed === 'true', 'data-testid': 'filter-failed' }), 'a failed attempt')),
  ];
  append(form, h('div', { class: 'filter-grid' }, controls),
    h('div', { class: 'filter-actions' },
      h('button', { class: 'btn btn-primary', type: 'submit' }, 'Apply'),
      h('a', { class: 'btn btn-ghost', href: href('/conversations') }, 'Reset')));
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    const data = Object.fromEntries(new FormData(form).entries());
    go('/conversations', { ...data, limit: data.limit === '20' ? '' : data.limit });
  });
  form.addEventListener('change', (event) => {
    if (event.target.tagName === 'SELECT' || event.target.type === 'checkbox') applySoon(() => form.requestSubmit(), event.target);
  });

  const until = utcDay(filters.until);
  const page = await api('/v1/conversations' + query({
    q: filters.q,
    team_id: filters.team_id,
    key_id: filters.key_id,
    model: filters.model,
    status: filters.status,
    stopped: filters.stopped,
    failed: filters.failed,
    since: utcDay(filters.since),
    until: until === null ? null : until + 86400, // the whole day
    limit: filters.limit,
    after,
    include: 'usage',
  }));
  const stack = PAGE_STACK.get(signature) || [];
  const index = after ? stack.indexOf(after) : -1;
  const previous = after ? (index > 0 ? stack[index - 1] : '') : null;
  const rows = page.data.map((c) => ({ ...c, attrs: { 'data-conversation-id': c.id, class: 'row-link' } }));
  const teamName = new Map(teams.map((t) => [t.id, t.name]));
  const keyName = new Map(keys.map((k) => [k.id, k.name || `${k.key_prefix}…`]));
  const link = (c) => href(`/conversations/${enc(c.id)}`);
  const list = table([
    { label: 'Conversation', cell: (c) => h('div', { class: 'conv-cell' },
      h('a', { href: link(c), class: 'conv-preview', text: c.preview || '(no user message)' }),
      h('div', { class: 'conv-sub' }, idCell(c.id), c.parent_id ? h('span', { class: 'muted' }, ' · branch of ', idCell(c.parent_id, href(`/conversations/${enc(c.parent_id)}`))) : null)) },
    { label: 'Status', cell: (c) => h('div', { class: 'status-cell' }, statusBadge(c.status),
      c.usage?.stopped_turn && c.status !== 'interrupted' ? badge('had a stopped turn', 'warn', { 'data-testid': 'had-stopped' }) : null,
      c.usage?.failed_attempts ? badge(`${plural(c.usage.failed_attempts, 'failed attempt')}`, 'bad', { 'data-testid': 'had-failed' }) : null) },
    { label: 'Model', cell: (c) => c.model || '—' },
    { label: 'Cost', num: true, sort: (c) => c.usage?.cost_usd, cell: (c) => h('span', { 'data-col': 'cost', title: c.usage?.unpriced_attempts ? `${plural(c.usage.unpriced_attempts, 'attempt')} without a price, not counted` : null, text: fmtUsd(c.usage?.cost_usd) + (c.usage?.unpriced_attempts ? ' +' : '') }) },
    { label: 'Tokens in / out / delivered', num: true, sort: (c) => c.usage && c.usage.prompt_tokens + c.usage.completion_tokens, cell: (c) => h('span', { 'data-col': 'tokens', text: c.usage ? `${fmtInt(c.usage.prompt_tokens)} / ${fmtInt(c.usage.completion_tokens)} / ${fmtInt(c.usage.completion_delivered)}` : '—' }) },
    { label: 'TTFT', num: true, sort: (c) => c.usage?.ttft_ms, cell: (c) => h('span', { 'data-col': 'ttft', title: 'average time to first token over its attempts', text: fmtMs(c.usage?.ttft_ms) }) },
    { label: 'Duration', num: true, sort: (c) => c.usage?.duration_ms, cell: (c) => h('span', { 'data-col': 'duration', title: 'the time its attempts took, summed', text: fmtMs(c.usage?.duration_ms) }) },
    { label: 'Attempts', num: true, sort: (c) => c.usage?.attempts, cell: (c) => h('span', { 'data-col': 'attempts', text: c.usage ? String(c.usage.attempts) : '—' }) },
    { label: 'Team', cell: (c) => (c.team_id ? h('span', { title: c.team_id, text: teamName.get(c.team_id) || c.team_id }) : h('span', { class: 'muted', text: 'none' })) },
    { label: 'Key', cell: (c) => (c.key_id ? (keyName.has(c.key_id) ? h('span', { title: c.key_id, text: keyName.get(c.key_id) }) : idCell(c.key_id)) : h('span', { class: 'muted', text: adminKeyName() })) },
    { label: 'Turns', num: true, sort: (c) => c.turns, cell: (c) => String(c.turns) },
    { label: `Created (${ZONE})`, sort: (c) => c.created_at, cell: (c) => h('span', { title: fmtTime(c.created_at), text: fmtTime(c.created_at, false) }) },
    { label: 'Last activity', cell: (c) => h('span', { title: fmtTime(c.last_activity), text: fmtAgo(c.last_activity) }) },
  ], rows, 'No conversation matches these filters.');
  list.addEventListener?.('click', (event) => {
    const row = event.target.closest('tr[data-conversation-id]');
    if (row && !event.target.closest('a')) go(`/conversations/${enc(row.dataset.conversationId)}`);
  });
  const pager = h('div', { class: 'pager' },
    h('span', { class: 'muted', text: `${page.data.length} shown${page.has_more ? ', more older' : ''}` }),
    h('div', { class: 'pager-buttons' },
      h('button', { class: 'btn btn-small', type: 'button', disabled: previous === null, onclick: () => go('/conversations', { ...filtersParams(filters), after: previous }) }, '← Newer'),
      h('button', {
        class: 'btn btn-small', type: 'button', disabled: !page.has_more, 'data-testid': 'next-page',
        onclick: () => {
          const next = stack.slice(0, index + 1);
          next.push(page.last_id);
          PAGE_STACK.set(signature, next);
          go('/conversations', { ...filtersParams(filters), after: page.last_id });
        },
      }, 'Older →')));
  clear(results).append(panel(null, list, pager));
}

function filtersParams(filters) {
  return { ...filters, limit: filters.limit === '20' ? '' : filters.limit };
}
