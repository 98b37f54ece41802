// The gateway's admin UI: teams and keys, their limits and budgets (an ES module of the page; no
// build step).

import { clear, h } from './dom.js';
import { api, enc, names, query } from './api.js';
import { ZONE, fmtAgo, fmtTime, fmtUsd, limitsText, periodStart } from './format.js';
import {
  badge,
  errorBox,
  field,
  idCell,
  loading,
  notice,
  pageHeader,
  panel,
  select,
  statusBadge,
  table,
} from './widgets.js';

// A create form's limits, folded away: most keys and teams are made without any.
function limitsDetails() {
  return h(
    'details',
    { class: 'limits-details' },
    h('summary', {}, 'Limits and budget'),
    limitsFields(null),
  );
}

function limitsFields(limits) {
  const l = limits || {};
  const b = l.budget || {};
  return h(
    'div',
    { class: 'filter-grid' },
    field(
      'Requests / min',
      h('input', { type: 'number', min: 1, name: 'rpm', value: l.rpm ?? '' }),
    ),
    field('Tokens / min', h('input', { type: 'number', min: 1, name: 'tpm', value: l.tpm ?? '' })),
    field(
      'Concurrent',
      h('input', { type: 'number', min: 1, name: 'max_concurrent', value: l.max_concurrent ?? '' }),
    ),
    field(
      'Budget (USD)',
      h('input', { type: 'number', min: 0, step: 'any', name: 'budget_usd', value: b.usd ?? '' }),
    ),
    field(
      'Budget period',
      select(
        'budget_period',
        [
          ['month', 'Month'],
          ['week', 'Week'],
          ['day', 'Day'],
          ['total', 'Total'],
        ],
        b.period || 'month',
      ),
    ),
    field(
      'Budget mode',
      select(
        'budget_mode',
        [
          ['hard', 'Hard (refuse)'],
          ['soft', 'Soft (warn)'],
        ],
        b.mode || 'hard',
      ),
    ),
  );
}

function limitsFrom(data) {
  const limits = {};
  for (const name of ['rpm', 'tpm', 'max_concurrent'])
    if (data[name]) limits[name] = Number(data[name]);
  if (data.budget_usd)
    limits.budget = {
      usd: Number(data.budget_usd),
      period: data.budget_period,
      mode: data.budget_mode,
    };
  return Object.keys(limits).length ? limits : null;
}

