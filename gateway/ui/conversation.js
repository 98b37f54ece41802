// The gateway's admin UI: one conversation, its chat, its trajectory or its timeline, its
// branches, followed live while a turn is in progress (an ES module of the page; no build step).

import { clear, h } from './dom.js';
import { adminKeyName, api, enc, isAdmin, names, ownTeamName, query, session } from './api.js';
import { chatView } from './chat.js';
import { redraw } from './composer.js';
import { ZONE, fmtTime, shortId } from './format.js';
import { listLink } from './list.js';
import { requestsOf } from './request.js';
import { href, onLeave } from './router.js';
import { groupTurns, timelineView } from './timeline.js';
import { trajectoryView } from './trajectory.js';
import { idCell, loading, metaItem, panel, statusBadge } from './widgets.js';

export async function conversationPage(root, id, params) {
  const view = ['trajectory', 'timeline'].includes(params.get('view'))
    ? params.get('view')
    : 'chat';
  root.append(loading());
  const [events, info, branches, usage, retrieved, known] = await Promise.all([
    api(`/v1/conversations/${enc(id)}/events`),
    api(`/v1/conversations${query({ id, limit: 1 })}`),
    api(`/v1/conversations${query({ parent_id: id, limit: 100 })}`),
    api(`/v1/conversations/${enc(id)}/usage`),
    api(`/v1/conversations/${enc(id)}`),
    namesOf(),
  ]);
  clear(root);
  const conversation = info.data[0] || { id };
  const turns = groupTurns(events.data);
  const usageById = new Map(usage.data.map((u) => [u.id, u]));
  const lastAlias = [...usage.data].reverse().find((u) => u.alias)?.alias;
  // Threading could not tell which conversation the first request continued: say which ones
  // its history matched, so a reader can compare them.
  const ambiguous = events.data.find(
    (e) => e.type === 'conversation/note' && e.payload.note === 'thread_ambiguous',
  );

  const tabs = h(
    'div',
    { class: 'tabs', role: 'tablist' },
    [
      ['chat', 'Chat'],
      ['trajectory', 'Trajectory'],
      ['timeline', 'Timeline'],
    ].map(([name, label]) =>
      h(
        'a',
        {
          href: href(`/conversations/${enc(id)}`, name === 'chat' ? {} : { view: name }),
          role: 'tab',
          class: view === name ? 'tab active' : 'tab',
          'aria-selected': view === name ? 'true' : 'false',
          'data-testid': `tab-${name}`,
        },
        label,
      ),
    ),
  );
  const meta = h(
    'dl',
    { class: 'meta' },
    metaItem('Status', statusBadge(conversation.status)),
    metaItem('Model', conversation.model || lastAlias || '—'),
    metaItem(
      'Team',
      conversation.team_id ? named(conversation.team_id, known.teams) || conversation.team_id : '—',
    ),
    metaItem(
      'Key',
      conversation.key_id
        ? named(conversation.key_id, known.keys) || idCell(conversation.key_id)
        : adminKeyName(),
    ),
    metaItem(`Created (${ZONE})`, fmtTime(conversation.created_at)),
    metaItem('Turns', String(turns.length)),
    conversation.parent_id
      ? metaItem(
          'Branch of',
          h(
            'span',
            {},
            idCell(conversation.parent_id, href(`/conversations/${enc(conversation.parent_id)}`)),
            ` at seq ${conversation.parent_seq}`,
          ),
        )
      : null,
    ambiguous
      ? metaItem(
          'Started apart from',
          h(
            'span',
            {
              'data-testid': 'thread-ambiguous',
              title:
                'thread_ambiguous: its history matched the last turn of more than one conversation',
            },
            ...(ambiguous.payload.candidates || []).flatMap((c, i) => [
              i ? ', ' : '',
              idCell(c, href(`/conversations/${enc(c)}`)),
            ]),
          ),
        )
      : null,
  );
  root.append(
    h(
      'nav',
      { class: 'crumbs', 'aria-label': 'Breadcrumb' },
      h('a', { href: listLink(), text: 'Conversations', 'data-testid': 'crumb-list' }),
      ' / ',
      h('code', { text: id }),
    ),
    h(
      'header',
      { class: 'page-header' },
      h(
        'div',
        {},
        h('h1', { class: 'conv-title', text: conversation.preview || 'Conversation' }),
        h('p', { class: 'subtitle' }, h('code', { class: 'id', text: id })),
      ),
      tabs,
    ),
    panel(null, meta),
  );

  const body = h('div', { class: 'conv-body' });
  const side = h('aside', { class: 'conv-side' }, branchesPanel(conversation, branches.data));
  root.append(h('div', { class: 'conv-layout' }, body, side));
  if (view === 'chat')
    chatView(body, id, turns, branches.data, lastAlias, requestsOf(events, retrieved));
  else if (view === 'trajectory') trajectoryView(body, id, turns, usageById);
  else timelineView(body, id, turns, usageById);
  if (turns.some((t) => t.conversation_id === id && !t.end))
    liveRefresh(root, id, events.data.length);
}

