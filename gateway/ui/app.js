// The gateway's admin UI: ES modules (this one the page's entry, with the views; dom.js,
// format.js and markdown.js its helpers), hash routing, no build step, nothing loaded from
// anywhere but the gateway itself (the Content-Security-Policy allows nothing else).
//
// Auth: the operator pastes a key: the master key for everything, or a team's virtual key for a
// read-only view of that team's conversations and usage. The key is kept in sessionStorage (it
// goes when the tab closes; localStorage when the operator opts in to being remembered on this
// device, until sign-out) and sent as `Authorization: Bearer` on every API call. No cookies
// are used, so a browser never attaches a credential on its own: a request forged by another
// site carries no key, and there is no CSRF surface.

import { append, clear, h, s } from './dom.js';
import { ZONE, fmtAgo, fmtCompact, fmtInt, fmtMs, fmtPct, fmtTime, fmtUsd, pad, plural, shortId, textOf } from './format.js';
import { folded, prettyJson, richText } from './markdown.js';

const KEY_STORAGE = 'gateway.admin.key';
// The gateway's root as this page sees it ("/" or a proxy's prefix): the page is at <root>ui/.
const ROOT = location.pathname.replace(/ui\/[^/]*$/, '');

const session = { key: null, me: null };
let cleanups = [];

// ---------------------------------------------------------------------------------------------
// The API

