// The gateway's admin UI: the API calls that are no conversation turn (embeddings, images,
// audio, moderations, rerank), from the request log `GET /v1/requests` (an ES module of the
// page; no build step). Its filters live in the URL under the API's own names; "Load more"
// adds the next page below, from the API's cursor.

import { append, clear, h } from './dom.js';
import { api, filterChoices, isAdmin, names, ownTeamName, query, session } from './api.js';
import { ZONE, fmtInt, fmtMs, fmtTime, fmtUsdExact, plural } from './format.js';
import { applySoon, go, href } from './router.js';
import {
  errorBox,
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

const FILTERS = ['endpoint', 'status', 'model', 'team_id', 'key_id', 'limit', 'id'];
const DEFAULT_LIMIT = '50';
// The endpoints the gateway logs, as `endpoint` names them; one it adds later shows as named.
const ENDPOINTS = [
  ['embeddings', 'Embeddings'],
  ['images.generations', 'Images: generations'],
  ['images.edits', 'Images: edits'],
  ['images.variations', 'Images: variations'],
  ['audio.transcriptions', 'Audio: transcriptions'],
  ['audio.translations', 'Audio: translations'],
  ['audio.speech', 'Audio: speech'],
  ['moderations', 'Moderations'],
  ['rerank', 'Rerank'],
  ['files.create', 'Files: uploads'],
  ['files.delete', 'Files: deletes'],
  ['batches.create', 'Batches: created'],
  ['batches.cancel', 'Batches: cancelled'],
  ['batches', 'Batches: results metered'],
];

function filtersOf(params) {
  const filters = Object.fromEntries(FILTERS.map((name) => [name, params.get(name) || '']));
  if (!isAdmin()) filters.team_id = ''; // a team key's own team's calls, whatever the URL says
  return filters;
}

function urlParams(filters) {
  // As the URL keeps them: the default page size left out.
  return { ...filters, limit: filters.limit === DEFAULT_LIMIT ? '' : filters.limit };
}

// What a call was billed by (`units`, which each endpoint fills its own way), readably.
const UNIT_WORDS = {
  images: (n) => plural(n, 'image'),
  size: (v) => String(v),
  quality: (v) => String(v),
  characters: (n) => plural(n, 'character'),
  seconds: (n) => `${Number(Number(n).toFixed(3))} s of audio`,
  audio_tokens: (n) => plural(n, 'audio token'),
  searches: (n) => plural(n, 'search', 'searches'),
  documents: (n) => plural(n, 'document'),
  inputs: (n) => plural(n, 'input'),
  requests: (n) => plural(n, 'request'),
};

function unitsText(units) {
  const parts = [];
  for (const [name, value] of Object.entries(units || {})) {
    if (value === null || value === undefined || value === '' || typeof value === 'object')
      continue;
    const word = UNIT_WORDS[name];
    parts.push(word ? word(value) : `${value} ${name.replace(/_/g, ' ')}`);
  }
  return parts.join(' · ');
}

function tokensText(c) {
  const prompt = c.prompt_tokens || 0;
  const completion = c.completion_tokens || 0;
  if (!prompt && !completion) return '';
  return completion
    ? `${fmtInt(prompt)} in · ${fmtInt(completion)} out tokens`
    : plural(prompt, 'token');
}

function billedCell(c) {
  // Its units; tokens besides on a second line (an image priced by its tokens), or alone (an
  // embedding's input).
  const units = unitsText(c.units);
  const tokens = tokensText(c);
  if (!units && !tokens) return h('span', { class: 'muted', 'data-col': 'units', text: '—' });
  return h(
    'div',
    {},
    h('span', { 'data-col': 'units', text: units || tokens }),
    units && tokens
      ? h('div', { class: 'conv-sub muted nowrap', 'data-col': 'tokens', text: tokens })
      : null,
  );
}

function costCell(c) {
  const estimated =
    c.usage_source === 'estimated'
      ? h('div', {
          class: 'conv-sub muted',
          'data-testid': 'estimated',
          title: 'Counted by the gateway: the provider reported no usage',
          text: 'estimated',
        })
      : null;
  if (c.cost_usd === null || c.cost_usd === undefined) {
    return h(
      'div',
      {},
      h('span', {
        class: 'muted',
        'data-col': 'cost',
        title: 'No price is known for this model: not counted in spend',
        text: 'unpriced',
      }),
      estimated,
    );
  }
  return h(
    'div',
    {},
    h('span', { 'data-col': 'cost', title: `${c.cost_usd} USD`, text: fmtUsdExact(c.cost_usd) }),
    estimated,
  );
}

function knownNames(teams, keys) {
  // The master key names every team and key; a team key its own team and itself (`GET /v1/me`).
  if (isAdmin()) return names(teams, keys);
  const me = session.me;
  return names(
    [{ id: me.team_id, name: ownTeamName() }],
    me.key_name ? [{ id: me.key_id, name: me.key_name }] : [],
  );
}

function columns(teamName, keyName) {
  return [
    {
      label: `Time (${ZONE})`,
      cell: (c) =>
        h(
          'div',
          {},
          h('span', {
            class: 'nowrap',
            'data-col': 'time',
            title: fmtTime(c.created_at),
            text: fmtTime(c.created_at),
          }),
          h('div', { class: 'conv-sub' }, idCell(c.id)),
        ),
    },
    {
      label: 'Endpoint',
      cell: (c) => h('span', { class: 'nowrap', 'data-col': 'endpoint', text: c.endpoint }),
    },
    {
      label: 'Model · deployment',
      heading: 'Model',
      sub: 'deployment · upstream',
      cell: (c) =>
        h(
          'div',
          {},
          h('span', {
            class: 'clip',
            'data-col': 'model',
            title: c.model || null,
            text: c.model || '—',
          }),
          h(
            'div',
            { class: 'conv-sub muted nowrap', 'data-col': 'deployment' },
            h('span', { class: 'clip', title: c.deployment || null, text: c.deployment || '—' }),
            ' · ',
            h('span', {
              class: 'clip',
              title: c.upstream_model || null,
              text: c.upstream_model || '—',
            }),
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
          c.error
            ? h('code', {
                class: 'text-bad small call-error',
                'data-testid': 'call-error',
                title: c.error,
                text: c.error.length > 120 ? `${c.error.slice(0, 119)}…` : c.error,
              })
            : null,
        ),
    },
    {
      label: 'Latency',
      num: true,
      cell: (c) => h('span', { 'data-col': 'latency', text: fmtMs(c.duration_ms) }),
    },
    { label: 'Billed by', cell: billedCell },
    { label: 'Cost', num: true, cell: costCell },
    {
      label: 'Team · key',
      heading: 'Team',
      sub: 'key',
      cell: (c) => teamKeyCell(c, teamName, keyName),
    },
  ];
}

function rowsOf(page) {
  return page.data.map((c) => ({ ...c, attrs: { 'data-request-id': c.id } }));
}

export async function callsPage(root, params) {
  const filters = filtersOf(params);
  const limit = filters.limit || DEFAULT_LIMIT;
  root.append(
    pageHeader(
      'API calls',
      isAdmin()
        ? 'Embeddings, images, audio, moderations and rerank calls, newest first: what each was billed by and its cost.'
        : `Team ${ownTeamName()}'s embeddings, images, audio, moderations and rerank calls, newest first (read-only).`,
    ),
  );
  const form = h('form', { class: 'filters', 'data-testid': 'call-filters' });
  const results = h('div', {}, loading());
  root.append(panel(null, form), results);

  const [models, teams, keys] = await filterChoices();
  // A value the URL names that no list has (an endpoint added later, a page size typed in) is
  // kept as an option of its own, so the form shows what the page lists.
  const withCurrent = (options, value) =>
    value && !options.some(([v]) => v === value) ? [...options, [value, value]] : options;
  append(
    form,
    h(
      'div',
      { class: 'filter-grid' },
      field(
        'Endpoint',
        select(
          'endpoint',
          withCurrent([['', 'All endpoints'], ...ENDPOINTS], filters.endpoint),
          filters.endpoint,
          { 'data-testid': 'filter-endpoint' },
        ),
      ),
      field(
        'Status',
        select(
          'status',
          [
            ['', 'Any status'],
            ['completed', 'Completed'],
            ['error', 'Error'],
          ],
          filters.status,
          { 'data-testid': 'filter-status' },
        ),
      ),
      field(
        'Model',
        select(
          'model',
          withCurrent([['', 'All models'], ...models.map((m) => [m, m])], filters.model),
          filters.model,
          { 'data-testid': 'filter-model' },
        ),
      ),
      isAdmin()
        ? field(
            'Team',
            select(
              'team_id',
              withCurrent(
                [['', 'All teams'], ...teams.map((t) => [t.id, `${t.name} (${t.id})`])],
                filters.team_id,
              ),
              filters.team_id,
              { 'data-testid': 'filter-team' },
            ),
          )
        : null,
      isAdmin()
        ? field(
            'Key',
            select(
              'key_id',
              withCurrent(
                [
                  ['', 'All keys'],
                  ...keys.map((k) => [k.id, `${k.name || `${k.key_prefix}…`} · ${k.team_id}`]),
                ],
                filters.key_id,
              ),
              filters.key_id,
              { 'data-testid': 'filter-key' },
            ),
          )
        : null,
      field(
        'Per page',
        select(
          'limit',
          withCurrent(
            [
              ['20', '20'],
              ['50', '50'],
              ['100', '100'],
            ],
            limit,
          ),
          limit,
        ),
      ),
    ),
    h(
      'div',
      { class: 'filter-actions' },
      h('a', { class: 'btn btn-ghost btn-small', href: href('/requests') }, 'Reset'),
      h('span', { class: 'field-hint', text: 'The same filters as GET /v1/requests.' }),
    ),
  );
  form.addEventListener('change', (event) =>
    applySoon(
      () => go('/requests', urlParams(Object.fromEntries(new FormData(form).entries()))),
      event.target,
    ),
  );
  form.addEventListener('submit', (event) => event.preventDefault());

  const fetchPage = (after) => api(`/v1/requests${query({ ...filters, limit, after })}`);
  const first = await fetchPage(null);
  const { teams: teamName, keys: keyName } = knownNames(teams, keys);
  const cols = columns(teamName, keyName);
  const filtered = FILTERS.some((name) => name !== 'limit' && filters[name]);
  const list = table(
    cols,
    rowsOf(first),
    filtered
      ? 'No API call matches these filters.'
      : 'No API calls yet: embeddings, images, audio, moderations and rerank calls show here once made.',
  );
  let shown = first.data.length;
  let cursor = first.has_more ? first.cursor : null;
  const summary = h('span', { class: 'muted', role: 'status', 'data-testid': 'calls-summary' });
  const more = h(
    'button',
    { class: 'btn btn-small', type: 'button', 'data-testid': 'load-more' },
    'Load more',
  );
  const problem = h('div', {});
  const update = () => {
    summary.textContent = `${plural(shown, 'call')} shown${cursor ? ', more to load' : ''}`;
    more.hidden = !cursor;
  };
  more.addEventListener('click', async () => {
    more.disabled = true;
    clear(problem);
    try {
      const next = await fetchPage(cursor);
      // The next page's rows, made as the first page's were, go on below them.
      const added = table(cols, rowsOf(next)).querySelectorAll('tbody > tr');
      list.querySelector('tbody')?.append(...added);
      shown += next.data.length;
      cursor = next.has_more ? next.cursor : null;
      update();
      // No more to load: the focus goes on to the table the button was below.
      if (!cursor) list.focus();
    } catch (error) {
      problem.append(errorBox(error));
    } finally {
      more.disabled = false;
    }
  });
  update();
  clear(results).append(
    panel(null, list, shown ? h('div', { class: 'pager' }, summary, more) : null, problem),
  );
}
