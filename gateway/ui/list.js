// The gateway's admin UI: the conversation list, a request log (an ES module of the page; no
// build step). Its filters, search and sort live in the URL, under the API's own names, so a
// link, the breadcrumb back from a conversation and the browser's history all keep them.

import { append, clear, h } from './dom.js';
import { autoRefresh } from './autorefresh.js';
import { listTimeline } from './list_timeline.js';
import { api, enc, filterChoices, isAdmin, names, ownTeamName, query } from './api.js';
import { ZONE, fmtAgo, fmtInt, fmtMs, fmtTime, fmtUsd, plural, utcDay } from './format.js';
import { applySoon, go, href, keepFocus } from './router.js';
import {
  badge,
  field,
  idCell,
  loading,
  pageHeader,
  panel,
  select,
  statusBadge,
  table,
  teamKeyCell,
} from './widgets.js';

const PAGE_STACK = new Map(); // filters -> the cursors of the pages before this one
let listHash = null; // the list as last shown (filters and page), for the way back to it

export function listLink() {
  return listHash || href('/conversations');
}

const FILTERS = [
  'q',
  'team_id',
  'key_id',
  'model',
  'status',
  'user',
  'since',
  'until',
  'stopped',
  'failed',
  'min_cost',
  'max_cost',
  'min_duration_ms',
  'max_duration_ms',
  'min_ttft_ms',
  'max_ttft_ms',
  'sort',
  'order',
  'limit',
  'view',
];
const RANGES = [
  ['min_cost', 'Cost from (USD)'],
  ['max_cost', 'Cost to (USD)'],
  ['min_duration_ms', 'Duration from (ms)'],
  ['max_duration_ms', 'Duration to (ms)'],
  ['min_ttft_ms', 'TTFT from (ms)'],
  ['max_ttft_ms', 'TTFT to (ms)'],
];
// The order the API lists in when the URL names none.
const DEFAULT_SORT = 'created';

// A generated id (`conv_`, `turn_`, `resp_`, `chatcmpl-`… and hex), a request id (hex, or a
// client's UUID) or the id a provider gave its answer (OpenAI's `chatcmpl-` and Anthropic's
// `msg_` in letters and digits, OpenRouter's `gen-`) is looked up exactly; anything else is
// searched for in the messages' text.
const ID_SHAPE =
  /^(?:[a-z]+[_-])?(?:[0-9a-f]{16,}|[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})$/i;
const ANSWER_ID_SHAPE = /^(?:chatcmpl-|msg_|resp_|gen-)[A-Za-z0-9-]{12,}$/;

// The end of an id as the list shows it (`conv_…3f9a0c1d`: the random tail), with or without its
// prefix and ellipsis, is looked up among the ends of conversation and turn ids.
const TAIL_SHAPE = /^(?:(?:[a-z]+_)?…[0-9a-f]{4,}|(?:conv|turn)_[0-9a-f]{4,15}|[0-9a-f]{8})$/i;

export function idShaped(value) {
  return ID_SHAPE.test(value) || ANSWER_ID_SHAPE.test(value);
}

function searchKind(search) {
  if (!search) return null;
  if (idShaped(search)) return 'id';
  return TAIL_SHAPE.test(search) ? 'id_tail' : 'q';
}

function tailOf(search) {
  // `conv_3f9a0c1d` (the ellipsis left out) is the tail of a conversation's id.
  return search.includes('…') ? search : search.replace(/^([a-z]+)_/i, '$1_…');
}

function badRange(filters) {
  // A To date before From: nothing can be in that range, which the page says rather than show
  // an empty list.
  return filters.since && filters.until && filters.until < filters.since;
}

function filtersOf(params) {
  const filters = Object.fromEntries(FILTERS.map((name) => [name, params.get(name) || '']));
  filters.limit = filters.limit || '20';
  for (const [name, value] of params)
    if (name.startsWith('metadata.') && name.length > 9) filters[name] = value;
  return filters;
}