class ApiError extends Error {
  constructor(status, message, code, param) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

async function request(path, { method = 'GET', body, headers = {}, signal } = {}) {
  const all = { Accept: 'application/json', ...headers };
  if (session.key) all.Authorization = `Bearer ${session.key}`;
  const init = { method, headers: all, signal, cache: 'no-store', credentials: 'omit' };
  if (body !== undefined) {
    all['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  try {
    return await fetch(ROOT + path.replace(/^\//, ''), init);
  } catch (error) {
    if (error.name === 'AbortError') throw error;
    throw new ApiError(0, `The gateway cannot be reached (${error.message}).`, 'network_error');
  }
}

async function errorOf(response) {
  const text = await response.text();
  let error = {};
  try {
    error = JSON.parse(text).error || {};
  } catch {
    error = { message: text.slice(0, 300) };
  }
  return new ApiError(response.status, error.message || response.statusText, error.code, error.param);
}

async function api(path, options) {
  const response = await request(path, options);
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401 && session.key !== null && !options?.login) {
      signOut(`Your key was refused: ${error.message}`);
    }
    throw error;
  }
  return response.status === 204 ? null : response.json();
}

function query(params) {
  const out = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') out.set(name, value);
  }
  const text = out.toString();
  return text ? `?${text}` : '';
}

const enc = encodeURIComponent;

// ---------------------------------------------------------------------------------------------
// Routing

function currentRoute() {
  const raw = location.hash.replace(/^#/, '') || '/conversations';
  const [path, search] = raw.split('?');
  return {
    path,
    parts: path.split('/').filter(Boolean).map(decodeURIComponent),
    query: new URLSearchParams(search || ''),
  };
}

function href(path, params = {}) {
  return `#${path}${query(params)}`;
}

function go(path, params = {}) {
  const target = href(path, params);
  if (location.hash === target) render();
  else location.hash = target;
}

function adminKeyName() {
  // Turns made with the master key (or on an open gateway) carry no key id.
  return session.me && session.me.open ? 'none (open)' : 'master key';
}

function isAdmin() {
  return Boolean(session.me && session.me.is_admin);
}

const PAGES = [
  { path: 'conversations', label: 'Conversations', icon: 'chat', admin: false },
  { path: 'usage', label: 'Usage', icon: 'chart', admin: false },
  { path: 'keys', label: 'Keys & teams', icon: 'key', admin: true },
  { path: 'deployments', label: 'Deployments', icon: 'server', admin: true },
];

const ICONS = {
  chat: [['path', { d: 'M20 11.5a7.5 7.5 0 0 1-10.9 6.7L4 19.5l1.3-4.6A7.5 7.5 0 1 1 20 11.5z' }]],
  chart: [['path', { d: 'M4 20h16M7 16v-5M12 16V6M17 16v-8' }]],
  key: [['circle', { cx: 8, cy: 15, r: 4 }], ['path', { d: 'M11 12l8.5-8.5M16 7l2.5 2.5M13.5 9.5l2 2' }]],
  branch: [['circle', { cx: 6, cy: 5, r: 2 }], ['circle', { cx: 6, cy: 19, r: 2 }], ['circle', { cx: 18, cy: 7, r: 2 }], ['path', { d: 'M6 7v10M18 9c0 5-12 3-12 8' }]],
  tool: [['path', { d: 'M14.7 6.3a4 4 0 0 0-5.4 5.4L4 17l3 3 5.3-5.3a4 4 0 0 0 5.4-5.4l-2.5 2.5-2.5-.5-.5-2.5z' }]],
  play: [['path', { d: 'M7 5l12 7-12 7z', fill: 'currentColor' }]],
  server: [['rect', { x: 4, y: 4, width: 16, height: 6, rx: 1.5 }], ['rect', { x: 4, y: 14, width: 16, height: 6, rx: 1.5 }], ['path', { d: 'M8 7h.01M8 17h.01' }]],
};

function icon(name, size = 18, cls = 'nav-icon') {
  return s('svg', { viewBox: '0 0 24 24', width: size, height: size, fill: 'none', stroke: 'currentColor', 'stroke-width': 1.8, 'stroke-linecap': 'round', 'stroke-linejoin': 'round', 'aria-hidden': 'true', class: cls },
    ICONS[name].map(([tag, attrs]) => s(tag, attrs)));
}

// A live refresh re-renders in place: the scroll position and a half-typed message stay.
let refreshing = false;

async function render() {
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
  const live = refreshing;
  refreshing = false;
  const scrollY = live ? window.scrollY : 0;
  const draft = live ? document.querySelector('[data-testid=composer-input]')?.value : null;
  const app = document.getElementById('app');
  const route = currentRoute();
  if (route.parts[0] === 'login' || (!session.me && !(await restore()))) {
    clear(app).append(loginPage(route.query.get('reason')));
    document.title = 'Sign in · Gateway admin';
    return;
  }
  const section = route.parts[0] || 'conversations';
  const page = PAGES.find((p) => p.path === section);
  const content = h('div', { class: 'page', 'data-page': section });
  clear(app).append(shell(section, content));
  document.title = `${page ? page.label : 'Not found'} · Gateway admin`;
  if (!live) window.scrollTo(0, 0);
  try {
    if (!page) throw new ApiError(404, `There is no page '${route.path}'.`, 'not_found');
    if (page.admin && !isAdmin()) {
      content.append(
        pageHeader(page.label),
        notice('This section needs the master key: a team key sees its own conversations and usage only.'),
      );
      return;
    }
    if (section === 'conversations' && route.parts[1]) await conversationPage(content, route.parts[1], route.query);
    else if (section === 'conversations') await conversationsPage(content, route.query);
    else if (section === 'usage') await usagePage(content, route.query);
    else if (section === 'keys') await keysPage(content);
    else if (section === 'deployments') await deploymentsPage(content);
  } catch (error) {
    // Whatever was still loading when it failed stops saying so.
    for (const spinner of content.querySelectorAll('.loading')) spinner.remove();
    content.append(errorBox(error));
  }
  if (live) {
    const composerInput = document.querySelector('[data-testid=composer-input]');
    if (composerInput && draft) composerInput.value = draft;
    window.scrollTo(0, scrollY);
  }
  restoreFocus();
}

// A filter applied from the keyboard re-renders the page: focus goes back to the same control.
let focusAfterRender = null;

function restoreFocus() {
  if (!focusAfterRender) return;
  const target = document.querySelector(`.page [name="${focusAfterRender}"]`);
  focusAfterRender = null;
  if (target) target.focus();
}

// Auto-applied selects wait for the keyboard to settle: arrowing through a select's options
// applies the one it stops on, once, and keeps the focus there.
function applySoon(apply, control) {
  clearTimeout(applySoon.timer);
  cleanups.push(() => clearTimeout(applySoon.timer));
  applySoon.timer = setTimeout(() => {
    if (document.activeElement === control) focusAfterRender = control.name;
    apply();
  }, 450);
}

async function restore() {
  // This tab's key, or one remembered on this device (opted in at sign-in).
  const key = sessionStorage.getItem(KEY_STORAGE) ?? localStorage.getItem(KEY_STORAGE);
  if (key === null) return false;
  session.key = key || null;
  try {
    session.me = await api('/v1/me', { login: true });
    return true;
  } catch {
    forgetKey();
    session.key = null;
    return false;
  }
}

function forgetKey() {
  sessionStorage.removeItem(KEY_STORAGE);
  localStorage.removeItem(KEY_STORAGE);
}

function signOut(reason) {
  forgetKey();
  session.key = null;
  session.me = null;
  // A refused key comes back to where it was; signing out on purpose starts afresh.
  const here = location.hash.replace(/^#/, '');
  go('/login', { reason, next: reason && here && !here.startsWith('/login') ? here : '' });
}

// ---------------------------------------------------------------------------------------------
// Common pieces

function shell(section, content) {
  const me = session.me;
  const who = me.kind === 'key'
    ? h('div', { class: 'who' }, h('span', { class: 'badge badge-team', text: 'Team key · read-only' }),
      h('div', { class: 'who-detail', text: `team ${me.team_id}` }))
    : h('div', { class: 'who' }, h('span', { class: 'badge badge-admin', text: me.kind === 'open' ? 'Open gateway · admin' : 'Master key · admin' }));
  const nav = h('nav', { class: 'nav', 'aria-label': 'Sections' },
    PAGES.filter((p) => !p.admin || isAdmin()).map((p) =>
      h('a', { href: href(`/${p.path}`), class: p.path === section ? 'nav-link active' : 'nav-link', 'aria-current': p.path === section ? 'page' : null },
        icon(p.icon), p.label)));
  return h('div', { class: 'layout' }, skipLink(),
    h('aside', { class: 'sidebar' }, h('div', { class: 'sidebar-inner' },
      h('div', { class: 'brand' }, h('img', { src: 'favicon.svg', alt: '', width: 22, height: 22 }), h('span', { text: 'Gateway' })),
      nav,
      h('div', { class: 'sidebar-foot' }, who,
        h('button', { class: 'btn btn-ghost btn-small', type: 'button', onclick: () => signOut(), 'data-testid': 'sign-out' }, 'Sign out')))),
    h('main', { class: 'main', id: 'main', tabindex: '-1' }, content));
}

function skipLink() {
  // Not an `#main` link: the hash is the route.
  return h('a', {
    class: 'skip-link', href: '#main', 'data-testid': 'skip-link',
    onclick: (event) => {
      event.preventDefault();
      document.getElementById('main')?.focus();
    },
  }, 'Skip to content');
}

function pageHeader(title, subtitle, ...actions) {
  return h('header', { class: 'page-header' },
    h('div', {}, h('h1', { text: title }), subtitle ? h('p', { class: 'subtitle' }, subtitle) : null),
    actions.length ? h('div', { class: 'page-actions' }, actions) : null);
}

function errorBox(error) {
  const status = error.status ? `HTTP ${error.status}` : error.name === 'AbortError' ? 'Cancelled' : 'Error';
  return h('div', { class: 'alert alert-error', role: 'alert', 'data-testid': 'api-error' },
    h('strong', {}, status + (error.code ? ` · ${error.code}` : '')),
    h('span', {}, error.message || String(error)));
}

function notice(text, kind = 'info') {
  return h('div', { class: `alert alert-${kind}` }, text);
}

function loading(text = 'Loading…') {
  return h('div', { class: 'loading', 'aria-busy': 'true' }, h('span', { class: 'spinner' }), text);
}

function badge(text, kind = 'neutral', extra = {}) {
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

function statusBadge(status) {
  return badge(status || 'empty', STATUS_KIND[status] || 'neutral', { 'data-status': status || '' });
}

function panel(title, ...children) {
  return h('section', { class: 'panel' }, title ? h('h2', { class: 'panel-title' }, title) : null, children);
}

function field(label, control, hint) {
  return h('label', { class: 'field' }, h('span', { class: 'field-label', text: label }), control, hint ? h('span', { class: 'field-hint', text: hint }) : null);
}

function select(name, options, value, props = {}) {
  return h('select', { name, value: value || '', ...props },
    options.map(([v, label]) => h('option', { value: v }, label)));
}

function idCell(id, link) {
  const text = h('code', { class: 'id', title: id, text: shortId(id) });
  return link ? h('a', { href: link, class: 'id-link' }, text) : text;
}

function table(columns, rows, empty = 'Nothing here yet.') {
  if (!rows.length) return h('div', { class: 'empty' }, empty);
  const trs = rows.map((row) => h('tr', row.attrs || {}, columns.map((c) => h('td', { class: c.num ? 'num' : null }, c.cell(row)))));
  const tbody = h('tbody', {}, trs);
  const heads = columns.map((c) => h('th', { class: c.num ? 'num' : null, scope: 'col' }, c.sort ? null : c.label));
  // A column with `sort` (row -> number or string) sorts the rows shown, by a header button.
  columns.forEach((c, i) => {
    if (!c.sort) return;
    const button = h('button', {
      class: 'sort-button', type: 'button', 'data-sort': c.label,
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
    }, c.label);
    heads[i].append(button);
  });
  // It may scroll sideways (a phone): reachable from the keyboard.
  return h('div', { class: 'table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Table, scrolls sideways when narrow' },
    h('table', { class: 'table' }, h('thead', {}, h('tr', {}, heads)), tbody));
}

function utcDay(value) {
  // <input type=date> value -> Unix seconds at that UTC midnight.
  return value ? Date.parse(`${value}T00:00:00Z`) / 1000 : null;
}

// ---------------------------------------------------------------------------------------------
// Login

function loginPage(reason) {
  const input = h('input', { type: 'password', name: 'key', id: 'key', autocomplete: 'off', spellcheck: 'false', placeholder: 'Master key or gw-… team key', 'data-testid': 'login-key' });
  const error = h('div', { class: 'login-error' });
  if (reason) error.append(notice(reason, 'warn'));
  const button = h('button', { class: 'btn btn-primary btn-block', type: 'submit', 'data-testid': 'login-submit' }, 'Sign in');
  const remember = h('input', { type: 'checkbox', name: 'remember', 'data-testid': 'login-remember' });
  const rememberField = h('label', { class: 'check' }, remember, 'Remember on this device (until you sign out)');
  const form = h('form', {
    class: 'login-form',
    onsubmit: async (event) => {
      event.preventDefault();
      clear(error);
      button.disabled = true;
      session.key = input.value.trim() || null;
      try {
        session.me = await api('/v1/me', { login: true });
        sessionStorage.setItem(KEY_STORAGE, session.key || '');
        if (remember.checked) localStorage.setItem(KEY_STORAGE, session.key || '');
        else localStorage.removeItem(KEY_STORAGE);
        // Back to the page that was opened (a deep link), or that was left when signed out.
        const route = currentRoute();
        const next = route.parts[0] === 'login' ? route.query.get('next') : location.hash.replace(/^#/, '');
        if (next && !next.startsWith('/login')) {
          if (location.hash === `#${next}`) render();
          else location.hash = `#${next}`;
        } else {
          go('/conversations');
        }
      } catch (failure) {
        session.key = null;
        session.me = null;
        error.append(failure.status === 401
          ? notice(`That key was refused: ${failure.message}`, 'error')
          : errorBox(failure));
      } finally {
        button.disabled = false;
      }
    },
  }, field('API key', input), rememberField, button, error);
  setTimeout(() => input.focus(), 0);
  return h('div', { class: 'login' }, h('div', { class: 'login-card' },
    h('div', { class: 'brand brand-dark' }, h('img', { src: 'favicon.svg', alt: '', width: 28, height: 28 }), h('span', { text: 'Gateway admin' })),
    h('p', { class: 'login-lead' }, 'Sign in with the master key to manage everything, or with a team\'s virtual key for a read-only view of that team\'s conversations and usage.'),
    form,
    h('p', { class: 'login-note' }, 'The key stays in this browser tab (sessionStorage), or on this device (localStorage) if you ask, until you sign out; it is sent only to this gateway, as a bearer token. A gateway running without a master key accepts an empty key.')));
}

// ---------------------------------------------------------------------------------------------
// Conversations: the list

const PAGE_STACK = new Map(); // filters -> the cursors of the pages before this one
let listHash = null; // the list as last shown (filters and page), for the way back to it

async function conversationsPage(root, params) {
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

// ---------------------------------------------------------------------------------------------
// Conversations: one conversation

function groupTurns(events) {
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

function attemptsOf(turn, usageById) {
  const attempts = new Map();
  const get = (number) => {
    if (!attempts.has(number)) attempts.set(number, { number, events: [] });
    return attempts.get(number);
  };
  for (const event of turn.events) {
    const p = event.payload;
    if (event.type === 'assistant/attempt' || (event.type === 'assistant/message' && p.source !== 'client')) {
      const attempt = get(p.attempt || attempts.size + 1);
      attempt.event = event;
      attempt.route = p.route || {};
      attempt.stream = p.stream || [];
      attempt.providerUsage = p.usage;
      if (event.type === 'assistant/attempt') attempt.outcome = p.reason === 'empty_prefix' ? 'cancelled' : 'error';
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
  return { first: first ? first.t : null, last: deltas.length ? deltas[deltas.length - 1].t : null };
}

async function conversationPage(root, id, params) {
  const view = params.get('view') === 'trajectory' ? 'trajectory' : 'chat';
  root.append(loading());
  const [events, info, branches, usage] = await Promise.all([
    api(`/v1/conversations/${enc(id)}/events`),
    api(`/v1/conversations${query({ id, limit: 1 })}`),
    api(`/v1/conversations${query({ parent_id: id, limit: 100 })}`),
    api(`/v1/conversations/${enc(id)}/usage`),
  ]);
  clear(root);
  const conversation = info.data[0] || { id };
  const turns = groupTurns(events.data);
  const usageById = new Map(usage.data.map((u) => [u.id, u]));
  const lastAlias = [...usage.data].reverse().find((u) => u.alias)?.alias;

  const tabs = h('div', { class: 'tabs', role: 'tablist' },
    [['chat', 'Chat'], ['trajectory', 'Trajectory']].map(([name, label]) =>
      h('a', { href: href(`/conversations/${enc(id)}`, name === 'chat' ? {} : { view: name }), role: 'tab', class: view === name ? 'tab active' : 'tab', 'aria-selected': view === name ? 'true' : 'false', 'data-testid': `tab-${name}` }, label)));
  const meta = h('dl', { class: 'meta' },
    metaItem('Status', statusBadge(conversation.status)),
    metaItem('Model', conversation.model || lastAlias || '—'),
    metaItem('Team', conversation.team_id || '—'),
    metaItem('Key', conversation.key_id ? idCell(conversation.key_id) : adminKeyName()),
    metaItem(`Created (${ZONE})`, fmtTime(conversation.created_at)),
    metaItem('Turns', String(turns.length)),
    conversation.parent_id ? metaItem('Branch of', h('span', {}, idCell(conversation.parent_id, href(`/conversations/${enc(conversation.parent_id)}`)), ` at seq ${conversation.parent_seq}`)) : null);
  root.append(
    h('nav', { class: 'crumbs', 'aria-label': 'Breadcrumb' }, h('a', { href: listHash || href('/conversations'), text: 'Conversations', 'data-testid': 'crumb-list' }), ' / ', h('code', { text: id })),
    h('header', { class: 'page-header' },
      h('div', {}, h('h1', { class: 'conv-title', text: conversation.preview || 'Conversation' }), h('p', { class: 'subtitle' }, h('code', { class: 'id', text: id }))),
      tabs),
    panel(null, meta));

  const body = h('div', { class: 'conv-body' });
  const side = h('aside', { class: 'conv-side' }, branchesPanel(conversation, branches.data));
  root.append(h('div', { class: 'conv-layout' }, body, side));
  if (view === 'chat') chatView(body, id, turns, branches.data, lastAlias);
  else trajectoryView(body, id, turns, usageById);
  if (turns.some((t) => t.conversation_id === id && !t.end)) liveRefresh(root, id, events.data.length);
}

function liveRefresh(root, id, seen) {
  // A turn in progress: the page follows its events until they change, then shows them (and
  // goes on following while a turn is still open).
  root.querySelector('.page-header')?.append(h('span', { class: 'live', role: 'status', 'data-testid': 'live' },
    h('span', { class: 'live-dot', 'aria-hidden': 'true' }), 'Live: a turn is in progress'));
  let stopped = false;
  let timer = null;
  const poll = async () => {
    try {
      const fresh = await api(`/v1/conversations/${enc(id)}/events`);
      if (stopped) return;
      if (fresh.data.length !== seen) {
        refreshing = true;
        render();
        return;
      }
    } catch {
      if (stopped) return; // left the page meanwhile; else try again
    }
    timer = setTimeout(poll, 1500);
  };
  timer = setTimeout(poll, 1500);
  cleanups.push(() => {
    stopped = true;
    clearTimeout(timer);
  });
}

function metaItem(label, value) {
  return h('div', { class: 'meta-item' }, h('dt', { text: label }), h('dd', {}, value));
}

function branchesPanel(conversation, branches) {
  const items = branches.map((b) => h('li', { class: 'branch-item', 'data-branch-id': b.id },
    h('a', { href: href(`/conversations/${enc(b.id)}`) }, h('code', { text: shortId(b.id) })),
    h('span', { class: 'muted', text: ` at seq ${b.parent_seq} · ${b.turns} turn${b.turns === 1 ? '' : 's'} · ` }),
    statusBadge(b.status)));
  return panel('Branches',
    conversation.parent_id
      ? h('p', { class: 'branch-parent' }, 'This is a branch of ', h('a', { href: href(`/conversations/${enc(conversation.parent_id)}`) }, h('code', { text: shortId(conversation.parent_id) })), ` from seq ${conversation.parent_seq}.`)
      : h('p', { class: 'muted', text: 'This conversation is not a branch.' }),
    items.length ? h('ul', { class: 'branch-list', 'data-testid': 'branch-list' }, items) : h('p', { class: 'muted', text: 'No branches made from it yet.' }),
    h('p', { class: 'field-hint', text: isAdmin() ? '"Branch here" on a finished turn starts a new conversation whose history ends at that turn.' : '' }));
}

function contentBlocks(blocks, { interrupted }) {
  const out = [];
  for (const block of blocks || []) {
    if (block.type === 'reasoning') {
      out.push(h('details', { class: 'reasoning' }, h('summary', {}, 'Reasoning'), h('div', { class: 'reasoning-text', text: block.text || '' })));
    } else if (block.type === 'text' && interrupted) {
      // Exactly as delivered: the text, not a rendering of it.
      out.push(h('div', { class: 'msg-text', 'data-testid': 'assistant-text', text: block.text || '' }));
    } else if (block.type === 'text') {
      out.push(folded(richText(block.text || ''), (block.text || '').length));
    } else if (block.type === 'tool_call') {
      out.push(h('div', { class: 'tool-call' },
        h('div', { class: 'tool-head' }, icon('tool', 14, 'inline-icon'), 'Tool call ', h('code', { text: block.name || '?' }), h('span', { class: 'muted', text: ` ${block.id || ''}` })),
        h('pre', { class: 'code', text: prettyJson(block.arguments) })));
    } else {
      out.push(h('div', { class: 'muted' }, `[${block.type} block]`));
    }
  }
  if (interrupted && !out.length) out.push(h('div', { class: 'msg-text muted', text: '' }));
  return out;
}

function truncatesOf(turns) {
  // `assistant/truncate` events (the log as recorded): message seq -> the latest one.
  const out = new Map();
  for (const turn of turns) {
    for (const event of turn.events) {
      if (event.type === 'assistant/truncate') out.set(event.payload.message_seq, event);
    }
  }
  return out;
}

function cutBlocks(blocks, chars) {
  // gateway.conversations.derive.cut_blocks: what a client showed of `chars` code points.
  const kept = [];
  let left = chars;
  for (const block of blocks || []) {
    if (block.type === 'text') {
      const text = [...(block.text || '')];
      if (text.length > left) {
        if (left > 0) kept.push({ ...block, text: text.slice(0, left).join('') });
        return kept;
      }
      left -= text.length;
    }
    kept.push(block);
  }
  return kept;
}

function textLength(blocks) {
  return (blocks || []).filter((b) => b.type === 'text').reduce((n, b) => n + [...(b.text || '')].length, 0);
}

function chatView(root, conversationId, turns, branches, lastAlias) {
  const list = h('div', { class: 'chat', 'data-testid': 'chat' });
  const truncates = truncatesOf(turns);
  let inheritedShown = false;
  const toolCalls = new Map(); // id -> still without a result
  turns.forEach((turn, index) => {
    const inherited = turn.conversation_id !== conversationId;
    if (inherited && !inheritedShown) {
      inheritedShown = true;
      list.append(h('div', { class: 'divider', text: 'Inherited from the parent conversation' }));
    }
    if (!inherited && inheritedShown) {
      inheritedShown = false;
      list.append(h('div', { class: 'divider', text: 'This branch' }));
    }
    list.append(chatTurn(conversationId, turn, index, inherited, branches, toolCalls, truncates));
  });
  // Tool calls still without a result at the end: model history closes them too.
  if (toolCalls.size && list.lastElementChild) append(list.lastElementChild, syntheticResults(toolCalls));
  if (!turns.length) list.append(h('div', { class: 'empty', text: 'No turns yet.' }));
  root.append(list);
  if (isAdmin()) root.append(composer(conversationId, turns, lastAlias));
}

function chatTurn(conversationId, turn, index, inherited, branches, toolCalls, truncates) {
  const box = h('article', { class: inherited ? 'turn inherited' : 'turn', 'data-turn-id': turn.id });
  const end = turn.end && turn.end.payload;
  const messages = [];
  let answered = false;
  for (const event of turn.events) {
    const p = event.payload;
    if (event.type === 'user/message') {
      messages.push(...syntheticResults(toolCalls));
      messages.push(h('div', { class: 'msg msg-user', 'data-seq': event.seq },
        h('div', { class: 'msg-role' }, 'User', p.name ? h('span', { class: 'muted', text: ` (${p.name})` }) : null, seqTag(event)),
        h('div', { class: 'msg-text', text: textOf(p.content) })));
    } else if (event.type === 'tool/result') {
      toolCalls.delete(p.tool_call_id);
      messages.push(h('div', { class: p.synthetic ? 'msg msg-tool synthetic' : 'msg msg-tool', 'data-seq': event.seq },
        h('div', { class: 'msg-role' }, 'Tool result ', p.synthetic ? badge('synthetic', 'warn') : null, h('code', { class: 'muted', text: ` ${p.tool_call_id || ''}` }), seqTag(event)),
        folded(h('pre', { class: 'code', text: prettyJson(textOf(p.content)) }), textOf(p.content).length)));
    } else if (event.type === 'assistant/attempt' && p.delivered && (p.delivered.content || []).length) {
      // A fault after part of the answer reached the client: the user saw this text, the model
      // never will (it stays in the attempt, outside model history).
      const route = p.route || {};
      messages.push(h('div', { class: 'msg msg-assistant not-in-history', 'data-seq': event.seq, 'data-testid': 'delivered-attempt' },
        h('div', { class: 'msg-role' }, 'Assistant', h('span', { class: 'muted', text: ` · ${route.deployment || ''} · attempt ${p.attempt || '?'}` }), seqTag(event)),
        contentBlocks(p.delivered.content, { interrupted: true }),
        h('div', { class: 'stopped', role: 'note', 'data-testid': 'not-in-history' },
          h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '⚠'), 'Failed after delivery',
          h('span', { class: 'stopped-detail', text: ` · the client was shown this text (${p.delivered.delivery === 'acked' ? 'acknowledged' : 'sent'}), then the attempt failed (${(p.reason || 'error').replace(/_/g, ' ')}); it is not in the model's history` }))));
    } else if (event.type === 'assistant/truncate') {
      // Shown on the message it shortens.
    } else if (event.type === 'assistant/message') {
      messages.push(...syntheticResults(toolCalls));
      answered = true;
      const route = p.route || {};
      const truncate = truncates.get(event.seq);
      const shownBlocks = truncate ? cutBlocks(p.content, truncate.payload.content_chars) : p.content;
      const stopped = p.interrupted
        ? h('div', { class: 'stopped', 'data-testid': 'stopped-marker', role: 'note' },
          h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '■'), 'Stopped',
          h('span', { class: 'stopped-detail', text: ` · ${end && end.reason ? end.reason.replace(/_/g, ' ') : 'interrupted'}; only the delivered text is kept (${p.delivery === 'acked' ? 'acknowledged by the client' : 'sent to the client'})` }))
        : null;
      messages.push(h('div', { class: p.interrupted ? 'msg msg-assistant interrupted' : 'msg msg-assistant', 'data-seq': event.seq, 'data-testid': 'assistant-message' },
        h('div', { class: 'msg-role' }, 'Assistant',
          p.source === 'client' ? badge('from client history', 'neutral') : h('span', { class: 'muted', text: ` · ${route.deployment || ''}` }),
          seqTag(event)),
        contentBlocks(shownBlocks, { interrupted: p.interrupted }),
        stopped,
        truncate ? h('div', { class: 'stopped truncated', role: 'note', 'data-testid': 'truncated-marker' },
          h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '✂'), 'Truncated',
          h('span', { class: 'stopped-detail', text: ` · the client showed ${plural(truncate.payload.content_chars, 'character')} of the ${fmtInt(textLength(p.content))} delivered (assistant/truncate #${truncate.seq}); the model's history keeps only those` })) : null));
      for (const block of p.content || []) if (block.type === 'tool_call') toolCalls.set(block.id, true);
    }
  }
  if (!answered && end) {
    const errors = turn.events.filter((e) => e.type === 'request/error');
    const last = errors[errors.length - 1];
    if (end.status === 'error') {
      messages.push(h('div', { class: 'msg msg-error' },
        h('div', { class: 'msg-role' }, 'Error', seqTag(turn.end)),
        h('div', { class: 'msg-text', text: last ? `${last.payload.status || ''} ${last.payload.code || ''}: ${last.payload.message}` : end.reason || 'The turn failed.' })));
    } else if (end.status === 'aborted' && end.reason !== 'items_added') {
      messages.push(h('div', { class: 'msg msg-assistant interrupted' },
        h('div', { class: 'msg-role' }, 'Assistant', seqTag(turn.end)),
        h('div', { class: 'stopped', 'data-testid': 'stopped-marker' }, h('span', { class: 'stopped-icon', 'aria-hidden': 'true' }, '■'), 'Stopped', h('span', { class: 'stopped-detail', text: ' · before anything was delivered' }))));
    }
  }
  const started = turn.events[0] ? turn.events[0].created_at : null;
  const branchesHere = branches.filter((b) => {
    const seqs = turn.events.map((e) => e.seq);
    return b.parent_seq >= Math.min(...seqs) && b.parent_seq <= Math.max(...seqs);
  });
  const actions = h('div', { class: 'turn-actions' });
  if (turn.end && isAdmin()) {
    actions.append(h('button', {
      class: 'btn btn-small', type: 'button', 'data-testid': 'branch-here', title: `A new conversation whose history ends at seq ${turn.end.seq}`,
      onclick: async (event) => {
        const button = event.currentTarget;
        button.disabled = true;
        try {
          const branch = await api(`/v1/conversations/${enc(conversationId)}/branches`, { method: 'POST', body: { at_seq: turn.end.seq } });
          go(`/conversations/${enc(branch.id)}`);
        } catch (error) {
          button.disabled = false;
          actions.append(errorBox(error));
        }
      },
    }, icon('branch', 14, 'inline-icon'), 'Branch here'));
  }
  append(box,
    h('header', { class: 'turn-head' },
      h('span', { class: 'turn-number', text: `Turn ${index + 1}` }),
      h('span', { class: 'muted', title: ZONE, text: fmtTime(started) }),
      turnBadge(turn, end, inherited),
      branchesHere.length ? h('span', { class: 'branch-note' }, icon('branch', 14, 'inline-icon'), `${branchesHere.length} branch${branchesHere.length > 1 ? 'es' : ''} from here: `,
        branchesHere.map((b) => h('a', { href: href(`/conversations/${enc(b.id)}`) }, h('code', { text: shortId(b.id) })))) : null,
      actions),
    messages);
  return box;
}

function turnBadge(turn, end, inherited) {
  if (end) return statusBadge(end.status === 'aborted' ? 'interrupted' : end.status);
  // An inherited turn is finished (a branch is made from finished turns only); its `turn/end`
  // lies past the branch point when the branch was made inside it.
  if (inherited) return badge('finished in the parent', 'neutral', { 'data-testid': 'inherited-turn' });
  return badge('in progress', 'info');
}

function syntheticResults(toolCalls) {
  // A tool call with no recorded result before the next message gets a synthetic one in model
  // history (derive): shown where it goes, marked.
  const out = [...toolCalls.keys()].map((callId) => h('div', { class: 'msg msg-tool synthetic', 'data-testid': 'synthetic-result' },
    h('div', { class: 'msg-role' }, 'Tool result ', badge('synthetic', 'warn'), h('code', { class: 'muted', text: ` ${callId}` })),
    h('div', { class: 'msg-text', text: 'ABORTED_BEFORE_DISPATCH: no result was recorded, so model history carries this synthetic one.' })));
  toolCalls.clear();
  return out;
}

function seqTag(event) {
  return h('span', { class: 'seq', title: `${event.type}, seq ${event.seq}`, text: `#${event.seq}` });
}

function composer(conversationId, turns, lastAlias) {
  const box = h('section', { class: 'panel composer', 'data-testid': 'composer' });
  const text = h('textarea', { name: 'message', rows: 3, placeholder: 'Continue this conversation…', 'aria-label': 'Message', 'data-testid': 'composer-input' });
  const model = select('model', [], '');
  const send = h('button', { class: 'btn btn-primary', type: 'submit', 'data-testid': 'composer-send' }, 'Send');
  const stop = h('button', { class: 'btn btn-danger', type: 'button', hidden: true, 'data-testid': 'composer-stop' }, 'Stop');
  const output = h('div', { class: 'composer-output' });
  api('/v1/models').then((r) => {
    const ids = r.data.map((m) => m.id);
    append(model, ids.map((id) => h('option', { value: id }, id)));
    model.value = ids.includes(lastAlias) ? lastAlias : ids[0] || '';
  }).catch((error) => output.append(errorBox(error)));
  let controller = null;
  stop.addEventListener('click', () => controller && controller.abort());
  const form = h('form', {
    class: 'composer-form',
    onsubmit: async (event) => {
      event.preventDefault();
      const content = text.value.trim();
      if (!content) return;
      clear(output);
      send.disabled = true;
      stop.hidden = false;
      controller = new AbortController();
      const answer = h('div', { class: 'msg-text', 'data-testid': 'composer-answer' });
      const status = h('div', { class: 'composer-status muted', text: 'Sending…' });
      output.append(
        h('div', { class: 'msg msg-user' }, h('div', { class: 'msg-role', text: 'User' }), h('div', { class: 'msg-text', text: content })),
        h('div', { class: 'msg msg-assistant' }, h('div', { class: 'msg-role', text: 'Assistant' }), answer),
        status);
      let target = conversationId;
      try {
        const history = await api(`/v1/conversations/${enc(conversationId)}/messages`);
        const before = turns.filter((t) => t.conversation_id === conversationId && t.end).length;
        const response = await request('/v1/chat/completions', {
          method: 'POST',
          headers: { 'X-Conversation-Id': conversationId, Accept: 'text/event-stream' },
          body: { model: model.value, stream: true, messages: [...history.data, { role: 'user', content }] },
          signal: controller.signal,
        });
        if (!response.ok) throw await errorOf(response);
        target = response.headers.get('X-Conversation-Id') || conversationId;
        status.textContent = `Streaming from ${response.headers.get('X-Gateway-Deployment') || 'the gateway'}…`;
        await readStream(response, (delta) => { answer.textContent += delta; });
        status.textContent = 'Recording the turn…';
        await waitForTurns(target, target === conversationId ? before + 1 : 1);
        text.value = '';
        go(`/conversations/${enc(target)}`);
      } catch (error) {
        if (error.name === 'AbortError') {
          status.textContent = 'Stopped: the gateway records what reached this page.';
          const own = turns.filter((t) => t.conversation_id === conversationId && t.end).length;
          await waitForTurns(target, target === conversationId ? own + 1 : 1).catch(() => {});
          go(`/conversations/${enc(target)}`);
        } else {
          status.remove();
          output.append(errorBox(error));
        }
      } finally {
        send.disabled = false;
        stop.hidden = true;
        controller = null;
      }
    },
  },
  text,
  h('div', { class: 'composer-row' }, field('Model', model), h('div', { class: 'composer-buttons' }, stop, send)));
  box.append(h('h2', { class: 'panel-title' }, 'Continue as the master key'),
    h('p', { class: 'field-hint composer-hint', text: 'Sends this conversation\'s model history and your message to /v1/chat/completions with X-Conversation-Id, as a client would, and streams the answer here.' }),
    form, output);
  return box;
}

async function readStream(response, onText) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true });
    const frames = buffer.split(/\r?\n\r?\n/);
    buffer = frames.pop();
    for (const frame of frames) {
      for (const line of frame.split(/\r?\n/)) {
        if (!line.startsWith('data:')) continue;
        const data = line.slice(5).trim();
        if (data === '[DONE]') return;
        let chunk;
        try {
          chunk = JSON.parse(data);
        } catch {
          continue;
        }
        if (chunk.error) throw new ApiError(0, chunk.error.message || 'The stream failed.', chunk.error.code);
        const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
        if (delta && delta.content) onText(delta.content);
      }
    }
  }
}

async function waitForTurns(conversationId, count) {
  for (let i = 0; i < 50; i++) {
    const events = await api(`/v1/conversations/${enc(conversationId)}/events`);
    const own = events.data.filter((e) => e.type === 'turn/end' && e.conversation_id === conversationId);
    if (own.length >= count) return;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// -- the trajectory ---------------------------------------------------------------------------

function trajectoryView(root, conversationId, turns, usageById) {
  const list = h('div', { class: 'trajectory', 'data-testid': 'trajectory' });
  turns.forEach((turn, index) => list.append(trajectoryTurn(conversationId, turn, index, usageById)));
  if (!turns.length) list.append(h('div', { class: 'empty', text: 'No turns yet.' }));
  root.append(list);
}

function attemptTiming(attempt) {
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
  const end = turn.end && turn.end.payload;
  const turnStart = turn.events[0].created_at * 1000;
  const timings = attempts.map(attemptTiming);
  const origin = Math.min(turnStart, ...timings.map((t) => t.start).filter((v) => v !== null));
  const finish = Math.max(turn.end ? turn.end.created_at * 1000 : origin, ...timings.map((t) => t.end).filter((v) => v !== null));
  const span = Math.max(finish - origin, 1);
  const metered = end && end.metered;

  const lanes = h('div', { class: 'timeline', 'data-testid': 'timeline' },
    h('div', { class: 'timeline-axis' }, h('span', { text: '0 ms' }), h('span', { text: fmtMs(span) })),
    attempts.map((attempt, i) => {
      const t = timings[i];
      const left = t.start === null ? 0 : ((t.start - origin) / span) * 100;
      const width = t.start === null || t.end === null ? 0 : Math.max(((t.end - t.start) / span) * 100, 0.6);
      const lane = h('div', { class: 'lane' },
        h('div', { class: 'lane-label' }, `#${attempt.number} `, h('strong', { text: attempt.route.deployment || '?' })),
        h('div', { class: 'lane-track' },
          h('div', { class: `lane-bar lane-${attempt.outcome || 'error'}`, style: { left: `${left}%`, width: `${width}%` }, title: `${attempt.outcome}: ${fmtMs(t.duration)}` }),
          t.ttft !== null && t.ttft !== undefined && t.start !== null
            ? h('div', { class: 'lane-mark', style: { left: `${((t.start + t.ttft - origin) / span) * 100}%` }, title: `first token at ${fmtMs(t.ttft)}` })
            : null));
      return lane;
    }));

  const cards = attempts.map((attempt, i) => attemptCard(turn, attempt, timings[i]));
  return h('article', { class: 'traj-turn', 'data-turn-id': turn.id },
    h('header', { class: 'turn-head' },
      h('span', { class: 'turn-number', text: `Turn ${index + 1}` }),
      h('code', { class: 'muted', title: turn.id, text: shortId(turn.id) }),
      h('span', { class: 'muted', text: fmtTime(turn.events[0].created_at) }),
      turnBadge(turn, end, turn.conversation_id !== conversationId),
      end && end.reason ? h('span', { class: 'muted', text: end.reason.replace(/_/g, ' ') }) : null,
      turn.conversation_id !== conversationId ? badge('inherited', 'neutral') : null),
    h('div', { class: 'traj-summary' },
      summaryStat('Attempts', String(attempts.length)),
      summaryStat('Duration', end ? fmtMs(end.duration_ms) : '—'),
      summaryStat('Tokens', metered ? `${fmtInt(metered.prompt_tokens)} in · ${fmtInt(metered.completion_tokens)} out` : end && end.usage ? `${fmtInt(end.usage.prompt_tokens)} in · ${fmtInt(end.usage.completion_tokens)} out` : '—'),
      summaryStat('Delivered', metered ? `${fmtInt(metered.completion_delivered)} tokens` : '—'),
      summaryStat('Cost', metered ? fmtUsd(metered.cost_usd) : '—'),
      summaryStat('turn/end', turn.end ? `seq ${turn.end.seq}` : 'not yet')),
    attempts.length ? lanes : h('p', { class: 'muted', text: 'No upstream attempt: this turn only recorded input.' }),
    h('div', { class: 'attempts' }, cards));
}

function summaryStat(label, value) {
  return h('div', { class: 'stat-mini' }, h('span', { class: 'stat-mini-label', text: label }), h('span', { class: 'stat-mini-value', text: value }));
}

function attemptCard(turn, attempt, timing) {
  const route = attempt.route || {};
  const outcome = attempt.outcome || 'error';
  const usage = attempt.usage;
  const error = attempt.error && attempt.error.payload;
  const life = [['started', 0]];
  if (timing.ttft !== null && timing.ttft !== undefined) life.push(['first token', timing.ttft]);
  if (attempt.message) life.push(['delivered', timing.lastDelta]);
  life.push([outcome === 'cancelled' ? 'cancelled' : outcome === 'completed' ? 'completed' : 'error', timing.duration]);
  const replayBox = h('div', { class: 'replay', hidden: true, 'data-testid': 'replay' });
  const hasStream = (attempt.stream || []).some((r) => Array.isArray(r.parts));
  const card = h('div', { class: `attempt attempt-${outcome}`, 'data-testid': 'attempt', 'data-attempt': attempt.number, 'data-outcome': outcome, 'data-deployment': route.deployment || '' },
    h('div', { class: 'attempt-head' },
      h('span', { class: 'attempt-number', text: `Attempt ${attempt.number}` }),
      statusBadge(outcome === 'cancelled' ? 'cancelled' : outcome),
      h('span', { class: 'attempt-route' }, h('strong', { text: route.deployment || '?' }), h('span', { class: 'muted', text: ` · ${route.provider || '?'} · ${route.model || '?'}` })),
      attempt.continued ? badge('continued by a later attempt', 'info') : null,
      attempt.event ? h('span', { class: 'seq', text: `${attempt.event.type} #${attempt.event.seq}` }) : null),
    h('ol', { class: 'lifecycle' }, life.map(([label, t]) => h('li', { class: `life-${label.replace(' ', '-')}` }, h('span', { class: 'life-label', text: label }), h('span', { class: 'life-time', text: t === null || t === undefined ? '—' : `+${fmtMs(t)}` })))),
    h('dl', { class: 'attempt-facts' },
      metaItem('Time to first token', fmtMs(timing.ttft)),
      metaItem('Duration', fmtMs(timing.duration)),
      metaItem('Tokens', usage ? `${fmtInt(usage.prompt_tokens)} in · ${fmtInt(usage.completion_tokens)} out · ${fmtInt(usage.completion_delivered)} delivered${usage.reasoning_tokens ? ` · ${fmtInt(usage.reasoning_tokens)} reasoning` : ''}${usage.cached_tokens ? ` · ${fmtInt(usage.cached_tokens)} cached` : ''}` : attempt.providerUsage ? `${fmtInt(attempt.providerUsage.prompt_tokens)} in · ${fmtInt(attempt.providerUsage.completion_tokens)} out` : '—'),
      metaItem('Usage source', usage ? usage.usage_source : attempt.providerUsage ? 'provider' : '—'),
      metaItem('Cost', usage ? fmtUsd(usage.cost_usd) : '—'),
      attempt.reason && attempt.event && attempt.event.type === 'assistant/attempt' ? metaItem('Recorded as', `assistant/attempt (${attempt.reason})`) : null),
    error ? h('div', { class: 'attempt-fail', 'data-testid': 'attempt-error' },
      h('strong', { text: `${error.status || ''} ${error.code || ''}`.trim() }),
      h('span', { text: ` ${error.message || ''}` }),
      h('span', { class: 'muted', text: ` · ${error.retryable ? 'retryable' : 'not retryable'} · request/error #${attempt.error.seq}` })) : null,
    hasStream ? h('div', { class: 'attempt-actions' },
      h('button', { class: 'btn btn-small', type: 'button', 'data-testid': 'replay-button', onclick: () => replay(replayBox, attempt.stream, 1) }, icon('play', 12, 'inline-icon'), 'Replay stream'),
      h('button', { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => replay(replayBox, attempt.stream, 4) }, 'at 4× speed')) : null,
    replayBox);
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
  clear(box).append(h('div', { class: 'replay-head' }, h('strong', { text: 'Replay' }), clock, stateLabel), reasoning, text, tools);
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
    if (!stopped) timer = setTimeout(tick, Math.min(50, Math.max(0, (deltas[next].t - elapsed) / speed)));
  };
  delete box.dataset.done;
  box._stop = () => {
    stopped = true;
    clearTimeout(timer);
  };
  cleanups.push(box._stop);
  tick();
}

// ---------------------------------------------------------------------------------------------
// Usage

const PALETTE = ['#3b5bdb', '#12b886', '#f08c00', '#e64980', '#7048e8', '#1098ad', '#74b816', '#f03e3e', '#868e96'];
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
  if (range === 'month') return [Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000, Math.ceil(now)];
  if (range === 'last-month') {
    return [Date.UTC(d.getUTCFullYear(), d.getUTCMonth() - 1, 1) / 1000, Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000];
  }
  return [Math.floor(now - RANGES[range].seconds), Math.ceil(now)];
}

function periodStart(period, now) {
  const d = new Date(now * 1000);
  if (period === 'day') return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()) / 1000;
  if (period === 'week') {
    const back = (d.getUTCDay() + 6) % 7; // Monday
    return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate() - back) / 1000;
  }
  if (period === 'month') return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000;
  return 0;
}

