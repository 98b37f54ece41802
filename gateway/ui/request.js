// The gateway's admin UI: what a turn asked for, as the gateway recorded it when the turn began
// (an ES module of the page; no build step). The recorded request holds the endpoint's dialect,
// the request id, the model alias, stream and user, the system and developer messages
// (`instructions`), the other body fields (`params`, tools among them) and, when recorded, the
// headers that matter (never a secret); the deployments come from the turn's attempts.

import { h } from './dom.js';
import { textOf } from './format.js';
import { prettyJson } from './markdown.js';
import { badge, metaItem } from './widgets.js';

const ENDPOINTS = {
  'openai.chat': '/v1/chat/completions',
  'openai.responses': '/v1/responses',
  'anthropic.messages': '/v1/messages',
};

export function requestsOf(...answers) {
  // Each turn's recorded request by turn id, from the `turns` an API answer carries: a list of
  // turns (`{id, request, response_id, upstream_id}`) or an object keyed by turn id. The id of
  // the answer the client was sent, and the provider's own for it, go with the request.
  const found = new Map();
  for (const answer of answers) {
    const turns = answer?.turns;
    if (Array.isArray(turns)) {
      for (const turn of turns) {
        if (!turn?.request) continue;
        const ids = {
          response_id: turn.response_id || undefined,
          upstream_id: turn.upstream_id || undefined,
        };
        found.set(turn.id, { ...turn.request, ...ids });
      }
    } else if (turns && typeof turns === 'object') {
      for (const [id, turn] of Object.entries(turns)) if (turn) found.set(id, turn.request ?? turn);
    }
  }
  return found;
}

function deploymentsOf(turn) {
  const names = [];
  for (const event of turn.events) {
    const deployment = event.payload?.route?.deployment;
    if (deployment && names[names.length - 1] !== deployment) names.push(deployment);
  }
  return names;
}

function upstreamIds(turn) {
  // The id each attempt's provider gave its answer (Anthropic's `msg_…`, OpenAI's `chatcmpl-…`
  // or `resp_…`), with the deployment it came from.
  const ids = [];
  for (const event of turn.events) {
    const id = event.payload?.upstream_id;
    if (id && !ids.some(([seen]) => seen === id)) ids.push([id, event.payload?.route?.deployment]);
  }
  return ids;
}

function answerIds(turn, request) {
  const upstream = upstreamIds(turn);
  if (request.upstream_id && !upstream.some(([id]) => id === request.upstream_id))
    upstream.push([request.upstream_id]);
  const sent = request.response_id;
  return [
    sent
      ? metaItem('Response id (sent)', h('code', { 'data-testid': 'response-id', text: sent }))
      : null,
    upstream.length
      ? metaItem(
          "Provider's id",
          h(
            'span',
            { class: 'id-list' },
            upstream.map(([id, deployment], i) =>
              h(
                'span',
                {},
                i ? ', ' : '',
                h('code', { 'data-testid': 'upstream-id', text: id }),
                deployment && upstream.length > 1
                  ? h('span', { class: 'muted', text: ` (${deployment})` })
                  : null,
                id === sent ? h('span', { class: 'muted', text: ' (the same)' }) : null,
              ),
            ),
          ),
        )
      : null,
  ];
}

function json(value, label, testid) {
  // It may scroll: reachable from the keyboard.
  return h('pre', {
    class: 'code request-json',
    tabindex: '0',
    role: 'region',
    'aria-label': label,
    'data-testid': testid,
    text: prettyJson(value),
  });
}

export function requestPanel(turn, request) {
  const endpoint = ENDPOINTS[request.endpoint];
  const { tools, ...params } = request.params || {};
  const instructions = request.instructions || [];
  const headers = request.headers && Object.keys(request.headers).length ? request.headers : null;
  const deployments = deploymentsOf(turn);
  const toolNames = (tools || []).map((t) => t.function?.name || t.name || t.type).filter(Boolean);
  return h(
    'details',
    { class: 'request-panel', 'data-testid': 'request-panel' },
    h(
      'summary',
      {},
      'Request',
      h('span', {
        class: 'muted',
        text: ` · ${endpoint ? `POST ${endpoint}` : request.endpoint || 'endpoint not recorded'}${request.model ? ` · ${request.model}` : ''}`,
      }),
    ),
    h(
      'dl',
      { class: 'meta request-meta' },
      metaItem(
        'Endpoint',
        h(
          'span',
          {},
          endpoint ? h('code', { text: `POST ${endpoint}` }) : null,
          ' ',
          request.endpoint
            ? badge(request.endpoint, 'neutral', { 'data-testid': 'request-dialect' })
            : '—',
        ),
      ),
      metaItem(
        'Request id',
        request.request_id
          ? h('code', { 'data-testid': 'request-id', text: request.request_id })
          : '—',
      ),
      answerIds(turn, request),
      metaItem('Model', request.model || '—'),
      metaItem(
        'Deployment',
        h('span', {
          'data-testid': 'request-deployment',
          text: deployments.length ? deployments.join(' → ') : 'none yet',
        }),
      ),
      metaItem('Stream', request.stream ? 'yes' : 'no'),
      request.user ? metaItem('User', request.user) : null,
    ),
    instructions.length
      ? h(
          'div',
          { class: 'request-part' },
          h('h3', { class: 'request-heading', text: 'System prompt' }),
          instructions.map((m) =>
            h(
              'div',
              { class: 'request-instruction', 'data-testid': 'request-system' },
              h('span', { class: 'muted', text: `${m.role || 'system'}: ` }),
              h('span', { class: 'msg-text', text: textOf(m.content) }),
            ),
          ),
        )
      : null,
    h(
      'div',
      { class: 'request-part' },
      h('h3', { class: 'request-heading', text: 'Parameters' }),
      json(params, 'Parameters', 'request-params'),
    ),
    tools?.length
      ? h(
          'div',
          { class: 'request-part' },
          h('h3', { class: 'request-heading', text: `Tools offered (${tools.length})` }),
          h(
            'p',
            { class: 'request-tool-names', 'data-testid': 'request-tool-names' },
            toolNames.map((name) => h('code', { text: name })),
          ),
          json(tools, 'Tools offered', 'request-tools'),
        )
      : null,
    headers
      ? h(
          'div',
          { class: 'request-part' },
          h('h3', { class: 'request-heading', text: 'Headers' }),
          h(
            'dl',
            { class: 'meta request-headers', 'data-testid': 'request-headers' },
            Object.entries(headers).map(([name, value]) =>
              metaItem(name, h('code', { text: String(value) })),
            ),
          ),
        )
      : null,
  );
}