function urlParams(filters) {
  // As the URL keeps them: the default page size left out.
  return { ...filters, limit: filters.limit === '20' ? '' : filters.limit };
}

function metadataText(filters) {
  return Object.entries(filters)
    .filter(([name]) => name.startsWith('metadata.'))
    .map(([name, value]) => `${name.slice(9)}=${value}`)
    .join(', ');
}

function fromForm(form) {
  // The form's values as URL filters; `key=value, …` in the metadata box become `metadata.key`.
  const data = Object.fromEntries(new FormData(form).entries());
  const pairs = data.metadata || '';
  delete data.metadata;
  for (const pair of pairs.split(',')) {
    const cut = pair.indexOf('=');
    if (cut > 0) data[`metadata.${pair.slice(0, cut).trim()}`] = pair.slice(cut + 1).trim();
  }
  return data;
}

function apiQuery(filters, after) {
  const { q, since, until, view: _view, ...rest } = filters;
  const search = q.trim();
  const lastDay = utcDay(until);
  const kind = searchKind(search);
  return query({
    ...rest,
    ...(kind === 'id'
      ? { id: search }
      : kind === 'id_tail'
        ? { id_tail: tailOf(search) }
        : { q: search }),
    since: utcDay(since),
    until: lastDay === null ? null : lastDay + 86400, // the whole day
    after,
    include: 'usage',
  });
}