async function usagePage(root, params) {
  const groupBy = params.get('group_by') || 'model';
  const fromDate = params.get('from') || '';
  const toDate = params.get('to') || '';
  const custom = Boolean(fromDate || toDate);
  const range = custom ? 'custom' : RANGES[params.get('range')] ? params.get('range') : '24h';
  const granularity = params.get('granularity') || (custom ? 'day' : RANGES[range].granularity);
  const team = isAdmin() ? params.get('team_id') || '' : '';
  const now = Date.now() / 1000;
  // Dates are UTC days, as the usage API reads them; `to` takes in the whole of its day.
  const [presetFrom, presetTo] = custom ? [Math.floor(now - 31 * 86400), Math.ceil(now)] : rangeBounds(range, now);
  const from = fromDate ? utcDay(fromDate) : presetFrom;
  const to = toDate ? utcDay(toDate) + 86400 : presetTo;
  const rangeLabel = custom ? `${fromDate || 'last 31 days'} to ${toDate || 'now'} (UTC)` : RANGES[range].label;
  const usageQuery = { group_by: groupBy, granularity, from, to, team_id: team };
  root.append(pageHeader('Usage', isAdmin()
    ? 'Spend and tokens over time, from every attempt\'s usage record (GET /v1/usage).'
    : `Team ${session.me.team_id}'s spend and tokens (read-only).`));
  const [teams, keys] = isAdmin()
    ? await Promise.all([api('/v1/gateway/teams').then((r) => r.data), api('/v1/gateway/keys').then((r) => r.data)])
    : [[], []];
  // Names instead of raw ids where the master key can read them.
  const teamNames = new Map(teams.map((t) => [t.id, t.name]));
  const keyNames = new Map(keys.map((k) => [k.id, k.name || `${k.key_prefix}…`]));
  const nameOf = (g) => {
    if (g === '(none)' || g === 'other') return g;
    if (groupBy === 'team' && teamNames.has(g)) return `${teamNames.get(g)} (${g})`;
    if (groupBy === 'key' && keyNames.has(g)) return `${keyNames.get(g)} (${shortId(g)})`;
    return g;
  };
  const form = h('form', { class: 'filters' }, h('div', { class: 'filter-grid' },
    field('Group by', select('group_by', [['model', 'Model'], ['deployment', 'Deployment'], ['team', 'Team'], ['key', 'Key'], ['user', 'User']], groupBy, { 'data-testid': 'usage-group-by' })),
    field('Range', select('range', [...Object.entries(RANGES).map(([k, v]) => [k, v.label]), ['custom', 'Custom dates']], range)),
    field('From (UTC)', h('input', { type: 'date', name: 'from', value: fromDate })),
    field('To (UTC)', h('input', { type: 'date', name: 'to', value: toDate })),
    field('Granularity', select('granularity', [['hour', 'Hour'], ['day', 'Day']], granularity)),
    isAdmin() ? field('Team', select('team_id', [['', 'All teams'], ...teams.map((t) => [t.id, `${t.name} (${t.id})`])], team)) : null),
  h('div', { class: 'filter-actions' },
    h('button', { class: 'btn btn-small', type: 'button', 'data-testid': 'usage-csv', onclick: (event) => downloadCsv(event.currentTarget, usageQuery) }, 'Export CSV'),
    h('span', { class: 'field-hint', text: 'The same filters as GET /v1/usage.' })));
  form.addEventListener('change', (event) => applySoon(() => {
    const data = Object.fromEntries(new FormData(form).entries());
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
  }, event.target));
  form.addEventListener('submit', (event) => event.preventDefault());
  const body = h('div', {}, loading());
  root.append(panel(null, form), body);

  const report = await api('/v1/usage' + query(usageQuery));
  const rows = report.data;
  clear(body);
  const COUNTS = ['requests', 'attempts', 'failed_attempts', 'interrupted', 'errors', 'unpriced_requests'];
  const totals = rows.reduce((acc, r) => {
    acc.cost += r.cost_usd || 0;
    acc.prompt += r.prompt_tokens || 0;
    acc.completion += r.completion_tokens || 0;
    acc.delivered += r.completion_delivered || 0;
    for (const name of COUNTS) acc[name] += r[name] || 0;
    return acc;
  }, { cost: 0, prompt: 0, completion: 0, delivered: 0, ...Object.fromEntries(COUNTS.map((n) => [n, 0])) });
  body.append(h('div', { class: 'stats', 'data-testid': 'usage-totals' },
    stat('Spend', fmtUsd(totals.cost), totals.unpriced_requests ? `${rangeLabel} · ${plural(totals.unpriced_requests, 'request')} unpriced, not counted` : rangeLabel),
    stat('Tokens', fmtCompact(totals.prompt + totals.completion), `${fmtInt(totals.prompt)} prompt · ${fmtInt(totals.completion)} completion`),
    stat('Requests', fmtInt(totals.requests), `turns · ${plural(totals.attempts, 'upstream attempt')} · ${fmtInt(totals.delivered)} tokens delivered`, 'stat-requests'),
    stat('Interrupted', fmtPct(totals.interrupted, totals.requests), `${plural(totals.interrupted, 'request')} cut short by the client`),
    stat('Errors', fmtPct(totals.errors, totals.requests), `${plural(totals.errors, 'request')} failed`, 'stat-errors'),
    stat('Failed attempts', fmtPct(totals.failed_attempts, totals.attempts), `${fmtInt(totals.failed_attempts)} of ${plural(totals.attempts, 'attempt')}, retried or fallen back included`, 'stat-failed-attempts')));

  const bucket = granularity === 'hour' ? 3600 : 86400;
  const periods = [];
  for (let t = Math.floor(from / bucket) * bucket; t < to; t += bucket) periods.push(t);
  const groupTotals = new Map();
  for (const r of rows) {
    const g = r.group ?? '(none)';
    const acc = groupTotals.get(g) || { group: g, cost: 0, tokens: 0, prompt: 0, completion: 0, delivered: 0, requests: 0, attempts: 0, failed_attempts: 0, unpriced_requests: 0, interrupted: 0, errors: 0, estimated: 0 };
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
      const g = shown.includes(r.group ?? '(none)') ? r.group ?? '(none)' : 'other';
      const key = `${t}|${g}`;
      data.set(key, (data.get(key) || 0) + value(r));
    }
    return data;
  };
  const groups = ranked.length > shown.length ? [...shown, 'other'] : shown;
  const legend = h('div', { class: 'legend' }, groups.map((g) => h('span', { class: 'legend-item' }, h('span', { class: 'swatch', style: { background: g === 'other' ? PALETTE[PALETTE.length - 1] : colour(g) } }), nameOf(g))));
  // Buckets are UTC hours and days (as the API makes them): labelled in UTC, whatever the
  // browser's time zone.
  const fmtTick = (t) => {
    const d = new Date(t * 1000);
    return granularity === 'hour' ? `${pad(d.getUTCHours())}:00` : `${pad(d.getUTCMonth() + 1)}-${pad(d.getUTCDate())}`;
  };
  const spendChart = stackedBars({ periods, groups, data: series((r) => r.cost_usd || 0), colour: (g) => (g === 'other' ? PALETTE[PALETTE.length - 1] : colour(g)), format: (v) => `$${Number(v.toPrecision(3))}`, tick: fmtTick, name: 'spend' });
  const tokenChart = stackedBars({ periods, groups, data: series((r) => (r.prompt_tokens || 0) + (r.completion_tokens || 0)), colour: (g) => (g === 'other' ? PALETTE[PALETTE.length - 1] : colour(g)), format: fmtCompact, tick: fmtTick, name: 'tokens' });
  body.append(h('div', { class: 'grid-2' },
    panel(`Spend by ${groupBy} (USD, ${granularity === 'hour' ? 'hours' : 'days'} in UTC)`, totals.cost ? spendChart : h('div', { class: 'empty', text: rows.length ? 'No cost recorded: these deployments have no price.' : 'No usage in this range.' }), legend.cloneNode(true)),
    panel(`Tokens by ${groupBy} (${granularity === 'hour' ? 'hours' : 'days'} in UTC)`, rows.length ? tokenChart : h('div', { class: 'empty', text: 'No usage in this range.' }), legend)));

  const maxCost = Math.max(...ranked.map((g) => g.cost), 0);
  body.append(h('div', { class: 'grid-2' },
    panel('Top spenders', table([
      { label: groupBy[0].toUpperCase() + groupBy.slice(1), cell: (g) => h('span', { class: 'legend-item' }, h('span', { class: 'swatch', style: { background: colour(g.group) } }), nameOf(g.group)) },
      { label: 'Spend', num: true, cell: (g) => fmtUsd(g.cost) },
      { label: 'Share', cell: (g) => meter(maxCost ? g.cost / maxCost : 0, colour(g.group)) },
      { label: 'Tokens', num: true, cell: (g) => fmtInt(g.tokens) },
    ], ranked.slice(0, 10), 'No usage in this range.')),
    panel('Interrupted and error rates', table([
      { label: groupBy[0].toUpperCase() + groupBy.slice(1), cell: (g) => nameOf(g.group) },
      { label: 'Requests', num: true, cell: (g) => fmtInt(g.requests) },
      { label: 'Interrupted', num: true, cell: (g) => `${fmtInt(g.interrupted)} (${fmtPct(g.interrupted, g.requests)})` },
      { label: 'Errors', num: true, cell: (g) => h('span', { class: g.errors ? 'text-bad' : null, 'data-testid': 'rate-errors', text: `${fmtInt(g.errors)} (${fmtPct(g.errors, g.requests)})` }) },
      { label: 'Attempts', num: true, cell: (g) => fmtInt(g.attempts) },
      { label: 'Failed attempts', num: true, cell: (g) => h('span', { class: g.failed_attempts ? 'text-bad' : null, 'data-testid': 'rate-failed-attempts', text: `${fmtInt(g.failed_attempts)} (${fmtPct(g.failed_attempts, g.attempts)})` }) },
      { label: 'Delivered', num: true, cell: (g) => fmtPct(g.delivered, g.completion) },
    ], ranked.map((g) => ({ ...g, attrs: { 'data-group': g.group } })), 'No usage in this range.'),
    h('p', { class: 'field-hint', text: 'Requests are turns, counted once in the group of their last attempt: errors are requests that failed, interrupted those cut short by their client. Attempts count every upstream call (a retry or fallback is one more); failed attempts include those a fallback then recovered. Delivered is the share of generated tokens that reached the client.' }))));
  if (isAdmin()) body.append(await budgetsPanel(teams, team));
}

