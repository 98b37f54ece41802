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

export async function render({ live = false } = {}) {
  for (const cleanup of cleanups) cleanup();
  cleanups = [];
  const scrollY = live ? window.scrollY : 0;
  const drawn = draw(document.getElementById('app'), currentRoute());
  if (!live) window.scrollTo(0, 0); // a new page opens at its top, before its data arrives
  await drawn;
  if (live) window.scrollTo(0, scrollY);
  restoreFocus();
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
