// The gateway's admin UI: the API, the key it is called with, and its errors (an ES module of
// the page; no build step).
//
// Auth: the operator pastes a key: the master key for everything, or a team's virtual key for a
// read-only view of that team's conversations and usage. The key is kept in sessionStorage (it
// goes when the tab closes; localStorage when the operator opts in to being remembered on this
// device, until sign-out) and sent as `Authorization: Bearer` on every API call. No cookies
// are used, so a browser never attaches a credential on its own: a request forged by another
// site carries no key, and there is no CSRF surface.
//
// A tab opened from a signed-in one (Ctrl-click, a new tab on a link) starts without the key,
// since sessionStorage does not follow it: it asks the gateway's other open tabs of this browser
// for it over a BroadcastChannel (same origin only; nothing leaves the browser) and, given one
// that still works, keeps it as its own. Signing out in one tab signs every tab out.

const KEY_STORAGE = 'gateway.admin.key';
// The gateway's root as this page sees it ("/" or a proxy's prefix): the page is at <root>ui/.
const ROOT = location.pathname.replace(/ui\/[^/]*$/, '');

export const session = { key: null, me: null };

// What to do when the gateway refuses the key in use (the entry module signs out).
let onRefused = () => {};

export function whenRefused(handler) {
  onRefused = handler;
}

export class ApiError extends Error {
  constructor(status, message, code, param) {
    super(message);
    this.status = status;
    this.code = code;
    this.param = param;
  }
}

export async function request(path, { method = 'GET', body, headers = {}, signal } = {}) {
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

export async function errorOf(response) {
  const text = await response.text();
  let error = {};
  try {
    error = JSON.parse(text).error || {};
  } catch {
    error = { message: text.slice(0, 300) };
  }
  return new ApiError(
    response.status,
    error.message || response.statusText,
    error.code,
    error.param,
  );
}

export async function api(path, options) {
  const response = await request(path, options);
  if (!response.ok) {
    const error = await errorOf(response);
    if (response.status === 401 && session.key !== null && !options?.login) {
      onRefused(`Your key was refused: ${error.message}`);
    }
    throw error;
  }
  return response.status === 204 ? null : response.json();
}

export function query(params) {
  const out = new URLSearchParams();
  for (const [name, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== '') out.set(name, value);
  }
  const text = out.toString();
  return text ? `?${text}` : '';
}

export const enc = encodeURIComponent;

// -- who the key acts as ----------------------------------------------------------------------

export function isAdmin() {
  return Boolean(session.me?.is_admin);
}

// What a filter form offers: the models the key may use, and (for the admin) the teams and keys;
// a list that cannot be read is empty rather than the page failing.
export function filterChoices() {
  const all = (path) =>
    isAdmin()
      ? api(path)
          .then((r) => r.data)
          .catch(() => [])
      : [];
  return Promise.all([
    api('/v1/models')
      .then((r) => r.data.map((m) => m.id))
      .catch(() => []),
    all('/v1/gateway/teams'),
    all('/v1/gateway/keys'),
  ]);
}

export function names(teams, keys) {
  // Teams and keys by id, as the pages show them: a key without a name by its prefix.
  return {
    teams: new Map(teams.map((t) => [t.id, t.name])),
    keys: new Map(keys.map((k) => [k.id, k.name || `${k.key_prefix}…`])),
  };
}

export function ownTeamName() {
  // A team key's team, by its name (`GET /v1/me`), or its id when the gateway could not say.
  return session.me?.team_name || session.me?.team_id;
}

export function adminKeyName() {
  // Turns made with the master key (or on an open gateway) carry no key id.
  return session.me?.open ? 'none (open)' : 'master key';
}

export async function signIn(key, remember) {
  // Throws the gateway's refusal; keeps the key only once it is accepted.
  session.key = key || null;
  try {
    session.me = await api('/v1/me', { login: true });
  } catch (failure) {
    session.key = null;
    session.me = null;
    throw failure;
  }
  sessionStorage.setItem(KEY_STORAGE, session.key || '');
  if (remember) localStorage.setItem(KEY_STORAGE, session.key || '');
  else localStorage.removeItem(KEY_STORAGE);
}

export async function restore() {
  // This tab's key, or one remembered on this device (opted in at sign-in), or one another open
  // tab of this browser is signed in with.
  let key = sessionStorage.getItem(KEY_STORAGE) ?? localStorage.getItem(KEY_STORAGE);
  const fromTab = key === null;
  if (fromTab) key = await askOtherTabs();
  if (key === null) return false;
  session.key = key || null;
  try {
    session.me = await api('/v1/me', { login: true });
  } catch {
    forget({ everywhere: !fromTab });
    return false;
  }
  if (fromTab) sessionStorage.setItem(KEY_STORAGE, key);
  return true;
}

export function forget({ everywhere = true } = {}) {
  sessionStorage.removeItem(KEY_STORAGE);
  localStorage.removeItem(KEY_STORAGE);
  const was = session.me !== null;
  session.key = null;
  session.me = null;
  if (everywhere && was) tabs?.postMessage({ type: 'signed-out' });
}

// -- the other tabs ---------------------------------------------------------------------------

const tabs = 'BroadcastChannel' in window ? new BroadcastChannel('gateway.admin.session') : null;
const TAB_ANSWER_MS = 300; // how long a new tab waits for a signed-in one to answer
let onSignedOutElsewhere = () => {};

export function whenSignedOutElsewhere(handler) {
  onSignedOutElsewhere = handler;
}

tabs?.addEventListener('message', (event) => {
  const message = event.data || {};
  if (message.type === 'key?' && session.me) {
    tabs.postMessage({ type: 'key', key: session.key || '', ask: message.ask });
  }
  if (message.type === 'signed-out' && session.me) {
    forget({ everywhere: false });
    onSignedOutElsewhere();
  }
});

function askOtherTabs() {
  // The key of a signed-in tab of this browser, or null when none answers in time.
  if (!tabs) return Promise.resolve(null);
  const ask = Math.random().toString(36).slice(2);
  return new Promise((resolve) => {
    const done = (key) => {
      tabs.removeEventListener('message', listen);
      clearTimeout(timer);
      resolve(key);
    };
    const listen = (event) => {
      const answer = event.data || {};
      if (answer.type === 'key' && answer.ask === ask && typeof answer.key === 'string')
        done(answer.key);
    };
    const timer = setTimeout(() => done(null), TAB_ANSWER_MS);
    tabs.addEventListener('message', listen);
    tabs.postMessage({ type: 'key?', ask });
  });
}