export async function keysPage(root) {
  root.append(
    pageHeader(
      'Keys & teams',
      'Teams own conversations and budgets; their virtual keys are what applications send.',
    ),
  );
  const body = h('div', {}, loading());
  root.append(body);
  const now = Date.now() / 1000;
  const monthStart = periodStart('month', now);
  const [teams, keys, models, recent] = await Promise.all([
    api('/v1/gateway/teams').then((r) => r.data),
    api('/v1/gateway/keys').then((r) => r.data),
    api('/v1/models').then((r) => r.data.map((m) => m.id)),
    // Each key's hours of use over the last 31 days (a month's start is never further back).
    api(
      `/v1/usage${query({ group_by: 'key', granularity: 'hour', from: Math.floor(now - 31 * 86400), to: Math.ceil(now) + 1 })}`,
    ).then((r) => r.data),
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
  const keyForm = h(
    'form',
    { class: 'create-form', 'data-testid': 'create-key-form' },
    h(
      'div',
      { class: 'filter-grid' },
      field(
        'Team',
        select(
          'team_id',
          teams.map((t) => [t.id, `${t.name} (${t.id})`]),
          teams[0]?.id,
          { required: true },
        ),
      ),
      field(
        'Name',
        h('input', { name: 'name', placeholder: 'e.g. ci', 'data-testid': 'key-name' }),
      ),
      field('User', h('input', { name: 'user', placeholder: 'optional end user' })),
      field(
        'Models',
        h('input', {
          name: 'models',
          placeholder: `all, or e.g. ${models.slice(0, 2).join(', ')}`,
        }),
        'comma-separated aliases',
      ),
      field(
        'Expires in (days)',
        h('input', {
          type: 'number',
          min: 0,
          step: 'any',
          name: 'expires_days',
          placeholder: 'never',
        }),
      ),
    ),
    limitsDetails(),
    h(
      'div',
      { class: 'filter-actions' },
      h(
        'button',
        {
          class: 'btn btn-primary',
          type: 'submit',
          disabled: !teams.length,
          'data-testid': 'create-key',
        },
        'Create key',
      ),
    ),
  );
  const keyError = h('div');
  keyForm.addEventListener('submit', async (event) => {
    event.preventDefault();
    clear(keyError);
    const data = Object.fromEntries(new FormData(keyForm).entries());
    const body = { team_id: data.team_id };
    if (data.name) body.name = data.name;
    if (data.user) body.user = data.user;
    if (data.models.trim())
      body.models = data.models
        .split(',')
        .map((m) => m.trim())
        .filter(Boolean);
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
  const teamForm = h(
    'form',
    { class: 'create-form', 'data-testid': 'create-team-form' },
    h(
      'div',
      { class: 'filter-grid' },
      field(
        'Name',
        h('input', {
          name: 'name',
          required: true,
          placeholder: 'e.g. Search',
          'data-testid': 'team-name',
        }),
      ),
      field(
        'Id',
        h('input', {
          name: 'id',
          placeholder: 'generated when empty',
          pattern: '[A-Za-z0-9._\\-]{1,64}',
        }),
      ),
    ),
    limitsDetails(),
    h(
      'div',
      { class: 'filter-actions' },
      h(
        'button',
        { class: 'btn btn-primary', type: 'submit', 'data-testid': 'create-team' },
        'Create team',
      ),
    ),
  );
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

  body.append(
    h(
      'div',
      { class: 'grid-2' },
      panel(
        'New key',
        teams.length ? keyForm : notice('Create a team first: every key belongs to one.'),
        keyError,
      ),
      panel('New team', teamForm, teamError),
    ),
  );

  // -- teams
  const keyCount = (teamId) => keys.filter((k) => k.team_id === teamId && !k.revoked_at).length;
  body.append(
    panel(
      'Teams',
      table(
        [
          {
            label: 'Team',
            cell: (t) =>
              h(
                'div',
                {},
                h('strong', { text: t.name }),
                h('div', { class: 'muted' }, h('code', { text: t.id })),
              ),
          },
          { label: 'Active keys', num: true, cell: (t) => String(keyCount(t.id)) },
          { label: 'Limits', cell: (t) => limitsText(t.limits) },
          { label: `Created (${ZONE})`, cell: (t) => fmtTime(t.created_at, false) },
          {
            label: '',
            cell: (t) =>
              editLimitsButton(`/v1/gateway/teams/${enc(t.id)}`, t.limits, root, `team ${t.name}`),
          },
        ],
        teams.map((t) => ({ ...t, attrs: { 'data-team-id': t.id } })),
        'No teams yet.',
      ),
    ),
  );

  // -- keys
  const teamName = names(teams, []).teams;
  const state = (k) =>
    k.revoked_at ? 'revoked' : k.expires_at && k.expires_at <= now ? 'expired' : 'active';
  body.append(
    panel(
      'Keys',
      table(
        [
          {
            label: 'Key',
            cell: (k) =>
              h(
                'div',
                {},
                h('strong', { text: k.name || '(unnamed)' }),
                h(
                  'div',
                  { class: 'muted' },
                  h('code', { text: `${k.key_prefix}…` }),
                  ' ',
                  idCell(k.id),
                ),
              ),
          },
          {
            label: 'Team',
            cell: (k) =>
              h('span', {
                title: k.team_id,
                'data-testid': 'key-team',
                text: teamName.get(k.team_id) || k.team_id,
              }),
          },
          {
            label: 'State',
            cell: (k) =>
              h(
                'span',
                { 'data-testid': 'key-state' },
                state(k) === 'active' ? badge('active', 'ok') : statusBadge(state(k)),
              ),
          },
          { label: 'Models', cell: (k) => (k.models ? k.models.join(', ') : 'all') },
          { label: 'Limits', cell: (k) => limitsText(k.limits) },
          {
            label: 'Last used',
            sort: (k) => keyUse.get(k.id)?.last,
            cell: (k) =>
              h('span', {
                'data-col': 'last-used',
                title: keyUse.has(k.id)
                  ? `in the UTC hour from ${new Date(keyUse.get(k.id).last * 1000).toISOString().slice(0, 13)}:00`
                  : 'not in the last 31 days',
                text: !keyUse.has(k.id)
                  ? 'not in 31 days'
                  : keyUse.get(k.id).last + 3600 > now
                    ? 'this hour'
                    : fmtAgo(keyUse.get(k.id).last),
              }),
          },
          {
            label: 'Spend this month (UTC)',
            num: true,
            sort: (k) => keyUse.get(k.id)?.month ?? 0,
            cell: (k) =>
              h('span', { 'data-col': 'spend', text: fmtUsd(keyUse.get(k.id)?.month ?? 0) }),
          },
          {
            label: `Expires (${ZONE})`,
            cell: (k) => (k.expires_at ? fmtTime(k.expires_at, false) : 'never'),
          },
          { label: `Created (${ZONE})`, cell: (k) => fmtTime(k.created_at, false) },
          {
            label: '',
            cell: (k) =>
              h(
                'div',
                { class: 'row-actions' },
                k.revoked_at
                  ? null
                  : [
                      editLimitsButton(
                        `/v1/gateway/keys/${enc(k.id)}`,
                        k.limits,
                        root,
                        keyLabel(k, teamName),
                      ),
                      state(k) === 'active' ? rotateButton(k, root, keyLabel(k, teamName)) : null,
                      revokeButton(k, root),
                    ],
              ),
          },
        ],
        keys
          .sort((a, b) => b.created_at - a.created_at)
          .map((k) => ({ ...k, attrs: { 'data-key-id': k.id } })),
        'No keys yet.',
      ),
    ),
  );
}

function keyLabel(key, teamName) {
  // A key as a dialog names it: its name (or prefix) and its team's name.
  const team = teamName.get(key.team_id) || key.team_id;
  return `key ${key.name ? `"${key.name}"` : `${key.key_prefix}…`} of team ${team}`;
}

function rotateButton(key, root, label) {
  // A new key like this one (team, name, models, limits), shown once; the old one keeps working
  // for the overlap chosen, so the applications using it can move over, then expires.
  const wrap = h('span', { class: 'popover-anchor' });
  const open = h(
    'button',
    {
      class: 'btn btn-small',
      type: 'button',
      'data-testid': 'rotate',
      onclick: () => {
        const overlap = select(
          'overlap_s',
          [
            ['3600', 'for an hour'],
            ['86400', 'for a day'],
            ['604800', 'for a week'],
            ['0', 'not at all: it expires now'],
          ],
          '3600',
          { 'data-testid': 'rotate-overlap' },
        );
        const form = h(
          'form',
          { class: 'limits-form' },
          h(
            'p',
            {},
            'A new key with the same team, name, models, limits and expiry; its secret is shown once.',
          ),
          field('The old key keeps working', overlap),
          h(
            'div',
            { class: 'filter-actions' },
            h(
              'button',
              {
                class: 'btn btn-small btn-primary',
                type: 'submit',
                'data-testid': 'rotate-confirm',
              },
              'Rotate',
            ),
            h(
              'button',
              { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => dialog.close() },
              'Cancel',
            ),
          ),
        );
        const title = `Rotate ${label}`;
        const dialog = h(
          'dialog',
          { class: 'popover', 'aria-label': title, 'data-testid': 'rotate-dialog' },
          h('h2', { class: 'popover-title', text: title }),
          form,
        );
        dialog.addEventListener('close', () => dialog.remove());
        form.addEventListener('submit', async (event) => {
          event.preventDefault();
          try {
            const body = { overlap_s: Number(overlap.value) };
            const made = await api(`/v1/gateway/keys/${enc(key.id)}/rotate`, {
              method: 'POST',
              body,
            });
            await keysPage(clear(root));
            showSecret(root.querySelector('[data-testid="secret-box"]'), made);
          } catch (error) {
            form.append(errorBox(error));
          }
        });
        wrap.append(dialog);
        dialog.showModal();
      },
    },
    'Rotate…',
  );
  wrap.append(open);
  return wrap;
}

function showSecret(box, made) {
  const old = made.rotated_from; // a rotation's: the key it replaces
  const named = made.name ? `"${made.name}" ` : '';
  const until = old?.expires_at ? `works until ${fmtTime(old.expires_at)}` : 'has expired';
  const secret = h('code', { class: 'secret', 'data-testid': 'new-secret', text: made.key });
  const copy = h(
    'button',
    {
      class: 'btn btn-small',
      type: 'button',
      onclick: async () => {
        try {
          await navigator.clipboard.writeText(made.key);
          copy.textContent = 'Copied';
        } catch {
          copy.textContent = 'Select and copy it by hand';
        }
      },
    },
    'Copy',
  );
  clear(box).append(
    h(
      'div',
      { class: 'alert alert-success secret-alert', role: 'status' },
      h(
        'div',
        {},
        h('strong', {
          text: `Key ${named}${old ? 'rotated' : 'created'} for team ${made.team_id}.`,
        }),
        old ? ` The old key (${old.key_prefix}…) ${until}.` : '',
        ' Copy it now: this is the only time it is shown (the gateway keeps only its hash).',
      ),
      h(
        'div',
        { class: 'secret-row' },
        secret,
        copy,
        h(
          'button',
          { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => clear(box) },
          'Done',
        ),
      ),
    ),
  );
}

function revokeButton(key, root) {
  const wrap = h('span', { class: 'revoke' });
  const ask = h(
    'button',
    {
      class: 'btn btn-small btn-danger-ghost',
      type: 'button',
      'data-testid': 'revoke',
      onclick: () => {
        clear(wrap).append(
          h('span', { class: 'muted', text: 'Revoke? ' }),
          h(
            'button',
            {
              class: 'btn btn-small btn-danger',
              type: 'button',
              'data-testid': 'revoke-confirm',
              onclick: async () => {
                try {
                  await api(`/v1/gateway/keys/${enc(key.id)}`, { method: 'DELETE' });
                  await keysPage(clear(root));
                } catch (error) {
                  wrap.append(errorBox(error));
                }
              },
            },
            'Revoke',
          ),
          h(
            'button',
            {
              class: 'btn btn-small btn-ghost',
              type: 'button',
              onclick: () => clear(wrap).append(ask),
            },
            'Cancel',
          ),
        );
      },
    },
    'Revoke',
  );
  wrap.append(ask);
  return wrap;
}

function editLimitsButton(path, limits, root, label) {
  const wrap = h('span', { class: 'popover-anchor' });
  const open = h(
    'button',
    {
      class: 'btn btn-small',
      type: 'button',
      'data-testid': 'edit-limits',
      onclick: () => {
        const form = h(
          'form',
          { class: 'limits-form' },
          limitsFields(limits),
          h(
            'div',
            { class: 'filter-actions' },
            h('button', { class: 'btn btn-small btn-primary', type: 'submit' }, 'Save limits'),
            h(
              'button',
              { class: 'btn btn-small btn-ghost', type: 'button', onclick: () => dialog.close() },
              'Cancel',
            ),
          ),
        );
        // A modal dialog: in the top layer, so no scrolling table clips it; Escape closes it.
        // Named after what it edits: two dialogs open one after the other never read alike.
        const title = `Limits and budget of ${label}`;
        const dialog = h(
          'dialog',
          { class: 'popover', 'aria-label': title, 'data-testid': 'limits-dialog' },
          h('h2', { class: 'popover-title', text: title }),
          h('p', { class: 'muted', text: 'An empty field clears that limit.' }),
          form,
        );
        dialog.addEventListener('close', () => dialog.remove());
        form.addEventListener('submit', async (event) => {
          event.preventDefault();
          try {
            await api(path, {
              method: 'PATCH',
              body: { limits: limitsFrom(Object.fromEntries(new FormData(form).entries())) },
            });
            await keysPage(clear(root));
          } catch (error) {
            form.append(errorBox(error));
          }
        });
        wrap.append(dialog);
        dialog.showModal();
      },
    },
    'Limits…',
  );
  wrap.append(open);
  return wrap;
}