async function downloadCsv(button, params) {
  button.disabled = true;
  try {
    const response = await request('/v1/usage' + query({ ...params, format: 'csv' }), { headers: { Accept: 'text/csv' } });
    if (!response.ok) throw await errorOf(response);
    const url = URL.createObjectURL(await response.blob());
    const link = h('a', { href: url, download: `usage-${params.group_by}-${params.granularity}.csv` });
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

function stat(label, value, hint, testid) {
  return h('div', { class: 'stat', 'data-testid': testid }, h('div', { class: 'stat-label', text: label }), h('div', { class: 'stat-value', text: value }), hint ? h('div', { class: 'stat-hint', text: hint }) : null);
}

function meter(fraction, colour) {
  const fill = h('div', { class: 'meter-fill', style: { width: `${Math.max(0, Math.min(1, fraction)) * 100}%`, background: colour } });
  return h('div', { class: 'meter' }, fill);
}

function niceStep(value) {
  if (value <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

function stackedBars({ periods, groups, data, colour, format, tick, name }) {
  const width = 720;
  const height = 260;
  const m = { top: 14, right: 12, bottom: 28, left: 64 };
  const plotW = width - m.left - m.right;
  const plotH = height - m.top - m.bottom;
  const totals = periods.map((t) => groups.reduce((sum, g) => sum + (data.get(`${t}|${g}`) || 0), 0));
  const step = niceStep(Math.max(...totals, 0) / 4);
  const ticks = Math.max(1, Math.ceil(Math.max(...totals, 0) / step));
  const top = step * ticks;
  const slot = plotW / Math.max(periods.length, 1);
  const barW = Math.max(Math.min(slot * 0.7, 42), 1.5);
  const y = (v) => m.top + plotH - (v / top) * plotH;
  const chart = s('svg', { viewBox: `0 0 ${width} ${height}`, class: 'chart', role: 'img', 'aria-label': `${name} over time`, 'data-chart': name });
  for (let i = 0; i <= ticks; i++) {
    const v = step * i;
    chart.append(
      s('line', { x1: m.left, x2: width - m.right, y1: y(v), y2: y(v), class: 'grid-line' }),
      s('text', { x: m.left - 8, y: y(v) + 4, 'text-anchor': 'end', class: 'axis-label' }, format(v)));
  }
  const every = Math.max(1, Math.ceil(periods.length / 8));
  periods.forEach((t, i) => {
    const x = m.left + slot * i + (slot - barW) / 2;
    let base = 0;
    for (const g of groups) {
      const v = data.get(`${t}|${g}`) || 0;
      if (v <= 0) continue;
      const rect = s('rect', { x: x.toFixed(2), y: y(base + v).toFixed(2), width: barW.toFixed(2), height: Math.max(((v / top) * plotH), 0.5).toFixed(2), fill: colour(g), class: 'bar', 'data-value': v, 'data-group': g, rx: 1.5 },
        s('title', {}, `${g} · ${tick(t)}: ${format(v)}`));
      chart.append(rect);
      base += v;
    }
    if (i % every === 0) chart.append(s('text', { x: m.left + slot * i + slot / 2, y: height - 8, 'text-anchor': 'middle', class: 'axis-label' }, tick(t)));
  });
  chart.append(s('line', { x1: m.left, x2: width - m.right, y1: m.top + plotH, y2: m.top + plotH, class: 'axis-line' }));
  return chart;
}

async function budgetsPanel(teams, onlyTeam) {
  const keys = await api('/v1/gateway/keys' + query({ team_id: onlyTeam })).then((r) => r.data);
  const now = Date.now() / 1000;
  const scoped = [
    ...teams.filter((t) => !onlyTeam || t.id === onlyTeam).filter((t) => t.limits && t.limits.budget).map((t) => ({ kind: 'team', id: t.id, label: t.name, budget: t.limits.budget })),
    ...keys.filter((k) => !k.revoked_at && k.limits && k.limits.budget).map((k) => ({ kind: 'key', id: k.id, label: k.name || `${k.key_prefix}…`, budget: k.limits.budget })),
  ];
  const spent = new Map();
  const wanted = new Set(scoped.map((b) => `${b.kind}|${b.budget.period}`));
  await Promise.all([...wanted].map(async (pair) => {
    const [kind, period] = pair.split('|');
    const report = await api('/v1/usage' + query({ group_by: kind, granularity: 'day', from: periodStart(period, now), to: Math.ceil(now) + 1 }));
    for (const r of report.data) {
      const key = `${kind}|${period}|${r.group}`;
      spent.set(key, (spent.get(key) || 0) + (r.cost_usd || 0));
    }
  }));
  const bars = scoped.map((b) => {
    const used = spent.get(`${b.kind}|${b.budget.period}|${b.id}`) || 0;
    const fraction = used / b.budget.usd;
    const level = fraction >= 1 ? 'over' : fraction >= 0.8 ? 'warn' : 'ok';
    const fill = h('div', { class: `budget-fill budget-${level}`, style: { width: `${Math.min(fraction, 1) * 100}%` } });
    return h('div', { class: 'budget', 'data-testid': 'budget' },
      h('div', { class: 'budget-head' },
        h('span', {}, badge(b.kind, 'neutral'), ' ', h('strong', { text: b.label }), h('code', { class: 'muted', text: ` ${shortId(b.id)}` })),
        h('span', { class: `budget-figure budget-text-${level}`, text: `${fmtUsd(used)} of ${fmtUsd(b.budget.usd)} · ${(fraction * 100).toFixed(1)}%` })),
      h('div', { class: 'budget-track' }, fill,
        h('div', { class: 'budget-threshold', style: { left: '80%' }, title: '80%: warning' }),
        h('div', { class: 'budget-threshold budget-threshold-max', style: { left: 'calc(100% - 2px)' }, title: '100%' })),
      h('div', { class: 'budget-foot muted', text: `per ${b.budget.period} (UTC) · ${b.budget.mode === 'hard' ? 'hard: requests are refused at 100%' : 'soft: requests pass with a warning header'}` }));
  });
  return panel('Budgets', bars.length ? h('div', { class: 'budgets' }, bars) : h('div', { class: 'empty', text: 'No team or key has a budget. Set one under Keys & teams.' }),
    h('p', { class: 'field-hint', text: 'Consumption in each budget\'s current period; the marks are the 80% warning threshold and the limit.' }));
}

// ---------------------------------------------------------------------------------------------
// Keys and teams

function limitsText(limits) {
  if (!limits) return '—';
  const parts = [];
  if (limits.rpm) parts.push(`${limits.rpm} rpm`);
  if (limits.tpm) parts.push(`${fmtCompact(limits.tpm)} tpm`);
  if (limits.max_concurrent) parts.push(`${limits.max_concurrent} concurrent`);
  if (limits.budget) parts.push(`${fmtUsd(limits.budget.usd)}/${limits.budget.period} ${limits.budget.mode}`);
  return parts.join(' · ') || '—';
}

function limitsFields(limits) {
  const l = limits || {};
  const b = l.budget || {};
  return h('div', { class: 'filter-grid' },
    field('Requests / min', h('input', { type: 'number', min: 1, name: 'rpm', value: l.rpm ?? '' })),
    field('Tokens / min', h('input', { type: 'number', min: 1, name: 'tpm', value: l.tpm ?? '' })),
    field('Concurrent', h('input', { type: 'number', min: 1, name: 'max_concurrent', value: l.max_concurrent ?? '' })),
    field('Budget (USD)', h('input', { type: 'number', min: 0, step: 'any', name: 'budget_usd', value: b.usd ?? '' })),
    field('Budget period', select('budget_period', [['month', 'Month'], ['week', 'Week'], ['day', 'Day'], ['total', 'Total']], b.period || 'month')),
    field('Budget mode', select('budget_mode', [['hard', 'Hard (refuse)'], ['soft', 'Soft (warn)']], b.mode || 'hard')));
}

function limitsFrom(data) {
  const limits = {};
  for (const name of ['rpm', 'tpm', 'max_concurrent']) if (data[name]) limits[name] = Number(data[name]);
  if (data.budget_usd) limits.budget = { usd: Number(data.budget_usd), period: data.budget_period, mode: data.budget_mode };
  return Object.keys(limits).length ? limits : null;
}

async function keysPage(root) {
  root.append(pageHeader('Keys & teams', 'Teams own conversations and budgets; their virtual keys are what applications send.'));
  const body = h('div', {}, loading());
  root.append(body);
  const now = Date.now() / 1000;
  const monthStart = periodStart('month', now);
  const [teams, keys, models, recent] = await Promise.all([
    api('/v1/gateway/teams').then((r) => r.data),
    api('/v1/gateway/keys').then((r) => r.data),
    api('/v1/models').then((r) => r.data.map((m) => m.id)),
    // Each key's hours of use over the last 31 days (a month's start is never further back).
    api('/v1/usage' + query({ group_by: 'key', granularity: 'hour', from: Math.floor(now - 31 * 86400), to: Math.ceil(now) + 1 })).then((r) => r.data),
  ]);
  const keyUse = new Map(); // key id -> { last: hour (s), month: USD this UTC month }
  for (const r of recent) {
    if (!r.group || !(r.requests || r.attempts)) continue;
    const t = Date.parse(r.period_start) / 1000;
    const use = keyUse.get(r.group) || { last: 0, month: 0 };
    use.last = Math.max(use.last, t);
    if (t >= monthStart) use.month += r.cost_usd || 0;
    keyUse.set(r.group, use);
  }
  clear(body);
  const secretBox = h('div', { 'data-testid': 'secret-box' });
  body.append(secretBox);

  // -- create a key
  const keyForm = h('form', { class: 'create-form', 'data-testid': 'create-key-form' },
    h('div', { class: 'filter-grid' },
      field('Team', select('team_id', teams.map((t) => [t.id, `${t.name} (${t.id})`]), teams[0]?.id, { required: true })),
      field('Name', h('input', { name: 'name', placeholder: 'e.g. ci', 'data-testid': 'key-name' })),
      field('User', h('input', { name: 'user', placeholder: 'optional end user' })),
      field('Models', h('input', { name: 'models', placeholder: `all, or e.g. ${models.slice(0, 2).join(', ')}` }), 'comma-separated aliases'),
      field('Expires in (days)', h('input', { type: 'number', min: 0, step: 'any', name: 'expires_days', placeholder: 'never' }))),
    h('details', { class: 'limits-details' }, h('summary', {}, 'Limits and budget'), limitsFields(null)),
    h('div', { class: 'filter-actions' }, h('button', { class: 'btn btn-primary', type: 'submit', disabled: !teams.length, 'data-testid': 'create-key' }, 'Create key')));
  const keyError = h('div');
  keyForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(keyError);
    const data = Object.fromEntries(new FormData(keyForm).entries());
    const body = { team_id: data.team_id };
    if (data.name) body.name = data.name;
    if (data.user) body.user = data.user;
    if (data.models.trim()) body.models = data.models.split(',').map((m) => m.trim()).filter(Boolean);
    if (data.expires_days) body.expires_in_s = Number(data.expires_days) * 86400;
    const limits = limitsFrom(data);
    if (limits) body.limits = limits;
    try {
      const made = await api('/v1/gateway/keys', { method: 'POST', body });
      await keysPage(clear(root));
      showSecret(root.querySelector('[data-testid="secret-box"]'), made);
    } catch (error) {
      keyError.append(errorBox(error));
    }
  });

  // -- create a team
  const teamForm = h('form', { class: 'create-form', 'data-testid': 'create-team-form' },
    h('div', { class: 'filter-grid' },
      field('Name', h('input', { name: 'name', required: true, placeholder: 'e.g. Search', 'data-testid': 'team-name' })),
      field('Id', h('input', { name: 'id', placeholder: 'generated when empty', pattern: '[A-Za-z0-9._\\-]{1,64}' }))),
    h('details', { class: 'limits-details' }, h('summary', {}, 'Limits and budget'), limitsFields(null)),
    h('div', { class: 'filter-actions' }, h('button', { class: 'btn btn-primary', type: 'submit', 'data-testid': 'create-team' }, 'Create team')));
  const teamError = h('div');
  teamForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(teamError);
    const data = Object.fromEntries(new FormData(teamForm).entries());
    const body = { name: data.name };
    if (data.id) body.id = data.id;
    const limits = limitsFrom(data);
    if (limits) body.limits = limits;
    try {
      await api('/v1/gateway/teams', { method: 'POST', body });
      await keysPage(clear(root));
    } catch (error) {
      teamError.append(errorBox(error));
    }
  });

  body.append(h('div', { class: 'grid-2' },
    panel('New key', teams.length ? keyForm : notice('Create a team first: every key belongs to one.'), keyError),
    panel('New team', teamForm, teamError)));

  // -- teams
  const keyCount = (teamId) => keys.filter((k) => k.team_id === teamId && !k.revoked_at).length;
  body.append(panel('Teams', table([
    { label: 'Team', cell: (t) => h('div', {}, h('strong', { text: t.name }), h('div', { class: 'muted' }, h('code', { text: t.id }))) },
    { label: 'Active keys', num: true, cell: (t) => String(keyCount(t.id)) },
    { label: 'Limits', cell: (t) => limitsText(t.limits) },
    { label: `Created (${ZONE})`, cell: (t) => fmtTime(t.created_at, false) },
    { label: '', cell: (t) => editLimitsButton(`/v1/gateway/teams/${enc(t.id)}`, t.limits, root) },
  ], teams.map((t) => ({ ...t, attrs: { 'data-team-id': t.id } })), 'No teams yet.')));

  // -- keys
  const state = (k) => (k.revoked_at ? 'revoked' : k.expires_at && k.expires_at <= now ? 'expired' : 'active');
  body.append(panel('Keys', table([
    { label: 'Key', cell: (k) => h('div', {}, h('strong', { text: k.name || '(unnamed)' }), h('div', { class: 'muted' }, h('code', { text: `${k.key_prefix}…` }), ' ', idCell(k.id))) },
    { label: 'Team', cell: (k) => k.team_id },
    { label: 'State', cell: (k) => h('span', { 'data-testid': 'key-state' }, state(k) === 'active' ? badge('active', 'ok') : statusBadge(state(k))) },
    { label: 'Models', cell: (k) => (k.models ? k.models.join(', ') : 'all') },
    { label: 'Limits', cell: (k) => limitsText(k.limits) },
    { label: 'Last used', sort: (k) => keyUse.get(k.id)?.last, cell: (k) => h('span', { 'data-col': 'last-used', title: keyUse.has(k.id) ? `in the UTC hour from ${new Date(keyUse.get(k.id).last * 1000).toISOString().slice(0, 13)}:00` : 'not in the last 31 days', text: !keyUse.has(k.id) ? 'not in 31 days' : keyUse.get(k.id).last + 3600 > now ? 'this hour' : fmtAgo(keyUse.get(k.id).last) }) },
    { label: 'Spend this month (UTC)', num: true, sort: (k) => keyUse.get(k.id)?.month ?? 0, cell: (k) => h('span', { 'data-col': 'spend', text: fmtUsd(keyUse.get(k.id)?.month ?? 0) }) },
    { label: `Expires (${ZONE})`, cell: (k) => (k.expires_at ? fmtTime(k.expires_at, false) : 'never') },
    { label: `Created (${ZONE})`, cell: (k) => fmtTime(k.created_at, false) },
    { label: '', cell: (k) => h('div', { class: 'row-actions' }, k.revoked_at ? null : editLimitsButton(`/v1/gateway/keys/${enc(k.id)}`, k.limits, root), k.revoked_at ? null : revokeButton(k, root)) },
  ], keys.sort((a, b) => b.created_at - a.created_at).map((k) => ({ ...k, attrs: { 'data-key-id': k.id } })), 'No keys yet.')));
}

