// The gateway's admin UI, the page's entry: ES modules by view, hash routing, no build step,
// nothing loaded from anywhere but the gateway itself (the Content-Security-Policy allows
// nothing else). api.js holds the key and the calls; router.js the routes; one module per view
// (signin, list, conversation with its chat, trajectory and composer, calls, usage with its
// budgets and charts, keys, deployments) built from widgets.js, dom.js, format.js and
// markdown.js. This module draws the frame around the views.

import { clear, h } from './dom.js';
import {
  isAdmin,
  ownTeamName,
  restore,
  session,
  whenRefused,
  whenSignedOutElsewhere,
} from './api.js';
import { callsPage } from './calls.js';
import { conversationPage } from './conversation.js';
import { deploymentsPage } from './deployments.js';
import { keysPage } from './keys.js';
import { conversationsPage } from './list.js';
import { go, href, start } from './router.js';
import { loginPage, signOut } from './signin.js';
import { usagePage } from './usage.js';
import { errorBox, icon, notice, pageHeader } from './widgets.js';

const PAGES = [
  {
    path: 'conversations',
    label: 'Conversations',
    icon: 'chat',
    admin: false,
    draw: (root, route) =>
      route.parts[1]
        ? conversationPage(root, route.parts[1], route.query)
        : conversationsPage(root, route.query),
  },
  {
    path: 'requests',
    label: 'API calls',
    icon: 'calls',
    admin: false,
    draw: (root, route) => callsPage(root, route.query),
  },
  {
    path: 'usage',
    label: 'Usage',
    icon: 'chart',
    admin: false,
    draw: (root, route) => usagePage(root, route.query),
  },
  { path: 'keys', label: 'Keys & teams', icon: 'key', admin: true, draw: (root) => keysPage(root) },
  {
    path: 'deployments',
    label: 'Deployments',
    icon: 'server',
    admin: true,
    draw: (root) => deploymentsPage(root),
  },
];

async function drawRoute(app, route) {
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
  try {
    if (!page) {
      content.append(notFound(`There is no page ${route.path} in the admin UI.`));
      return;
    }
    if (page.admin && !isAdmin()) {
      content.append(
        pageHeader(page.label),
        notice(
          'This section needs the master key: a team key sees its own conversations, API calls and usage only.',
        ),
      );
      return;
    }
    await page.draw(content, route);
  } catch (error) {
    // Whatever was still loading when it failed stops saying so.
    for (const spinner of content.querySelectorAll('.loading')) spinner.remove();
    if (error.status === 404 && section === 'conversations' && route.parts[1]) {
      // Named as it was asked for: the API's message holds the id as stored (a team's `~team`).
      content.replaceChildren(
        notFound(`There is no conversation ${route.parts[1]} that this key can see.`),
      );
    } else {
      content.append(errorBox(error));
    }
  }
}

export function notFound(text) {
  // A page that is not there: said plainly, with the way back (and no internal id).
  return h(
    'div',
    { class: 'not-found', 'data-testid': 'not-found' },
    pageHeader('Not found', text),
    h('p', {}, h('a', { href: href('/conversations') }, 'Back to the conversations')),
  );
}

function shell(section, content) {
  const me = session.me;
  const who =
    me.kind === 'key'
      ? h(
          'div',
          { class: 'who' },
          h('span', { class: 'badge badge-team', text: 'Team key · read-only' }),
          h('div', { class: 'who-detail', title: me.team_id, text: `team ${ownTeamName()}` }),
        )
      : h(
          'div',
          { class: 'who' },
          h('span', {
            class: 'badge badge-admin',
            text: me.kind === 'open' ? 'Open gateway · admin' : 'Master key · admin',
          }),
        );
  const nav = h(
    'nav',
    { class: 'nav', 'aria-label': 'Sections' },
    PAGES.filter((p) => !p.admin || isAdmin()).map((p) =>
      h(
        'a',
        {
          href: href(`/${p.path}`),
          class: p.path === section ? 'nav-link active' : 'nav-link',
          'aria-current': p.path === section ? 'page' : null,
        },
        icon(p.icon),
        p.label,
      ),
    ),
  );
  return h(
    'div',
    { class: 'layout' },
    skipLink(),
    h(
      'aside',
      { class: 'sidebar' },
      h(
        'div',
        { class: 'sidebar-inner' },
        h(
          'div',
          { class: 'brand' },
          h('img', { src: 'favicon.svg', alt: '', width: 22, height: 22 }),
          h('span', { text: 'Gateway' }),
        ),
        nav,
        h(
          'div',
          { class: 'sidebar-foot' },
          who,
          h(
            'button',
            {
              class: 'btn btn-ghost btn-small',
              type: 'button',
              onclick: () => signOut(),
              'data-testid': 'sign-out',
            },
            'Sign out',
          ),
        ),
      ),
    ),
    h('main', { class: 'main', id: 'main', tabindex: '-1' }, content),
  );
}

function skipLink() {
  // Not an `#main` link: the hash is the route.
  return h(
    'a',
    {
      class: 'skip-link',
      href: '#main',
      'data-testid': 'skip-link',
      onclick: (event) => {
        event.preventDefault();
        document.getElementById('main')?.focus();
      },
    },
    'Skip to content',
  );
}

whenRefused(signOut);
whenSignedOutElsewhere(() => go('/login', { reason: 'You signed out in another tab.' }));
start(drawRoute);