export async function conversationsPage(root, params) {
  const filters = filtersOf(params);
  const after = params.get('after') || '';
  const signature = JSON.stringify({ ...filters, view: '' }); // a page's cursors, either view
  listHash = location.hash || null;
  root.append(
    pageHeader(
      'Conversations',
      isAdmin()
        ? 'Every recorded conversation, newest first. Open one to read it as the user saw it, or its attempts as the gateway made them.'
        : `The conversations of team ${ownTeamName()}, newest first (read-only).`,
    ),
  );
  const form = h('form', { class: 'filters', 'data-testid': 'conversation-filters' });
  const results = h('div', {}, loading());
  root.append(panel(null, form), results);

  const [models, teams, keys] = await filterChoices();
  const since = h('input', {
    type: 'date',
    name: 'since',
    value: filters.since,
    'data-testid': 'filter-since',
  });
  const until = h('input', {
    type: 'date',
    name: 'until',
    value: filters.until,
    min: filters.since || null,
    'data-testid': 'filter-until',
  });
  since.addEventListener('change', () => {
    until.min = since.value;
  });
  const controls = [
    field(
      'Search',
      h('input', {
        type: 'search',
        name: 'q',
        value: filters.q,
        placeholder: 'Message text or any id',
        title: 'Words in any message, or exactly a conversation, turn, response or request id',
        'data-testid': 'filter-q',
      }),
    ),
    isAdmin()
      ? field(
          'Team',
          select(
            'team_id',
            [['', 'All teams'], ...teams.map((t) => [t.id, `${t.name} (${t.id})`])],
            filters.team_id,
          ),
        )
      : null,
    isAdmin()
      ? field(
          'Key',
          select(
            'key_id',
            [
              ['', 'All keys'],
              ...keys.map((k) => [k.id, `${k.name || `${k.key_prefix}…`} · ${k.team_id}`]),
            ],
            filters.key_id,
          ),
        )
      : null,
    field(
      'Model',
      select('model', [['', 'All models'], ...models.map((m) => [m, m])], filters.model),
    ),
    field(
      'Status',
      select(
        'status',
        [
          ['', 'Any status'],
          ['completed', 'Completed'],
          ['interrupted', 'Interrupted'],
          ['error', 'Error'],
          ['active', 'In progress'],
        ],
        filters.status,
        { 'data-testid': 'filter-status' },
      ),
    ),
    field(
      'User',
      h('input', {
        name: 'user',
        value: filters.user,
        placeholder: 'end user, or a part of it',
        'data-testid': 'filter-user',
        title: 'Users whose name holds this, in any case: carol finds carol@acme.io',
      }),
    ),
    field('From (UTC)', since),
    field('To (UTC)', until),
    field(
      'Per page',
      select(
        'limit',
        [
          ['20', '20'],
          ['50', '50'],
          ['100', '100'],
        ],
        filters.limit,
      ),
    ),
    h(
      'fieldset',
      { class: 'field checks' },
      h('legend', { class: 'field-label', text: 'Had' }),
      h(
        'label',
        { class: 'check' },
        h('input', {
          type: 'checkbox',
          name: 'stopped',
          value: 'true',
          checked: filters.stopped === 'true',
          'data-testid': 'filter-stopped',
        }),
        'a stopped turn',
      ),
      h(
        'label',
        { class: 'check' },
        h('input', {
          type: 'checkbox',
          name: 'failed',
          value: 'true',
          checked: filters.failed === 'true',
          'data-testid': 'filter-failed',
        }),
        'a failed attempt',
      ),
    ),
  ];
  const metadata = metadataText(filters);
  const more = h(
    'details',
    {
      class: 'more-filters',
      open: Boolean(metadata || RANGES.some(([name]) => filters[name])),
      'data-testid': 'more-filters',
    },
    h('summary', {}, 'Cost, duration, time to first token, metadata'),
    h(
      'div',
      { class: 'filter-grid' },
      RANGES.map(([name, label]) =>
        field(
          label,
          h('input', {
            type: 'number',
            min: 0,
            step: 'any',
            name,
            value: filters[name],
            'data-testid': `filter-${name}`,
          }),
        ),
      ),
      field(
        'Metadata',
        h('input', {
          name: 'metadata',
          value: metadata,
          placeholder: 'key=value, key=value',
          'data-testid': 'filter-metadata',
          pattern: '\\s*[^=,\\s][^=,]*=[^,]*(,\\s*[^=,\\s][^=,]*=[^,]*)*\\s*',
          title: 'key=value pairs, separated by commas',
        }),
      ),
    ),
  );
  append(
    form,
    h('div', { class: 'filter-grid' }, controls),
    more,
    h('input', { type: 'hidden', name: 'sort', value: filters.sort }),
    h('input', { type: 'hidden', name: 'order', value: filters.order }),
    h('input', { type: 'hidden', name: 'view', value: filters.view }),
    h(
      'div',
      { class: 'filter-actions' },
      h('button', { class: 'btn btn-primary', type: 'submit' }, 'Apply'),
      h('a', { class: 'btn btn-ghost', href: href('/conversations') }, 'Reset'),
    ),
  );
  form.addEventListener('submit', (event) => {
    event.preventDefault();
    go('/conversations', urlParams(fromForm(form)));
  });
  until.addEventListener('input', () => until.setCustomValidity(''));
  form.addEventListener(
    'invalid',
    (event) => {
      // The browser's own message for a date under `min`, said in the page's words.
      if (event.target === until && until.validity.rangeUnderflow) {
        until.setCustomValidity(`"To" must be on or after "From" (${since.value}).`);
      }
    },
    true,
  );
  if (badRange(filters)) {
    results.replaceChildren(
      panel(
        null,
        h(
          'div',
          { class: 'alert alert-warn', role: 'alert', 'data-testid': 'date-range-error' },
          `"To" (${filters.until}) is before "From" (${filters.since}): no conversation can be in that range. ` +
            'Swap the dates, or clear one of them.',
        ),
      ),
    );
    return;
  }
  form.addEventListener('change', (event) => {
    if (event.target.tagName === 'SELECT' || event.target.type === 'checkbox')
      applySoon(() => form.requestSubmit(), event.target);
  });

  const page = await api(`/v1/conversations${apiQuery(filters, after)}`);
  const stack = PAGE_STACK.get(signature) || [];
  const index = after ? stack.indexOf(after) : -1;
  const previous = after ? (index > 0 ? stack[index - 1] : '') : null;
  const rows = page.data.map((c) => ({
    ...c,
    attrs: { 'data-conversation-id': c.id, class: 'row-link' },
  }));
  const { teams: teamName, keys: keyName } = names(teams, keys);
  const link = (c) => href(`/conversations/${enc(c.id)}`);
  const sorting = {
    by: filters.sort || DEFAULT_SORT,
    order: filters.order || 'desc',
    onSort: (key, control) => {
      // The same column again turns its order round; another starts from its largest.
      const order = key === sorting.by && sorting.order === 'desc' ? 'asc' : 'desc';
      keepFocus(control);
      go('/conversations', urlParams({ ...filters, sort: key, order }));
    },
  };
  const list = table(
    [
      {
        label: 'Conversation',
        grow: true,
        cell: (c) =>
          h(
            'div',
            { class: 'conv-cell' },
            h('a', {
              href: link(c),
              class: 'conv-preview',
              text: c.preview || '(no user message)',
            }),
            h(
              'div',
              { class: 'conv-sub' },
              idCell(c.id),
              h('span', {
                class: 'muted',
                'data-testid': 'turns',
                text: ` · ${plural(c.turns, 'turn')}`,
              }),
              c.parent_id
                ? h(
                    'span',
                    { class: 'muted' },
                    ' · branch of ',
                    idCell(c.parent_id, href(`/conversations/${enc(c.parent_id)}`)),
                  )
                : null,
            ),
          ),
      },
      {
        label: 'Status',
        cell: (c) =>
          h(
            'div',
            { class: 'status-cell' },
            statusBadge(c.status),
            c.usage?.stopped_turn && c.status !== 'interrupted'
              ? badge('had a stopped turn', 'warn', { 'data-testid': 'had-stopped' })
              : null,
            c.usage?.failed_attempts
              ? badge(`${plural(c.usage.failed_attempts, 'failed attempt')}`, 'bad', {
                  'data-testid': 'had-failed',
                })
              : null,
          ),
      },
      {
        label: 'Model',
        cell: (c) => h('span', { class: 'clip', title: c.model || null, text: c.model || '—' }),
      },
      {
        label: 'Cost',
        num: true,
        sortKey: 'cost',
        cell: (c) =>
          h('span', {
            'data-col': 'cost',
            title: c.usage?.unpriced_attempts
              ? `${plural(c.usage.unpriced_attempts, 'attempt')} without a price, not counted`
              : null,
            text: fmtUsd(c.usage?.cost_usd) + (c.usage?.unpriced_attempts ? ' +' : ''),
          }),
      },
      {
        label: 'Tokens in / out / delivered',
        heading: 'Tokens',
        sub: 'in / out / delivered',
        num: true,
        sortKey: 'tokens',
        cell: (c) =>
          h('span', {
            'data-col': 'tokens',
            text: c.usage
              ? `${fmtInt(c.usage.prompt_tokens)} / ${fmtInt(c.usage.completion_tokens)} / ${fmtInt(c.usage.completion_delivered)}`
              : '—',
          }),
      },
      {
        label: 'TTFT',
        num: true,
        sortKey: 'ttft',
        cell: (c) =>
          h('span', {
            'data-col': 'ttft',
            title: 'average time to first token over its attempts',
            text: fmtMs(c.usage?.ttft_ms),
          }),
      },
      {
        label: 'Duration',
        num: true,
        sortKey: 'duration',
        cell: (c) =>
          h('span', {
            'data-col': 'duration',
            title: 'the time its attempts took, summed',
            text: fmtMs(c.usage?.duration_ms),
          }),
      },
      {
        label: 'Attempts',
        num: true,
        sortKey: 'attempts',
        cell: (c) =>
          h('span', { 'data-col': 'attempts', text: c.usage ? String(c.usage.attempts) : '—' }),
      },
      {
        label: 'Team · key',
        heading: 'Team',
        sub: 'key',
        cell: (c) => teamKeyCell(c, teamName, keyName),
      },
      {
        label: `Created (${ZONE})`,
        sortKey: 'created',
        sub: 'Last activity',
        subSortKey: 'updated',
        cell: (c) =>
          h(
            'div',
            {},
            h('span', {
              class: 'nowrap',
              title: fmtTime(c.created_at),
              text: fmtTime(c.created_at, false),
            }),
            h('div', {
              class: 'conv-sub muted',
              'data-testid': 'last-activity',
              title: fmtTime(c.last_activity),
              text: fmtAgo(c.last_activity),
            }),
          ),
      },
    ],
    rows,
    'No conversation matches these filters.',
    sorting,
  );
  list.addEventListener?.('click', (event) => {
    const row = event.target.closest('tr[data-conversation-id]');
    if (row && !event.target.closest('a, button'))
      go(`/conversations/${enc(row.dataset.conversationId)}`);
  });
  const search = filters.q.trim();
  const kind = searchKind(search);
  const found = {
    id: ' · looked up by id',
    id_tail: ' · looked up by the end of an id',
    q: " · found in the messages' text",
  };
  const pager = h(
    'div',
    { class: 'pager' },
    h('span', {
      class: 'muted',
      'data-testid': 'list-summary',
      text: `${page.data.length} shown${page.has_more ? ', more on the next page' : ''}${kind ? found[kind] : ''}`,
    }),
    h(
      'div',
      { class: 'pager-buttons' },
      h(
        'button',
        {
          class: 'btn btn-small',
          type: 'button',
          disabled: previous === null,
          onclick: () => go('/conversations', { ...urlParams(filters), after: previous }),
        },
        '← Previous',
      ),
      h(
        'button',
        {
          class: 'btn btn-small',
          type: 'button',
          disabled: !page.has_more,
          'data-testid': 'next-page',
          onclick: () => {
            // The API's cursor goes on in the page's sort; a bare id, in the default order.
            const cursor = page.cursor ?? page.last_id;
            const next = stack.slice(0, index + 1);
            next.push(cursor);
            PAGE_STACK.set(signature, next);
            go('/conversations', { ...urlParams(filters), after: cursor });
          },
        },
        'Next →',
      ),
    ),
  );
  const shown = filters.view === 'timeline' ? await listTimeline(page.data, link) : list;
  clear(results).append(
    panel(
      null,
      viewTabs(filters, after),
      shown,
      pager,
      autoRefresh('conversations'),
      savedSearch(filters),
    ),
  );
}