function showSecret(box, made) {
  const secret = h('code', { class: 'secret', 'data-testid': 'new-secret', text: made.key });
  const copy = h('button', {
    class: 'btn btn-small', type: 'button',
    onclick: async () => {
      try {
        await navigator.clipboard.writeText(made.key);
        copy.textContent = 'Copied';
      } catch {
        copy.textContent = 'Select and copy it by hand';
      }
    },
  }, 'Copy');
  clear(box).append(h('div', { class: 'alert alert-success secret-alert', role: 'status' },
    h('div', {}, h('strong', { text: `Key ${made.name ? `"${made.name}" ` : ''}created for team ${made.team_id}.` }), ' Copy it now: this is the only time it is shown (the gateway keeps only its hash).'),
    h('div', { class: 'secret-row' }, secret, copy,
      h('button', { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => clear(box) }, 'Done'))));
}

function revokeButton(key, root) {
  const wrap = h('span', { class: 'revoke' });
  const ask = h('button', {
    class: 'btn btn-small btn-danger-ghost', type: 'button', 'data-testid': 'revoke',
    onclick: () => {
      clear(wrap).append(
        h('span', { class: 'muted', text: 'Revoke? ' }),
        h('button', {
          class: 'btn btn-small btn-danger', type: 'button', 'data-testid': 'revoke-confirm',
          onclick: async () => {
            try {
              await api(`/v1/gateway/keys/${enc(key.id)}`, { method: 'DELETE' });
              await keysPage(clear(root));
            } catch (error) {
              wrap.append(errorBox(error));
            }
          },
        }, 'Revoke'),
        h('button', { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => clear(wrap).append(ask) }, 'Cancel'));
    },
  }, 'Revoke');
  wrap.append(ask);
  return wrap;
}

