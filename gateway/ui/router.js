// The gateway's admin UI: hash routing, re-rendering and what a page leaves behind (an ES module
// of the page; no build step). The entry module says how a route is drawn (`start`).

import { query } from './api.js';

let draw = async () => {};
let cleanups = [];

export function start(drawRoute) {
  draw = drawRoute;
  window.addEventListener('hashchange', () => render());
  render();
}

export function currentRoute() {
  const raw = location.hash.replace(/^#/, '') || '/conversations';
  const [path, search] = raw.split('?');
  return {
    path,
    parts: path.split('/').filter(Boolean).map(decodeURIComponent),
    query: new URLSearchParams(search || ''),
  };
}

export function href(path, params = {}) {
  return `#${path}${query(params)}`;
}

export function go(path, params = {}) {
  open(href(path, params).slice(1));
}

export function open(target) {
  // A route as `path?query`: shown again when it is the one already open.
  if (location.hash === `#${target}`) render();
  else location.hash = `#${target}`;
}

export function onLeave(cleanup) {
  // Runs when the page is drawn again or left: timers, polls, replays.
  cleanups.push(cleanup);
}

let drawing = 0; // which render is the latest: a live one overtaken by another is dropped

export async function render({ live = false } = {}) {
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
  const mine = ++drawing;
  const app = document.getElementById('app');
  if (!live) {
    const drawn = draw(app, currentRoute());
    window.scrollTo(0, 0); // a new page opens at its top, before its data arrives
    await drawn;
    restoreFocus();
    return;
  }
  // A live refresh: drawn aside and put in place whole once its data is in, so the page neither
  // blinks to "Loading…" nor shrinks and loses its scroll, and the control that had the focus
  // (the refresh toggle, say) has it again.
  const aside = document.createElement('div');
  await draw(aside, currentRoute());
  // Another page was opened, or drawn again, meanwhile: this one is never shown (what it left
  // to clean up, the next render cleans).
  if (mine !== drawing) return;
  const focused = focusSelector(document.activeElement, app);
  app.replaceChildren(...aside.childNodes);
  if (focused) app.querySelector(focused)?.focus({ preventScroll: true });
  restoreFocus();
}

function focusSelector(element, app) {
  // How to find the focused control in the page drawn anew: its test id or its name.
  if (!element || element === document.body || !app.contains(element)) return null;
  for (const name of ['data-testid', 'name']) {
    const value = element.getAttribute(name);
    if (value) return `[${name}="${CSS.escape(value)}"]`;
  }
  return null;
}

export function refreshInPlace() {
  // A live refresh: the page drawn again where it was scrolled to.
  return render({ live: true });
}

// A filter applied from the keyboard re-renders the page: focus goes back to the same control.
let focusAfterRender = null;

function restoreFocus() {
  if (!focusAfterRender) return;
  const target = document.querySelector(`.page [name="${focusAfterRender}"]`);
  focusAfterRender = null;
  if (target) target.focus();
}

export function keepFocus(name) {
  // The control named `name` has the focus again once the page is drawn anew.
  focusAfterRender = name;
}

// Auto-applied selects wait for the keyboard to settle: arrowing through a select's options
// applies the one it stops on, once, and keeps the focus there.
export function applySoon(apply, control) {
  clearTimeout(applySoon.timer);
  onLeave(() => clearTimeout(applySoon.timer));
  applySoon.timer = setTimeout(() => {
    if (document.activeElement === control) focusAfterRender = control.name;
    apply();
  }, 450);
}
