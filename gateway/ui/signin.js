// The gateway's admin UI: signing in and out (an ES module of the page; no build step).

import { clear, h } from './dom.js';
import { forget, signIn } from './api.js';
import { currentRoute, go, open } from './router.js';
import { errorBox, field, notice } from './widgets.js';

export function loginPage(reason) {
  const input = h('input', {
    type: 'password',
    name: 'key',
    id: 'key',
    autocomplete: 'off',
    spellcheck: 'false',
    placeholder: 'Master key or gw-… team key',
    'data-testid': 'login-key',
  });
  const error = h('div', { class: 'login-error' });
  if (reason) error.append(notice(reason, 'warn'));
  const button = h(
    'button',
    { class: 'btn btn-primary btn-block', type: 'submit', 'data-testid': 'login-submit' },
    'Sign in',
  );
  const remember = h('input', {
    type: 'checkbox',
    name: 'remember',
    'data-testid': 'login-remember',
  });
  const rememberField = h(
    'label',
    { class: 'check' },
    remember,
    'Remember on this device (until you sign out)',
  );
  const form = h(
    'form',
    {
      class: 'login-form',
      onsubmit: async (event) => {
        event.preventDefault();
        clear(error);
        button.disabled = true;
        try {
          await signIn(input.value.trim(), remember.checked);
          // Back to the page that was opened (a deep link), or that was left when signed out.
          const route = currentRoute();
          const next =
            route.parts[0] === 'login' ? route.query.get('next') : location.hash.replace(/^#/, '');
          if (next && !next.startsWith('/login')) open(next);
          else go('/conversations');
        } catch (failure) {
          error.append(
            failure.status === 401
              ? notice(`That key was refused: ${failure.message}`, 'error')
              : errorBox(failure),
          );
        } finally {
          button.disabled = false;
        }
      },
    },
    field('API key', input),
    rememberField,
    button,
    error,
  );
  setTimeout(() => input.focus(), 0);
  // The page's main landmark and its heading, as every other page has.
  return h(
    'main',
    { class: 'login', id: 'main' },
    h(
      'div',
      { class: 'login-card' },
      h(
        'h1',
        { class: 'brand brand-dark' },
        h('img', { src: 'favicon.svg', alt: '', width: 28, height: 28 }),
        h('span', { text: 'Sign in to the gateway admin' }),
      ),
      h(
        'p',
        { class: 'login-lead' },
        "Sign in with the master key to manage everything, or with a team's virtual key for a read-only view of that team's conversations, API calls and usage.",
      ),
      form,
      h(
        'p',
        { class: 'login-note' },
        'The key stays in this browser tab (sessionStorage), or on this device ' +
          '(localStorage) if you ask, until you sign out; it is sent only to this gateway, as a bearer token. ' +
          'Tabs of this browser you open from a signed-in one are signed in too. ' +
          'A gateway running without a master key accepts an empty key.',
      ),
    ),
  );
}

export function signOut(reason) {
  forget();
  // A refused key comes back to where it was; signing out on purpose starts afresh.
  const here = location.hash.replace(/^#/, '');
  go('/login', { reason, next: reason && here && !here.startsWith('/login') ? here : '' });
}