function editLimitsButton(path, limits, root) {
  const wrap = h('span', { class: 'popover-anchor' });
  const open = h('button', {
    class: 'btn btn-small', type: 'button', 'data-testid': 'edit-limits',
    onclick: () => {
      const form = h('form', { class: 'limits-form' }, limitsFields(limits),
        h('div', { class: 'filter-actions' },
          h('button', { class: 'btn btn-small btn-primary', type: 'submit' }, 'Save limits'),
          h('button', { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => dialog.close() }, 'Cancel')));
      // A modal dialog: in the top layer, so no scrolling table clips it; Escape closes it.
      const dialog = h('dialog', { class: 'popover', 'aria-label': 'Limits and budget', 'data-testid': 'limits-dialog' },
        h('div', { class: 'popover-title', text: 'Limits and budget (empty clears)' }), form);
      dialog.addEventListener('close', () => dialog.remove());
      form.addEventListener('submit', async (event) => {
        event.preventDefault();
        try {
          await api(path, { method: 'PATCH', body: { limits: limitsFrom(Object.fromEntries(new FormData(form).entries())) } });
          await keysPage(clear(root));
        } catch (error) {
          form.append(errorBox(error));
        }
      });
      wrap.append(dialog);
      dialog.showModal();
    },
  }, 'Limits…');
  wrap.append(open);
  return wrap;
}

