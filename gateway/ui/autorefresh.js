// The gateway's admin UI: a page that draws itself again every few seconds while its toggle is
// on (an ES module of the page; no build step). Off until ticked, and remembered per page for
// this tab's session only: a long list someone left open does not start polling the gateway on
// its own. Filters stay (they are the URL's) and so does the scroll (router.js draws the page
// aside and puts it in place whole).

import { h } from './dom.js';
import { onLeave, refreshInPlace } from './router.js';

export const REFRESH_S = 5;

function busy() {
  // A turn skipped, not a page drawn away from under its reader: a hidden tab, an open dialog,
  // or a field that has the keyboard (a half-typed search, a date being picked).
  if (document.hidden || document.querySelector('dialog[open]')) return true;
  const active = document.activeElement;
  return Boolean(
    active?.closest('.page') &&
      active.matches(
        'textarea, input:not([type=checkbox]):not([type=radio]):not([type=button]):not([type=submit])',
      ),
  );
}

export function autoRefresh(page) {
  // The toggle of page `page` (its name in sessionStorage), and the timer it runs.
  const key = `gw.refresh.${page}`;
  const on = sessionStorage.getItem(key) === 'on';
  const box = h('input', { type: 'checkbox', checked: on, 'data-testid': 'auto-refresh' });
  let timer = null;
  const schedule = () => {
    timer = setTimeout(() => (busy() ? schedule() : refreshInPlace()), REFRESH_S * 1000);
  };
  box.addEventListener('change', () => {
    clearTimeout(timer);
    sessionStorage.setItem(key, box.checked ? 'on' : 'off');
    if (box.checked) schedule();
  });
  if (on) schedule();
  onLeave(() => clearTimeout(timer));
  return h('label', { class: 'check auto-refresh' }, box, `Refresh every ${REFRESH_S} s`);
}
