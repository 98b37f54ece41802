// The gateway's admin UI: the pieces every view is built from (icons, panels, fields, badges,
// tables, alerts) (an ES module of the page; no build step).

import { adminKeyName } from './api.js';
import { h, s } from './dom.js';
import { shortId } from './format.js';

const ICONS = {
  chat: [['path', { d: 'M20 11.5a7.5 7.5 0 0 1-10.9 6.7L4 19.5l1.3-4.6A7.5 7.5 0 1 1 20 11.5z' }]],
  chart: [['path', { d: 'M4 20h16M7 16v-5M12 16V6M17 16v-8' }]],
  key: [
    ['circle', { cx: 8, cy: 15, r: 4 }],
    ['path', { d: 'M11 12l8.5-8.5M16 7l2.5 2.5M13.5 9.5l2 2' }],
  ],
  branch: [
    ['circle', { cx: 6, cy: 5, r: 2 }],
    ['circle', { cx: 6, cy: 19, r: 2 }],
    ['circle', { cx: 18, cy: 7, r: 2 }],
    ['path', { d: 'M6 7v10M18 9c0 5-12 3-12 8' }],
  ],
  tool: [
    [
      'path',
      {
        d: 'M14.7 6.3a4 4 0 0 0-5.4 5.4L4 17l3 3 5.3-5.3a4 4 0 0 0 5.4-5.4l-2.5 2.5-2.5-.5-.5-2.5z',
      },
    ],
  ],
  play: [['path', { d: 'M7 5l12 7-12 7z', fill: 'currentColor' }]],
  calls: [
    ['path', { d: 'M9 6h11M9 12h11M9 18h11' }],
    ['path', { d: 'M4.5 6h.01M4.5 12h.01M4.5 18h.01', 'stroke-width': 2.6 }],
  ],
  server: [
    ['rect', { x: 4, y: 4, width: 16, height: 6, rx: 1.5 }],
    ['rect', { x: 4, y: 14, width: 16, height: 6, rx: 1.5 }],
    ['path', { d: 'M8 7h.01M8 17h.01' }],
  ],
};

export function icon(name, size = 18, cls = 'nav-icon') {
  return s(
    'svg',
    {
      viewBox: '0 0 24 24',
      width: size,
      height: size,
      fill: 'none',
      stroke: 'currentColor',
      'stroke-width': 1.8,
      'stroke-linecap': 'round',
      'stroke-linejoin': 'round',
      'aria-hidden': 'true',
      class: cls,
    },
    ICONS[name].map(([tag, attrs]) => s(tag, attrs)),
  );
}

export function pageHeader(title, subtitle, ...actions) {
  return h(
    'header',
    { class: 'page-header' },
    h(
      'div',
      {},
      h('h1', { text: title }),
      subtitle ? h('p', { class: 'subtitle' }, subtitle) : null,
    ),
    actions.length ? h('div', { class: 'page-actions' }, actions) : null,
  );
}

export function errorBox(error) {
  const status = error.status
    ? `HTTP ${error.status}`
    : error.name === 'AbortError'
      ? 'Cancelled'
      : 'Error';
  return h(
    'div',
    { class: 'alert alert-error', role: 'alert', 'data-testid': 'api-error' },
    h('strong', {}, status + (error.code ? ` · ${error.code}` : '')),
    h('span', {}, error.message || String(error)),
  );
}

export function notice(text, kind = 'info') {
  return h('div', { class: `alert alert-${kind}` }, text);
}

export function loading(text = 'Loading…') {
  return h('div', { class: 'loading', 'aria-busy': 'true' }, h('span', { class: 'spinner' }), text);
}

export function badge(text, kind = 'neutral', extra = {}) {
  return h('span', { class: `badge badge-${kind}`, ...extra }, text);
}

const STATUS_KIND = {
  completed: 'ok',
  interrupted: 'warn',
  aborted: 'warn',
  cancelled: 'warn',
  error: 'bad',
  active: 'info',
  healthy: 'ok',
  cooling: 'bad',
  half_open: 'warn',
  revoked: 'bad',
  expired: 'warn',
};

// The words a state is shown by, the same on every page (the API's `active` is a turn in progress).
const STATUS_WORD = { active: 'in progress', aborted: 'interrupted' };

export function statusBadge(status) {
  const word = STATUS_WORD[status] || status || 'empty';
  return badge(word, STATUS_KIND[status] || 'neutral', { 'data-status': status || '' });
}

export function panel(title, ...children) {
  return h(
    'section',
    { class: 'panel' },
    title ? h('h2', { class: 'panel-title' }, title) : null,
    children,
  );
}

export function field(label, control, hint) {
  return h(
    'label',
    { class: 'field' },
    h('span', { class: 'field-label', text: label }),
    control,
    hint ? h('span', { class: 'field-hint', text: hint }) : null,
  );
}

export function select(name, options, value, props = {}) {
  return h(
    'select',
    { name, value: value || '', ...props },
    options.map(([v, label]) => h('option', { value: v }, label)),
  );
}

export function idCell(id, link) {
  const text = h('code', { class: 'id', title: id, text: shortId(id) });
  return link ? h('a', { href: link, class: 'id-link' }, text) : text;
}