async function namesOf() {
  // Teams and keys by id, to show them by name: all of them for the master key; a team key
  // knows its own team's and its own name (`GET /v1/me`).
  if (!isAdmin()) {
    const me = session.me;
    return {
      teams: new Map([[me.team_id, ownTeamName()]]),
      keys: new Map(me.key_name ? [[me.key_id, me.key_name]] : []),
    };
  }
  const [teams, keys] = await Promise.all([
    api('/v1/gateway/teams')
      .then((r) => r.data)
      .catch(() => []),
    api('/v1/gateway/keys')
      .then((r) => r.data)
      .catch(() => []),
  ]);
  return names(teams, keys);
}

function named(id, byId) {
  // Its name, the id a hover away; null when its name is not known.
  const name = byId.get(id);
  return name ? h('span', { title: id, text: name }) : null;
}

function liveRefresh(root, id, seen) {
  // A turn in progress: the page follows its events until they change, then shows them (and
  // goes on following while a turn is still open).
  root
    .querySelector('.page-header')
    ?.append(
      h(
        'span',
        { class: 'live', role: 'status', 'data-testid': 'live' },
        h('span', { class: 'live-dot', 'aria-hidden': 'true' }),
        'Live: a turn is in progress',
      ),
    );
  let stopped = false;
  let timer = null;
  const poll = async () => {
    try {
      const fresh = await api(`/v1/conversations/${enc(id)}/events`);
      if (stopped) return;
      if (fresh.data.length !== seen) {
        await redraw();
        return;
      }
    } catch {
      if (stopped) return; // left the page meanwhile; else try again
    }
    timer = setTimeout(poll, 1500);
  };
  timer = setTimeout(poll, 1500);
  onLeave(() => {
    stopped = true;
    clearTimeout(timer);
  });
}

function branchesPanel(conversation, branches) {
  const items = branches.map((b) =>
    h(
      'li',
      { class: 'branch-item', 'data-branch-id': b.id },
      h('a', { href: href(`/conversations/${enc(b.id)}`) }, h('code', { text: shortId(b.id) })),
      h('span', {
        class: 'muted',
        text: ` at seq ${b.parent_seq} · ${b.turns} turn${b.turns === 1 ? '' : 's'} · `,
      }),
      statusBadge(b.status),
    ),
  );
  return panel(
    'Branches',
    conversation.parent_id
      ? h(
          'p',
          { class: 'branch-parent' },
          'This is a branch of ',
          h(
            'a',
            { href: href(`/conversations/${enc(conversation.parent_id)}`) },
            h('code', { text: shortId(conversation.parent_id) }),
          ),
          ` from seq ${conversation.parent_seq}.`,
        )
      : h('p', { class: 'muted', text: 'This conversation is not a branch.' }),
    items.length
      ? h('ul', { class: 'branch-list', 'data-testid': 'branch-list' }, items)
      : h('p', { class: 'muted', text: 'No branches made from it yet.' }),
    h('p', {
      class: 'field-hint',
      text: isAdmin()
        ? '"Branch here" on a finished turn starts a new conversation whose history ends at that turn.'
        : '',
    }),
  );
}