// ---------------------------------------------------------------------------------------------
// Deployments

async function deploymentsPage(root) {
  const stamp = h('span', { class: 'muted' });
  root.append(pageHeader('Deployments', 'Live health from this gateway process, refreshed every 5 seconds; error rates from the last 24 hours of usage.', stamp));
  const body = h('div', {}, loading());
  root.append(body);
  const refresh = async () => {
    const now = Date.now() / 1000;
    const [live, usage] = await Promise.all([
      api('/v1/gateway/deployments'),
      api('/v1/usage' + query({ group_by: 'deployment', granularity: 'day', from: Math.floor(now - 86400), to: Math.ceil(now) + 1 })),
    ]);
    const recent = new Map();
    for (const r of usage.data) {
      const acc = recent.get(r.group) || { attempts: 0, failed: 0 };
      acc.attempts += r.attempts;
      acc.failed += r.failed_attempts;
      recent.set(r.group, acc);
    }
    const rows = live.data.map((d) => ({ ...d, recent: recent.get(d.name) || { attempts: 0, failed: 0 }, attrs: { 'data-deployment': d.name } }));
    const counts = rows.reduce((acc, d) => ({ ...acc, [d.state]: (acc[d.state] || 0) + 1 }), {});
    clear(body).append(
      h('div', { class: 'stats' },
        stat('Deployments', String(rows.length), plural(new Set(rows.map((d) => d.alias)).size, 'alias', 'aliases')),
        stat('Healthy', String(counts.healthy || 0)),
        stat('Cooling down', String(counts.cooling || 0), 'skipped until their cooldown ends'),
        stat('Half-open', String(counts.half_open || 0), 'one probe request decides'),
        stat('In flight', String(rows.reduce((sum, d) => sum + d.in_flight, 0)))),
      panel(null, table([
        { label: 'Deployment', cell: (d) => h('div', {}, h('strong', { text: d.name }), h('div', { class: 'muted', text: `${d.alias} · ${d.provider} · ${d.model}` })) },
        { label: 'Health', cell: (d) => h('div', {}, statusBadge(d.state), d.state === 'cooling' ? h('div', { class: 'muted', text: `${d.cooldown_remaining_s.toFixed(1)} s left` }) : null) },
        { label: 'In flight', num: true, cell: (d) => `${d.in_flight}${d.max_concurrency ? ` / ${d.max_concurrency}` : ''}` },
        { label: 'TTFT (avg)', num: true, cell: (d) => fmtMs(d.ttft_ms) },
        { label: 'Since start', num: true, cell: (d) => `${fmtInt(d.successes)} ok · ${fmtInt(d.failures)} failed` },
        { label: 'Error rate', cell: (d) => rateMeter(d.failures, d.successes + d.failures) },
        { label: '24 h failed attempts', cell: (d) => rateMeter(d.recent.failed, d.recent.attempts) },
        { label: 'Last error', cell: (d) => (d.last_error ? h('span', { class: 'text-bad small', text: typeof d.last_error === 'string' ? d.last_error : JSON.stringify(d.last_error) }) : h('span', { class: 'muted', text: '—' })) },
      ], rows, 'No deployments configured.')));
    stamp.textContent = `updated ${fmtTime(now)}`;
  };
  await refresh();
  const timer = setInterval(() => refresh().catch((error) => { clear(body).append(errorBox(error)); }), 5000);
  cleanups.push(() => clearInterval(timer));
}

function rateMeter(part, whole) {
  if (!whole) return h('span', { class: 'muted', text: '—' });
  const fraction = part / whole;
  const level = fraction >= 0.25 ? 'over' : fraction >= 0.05 ? 'warn' : 'ok';
  return h('div', { class: 'rate' }, h('div', { class: 'meter' }, h('div', { class: `meter-fill budget-${level}`, style: { width: `${Math.max(fraction * 100, fraction ? 2 : 0)}%` } })), h('span', { class: 'rate-text', text: fmtPct(part, whole) }));
}

// ---------------------------------------------------------------------------------------------

window.addEventListener('hashchange', render);
render();