function viewTabs(filters, after) {
  // The same page of the list as a table, or on one time axis.
  return h(
    'div',
    { class: 'tabs list-views', role: 'tablist', 'aria-label': 'View' },
    [
      ['', 'Table'],
      ['timeline', 'Timeline'],
    ].map(([view, label]) => {
      const active = filters.view === view || (!view && filters.view !== 'timeline');
      return h(
        'a',
        {
          href: href('/conversations', { ...urlParams(filters), view, after }),
          role: 'tab',
          class: active ? 'tab active' : 'tab',
          'aria-selected': active ? 'true' : 'false',
          'data-testid': `list-view-${view || 'table'}`,
        },
        label,
      );
    }),
  );
}

function savedSearch(filters) {
  // This search as a link: its filters are the URL's, so it opens as it is now, bookmarked or
  // sent to someone.
  const url = new URL(href('/conversations', urlParams(filters)), location.href).href;
  const copy = h(
    'button',
    { class: 'btn btn-small btn-ghost', type: 'button', 'data-testid': 'copy-search-link' },
    'Copy link',
  );
  copy.addEventListener('click', async () => {
    try {
      await navigator.clipboard.writeText(url);
      copy.textContent = 'Copied';
    } catch {
      copy.textContent = 'Select the link to copy it';
    }
  });
  return h(
    'p',
    { class: 'saved-search muted' },
    'Link to this search: ',
    h('a', { href: url, 'data-testid': 'search-link', text: url }),
    ' ',
    copy,
  );
}