// A row's team and, under it, its key, by name where the names are known (the conversation
// list's and the API calls' "Team · key" column).
export function teamKeyCell(row, teamName, keyName) {
  return h(
    'div',
    { class: 'team-key' },
    row.team_id
      ? h('span', {
          class: 'clip',
          'data-col': 'team',
          title: row.team_id,
          text: teamName.get(row.team_id) || row.team_id,
        })
      : h('span', { class: 'muted', 'data-col': 'team', text: 'none' }),
    h(
      'div',
      { class: 'conv-sub', 'data-col': 'key' },
      row.key_id
        ? keyName.has(row.key_id)
          ? h('span', { class: 'clip', title: row.key_id, text: keyName.get(row.key_id) })
          : idCell(row.key_id)
        : h('span', { class: 'muted', text: adminKeyName() }),
    ),
  );
}

export function table(columns, rows, empty = 'Nothing here yet.', sorting = null) {
  if (!rows.length) return h('div', { class: 'empty' }, empty);
  const trs = rows.map((row) =>
    h(
      'tr',
      row.attrs || {},
      columns.map((c) => h('td', { class: c.num ? 'num' : c.grow ? 'grow' : null }, c.cell(row))),
    ),
  );
  const tbody = h('tbody', {}, trs);
  // A header shows `heading` when it has one (its `label` names it to the sort buttons), and
  // `sub` on a second line: a second sort button when the column has `subSortKey` (two figures
  // in one cell, one above the other).
  const heads = columns.map((c) =>
    h(
      'th',
      { class: c.num ? 'num' : null, scope: 'col' },
      c.sort || c.sortKey ? null : c.heading || c.label,
    ),
  );
  // A column with `sortKey` is sorted by whoever made the rows (`sorting`: { by, order, onSort }):
  // its header button asks for that order, and says which one the rows are in.
  const sortButton = (key, label, text) =>
    h(
      'button',
      {
        class: 'sort-button',
        type: 'button',
        name: `sort-${key}`,
        'data-sort': label,
        onclick: () => sorting.onSort(key, `sort-${key}`),
      },
      text,
    );
  columns.forEach((c, i) => {
    if (!c.sortKey) return;
    const active = [c.sortKey, c.subSortKey].includes(sorting.by);
    if (active)
      heads[i].setAttribute('aria-sort', sorting.order === 'asc' ? 'ascending' : 'descending');
    heads[i].append(sortButton(c.sortKey, c.label, c.heading || c.label));
    if (c.subSortKey) {
      const button = sortButton(c.subSortKey, c.sub, c.sub);
      // The header says the order; its arrow goes on the button that set it.
      if (sorting.by === c.subSortKey) heads[i].firstChild.dataset.inactive = 'true';
      else button.dataset.inactive = 'true';
      heads[i].append(h('span', { class: 'th-sub' }, button));
    }
  });
  // A column with `sort` (row -> number or string) sorts the rows shown, by a header button.
  columns.forEach((c, i) => {
    if (!c.sort) return;
    const button = h(
      'button',
      {
        class: 'sort-button',
        type: 'button',
        'data-sort': c.label,
        onclick: () => {
          const descending = heads[i].getAttribute('aria-sort') !== 'descending';
          for (const th of heads) th.removeAttribute('aria-sort');
          heads[i].setAttribute('aria-sort', descending ? 'descending' : 'ascending');
          const keyed = rows.map((row, n) => [c.sort(row), trs[n]]);
          keyed.sort(([a], [b]) => {
            if (a === b) return 0;
            if (a === null || a === undefined) return 1; // unknown values last either way
            if (b === null || b === undefined) return -1;
            return (a < b ? -1 : 1) * (descending ? -1 : 1);
          });
          tbody.append(...keyed.map(([, tr]) => tr));
        },
      },
      c.heading || c.label,
    );
    heads[i].append(button);
  });
  columns.forEach((c, i) => {
    // After a space: the header's text reads as its label does.
    if (c.sub && !c.subSortKey) heads[i].append(h('span', { class: 'th-sub', text: ` ${c.sub}` }));
  });
  // It may scroll sideways (a phone): reachable from the keyboard.
  return h(
    'div',
    {
      class: 'table-wrap',
      tabindex: '0',
      role: 'region',
      'aria-label': 'Table, scrolls sideways when narrow',
    },
    h('table', { class: 'table' }, h('thead', {}, h('tr', {}, heads)), tbody),
  );
}

export function stat(label, value, hint, testid) {
  return h(
    'div',
    { class: 'stat', 'data-testid': testid },
    h('div', { class: 'stat-label', text: label }),
    h('div', { class: 'stat-value', text: value }),
    hint ? h('div', { class: 'stat-hint', text: hint }) : null,
  );
}

export function metaItem(label, value) {
  return h('div', { class: 'meta-item' }, h('dt', { text: label }), h('dd', {}, value));
}

export function turnBadge(_turn, end, inherited) {
  if (end) return statusBadge(end.status === 'aborted' ? 'interrupted' : end.status);
  // An inherited turn is finished (a branch is made from finished turns only); its `turn/end`
  // lies past the branch point when the branch was made inside it.
  if (inherited)
    return badge('finished in the parent', 'neutral', { 'data-testid': 'inherited-turn' });
  return badge('in progress', 'info');
}
