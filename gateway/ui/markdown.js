// The gateway's admin UI: markdown, JSON and long content, rendered as DOM nodes (never HTML) (an ES module of the page; no build step).

import { append, h } from './dom.js';
import { fmtInt } from './format.js';

export function inlineMarkdown(text) {
  const out = [];
  const pattern =
    /(`[^`\n]+`)|(\*\*[^*\n]+\*\*)|(\*[^*\s][^*\n]*\*)|(\[[^\]\n]+\]\((https?:\/\/[^\s)]+)\))/g;
  let last = 0;
  for (const m of text.matchAll(pattern)) {
    if (m.index > last) out.push(text.slice(last, m.index));
    const [whole] = m;
    if (m[1]) out.push(h('code', { class: 'md-code', text: whole.slice(1, -1) }));
    else if (m[2]) out.push(h('strong', { text: whole.slice(2, -2) }));
    else if (m[3]) out.push(h('em', { text: whole.slice(1, -1) }));
    else
      out.push(
        h('a', {
          href: m[5],
          rel: 'noopener noreferrer',
          target: '_blank',
          text: whole.slice(1, whole.indexOf('](')),
        }),
      );
    last = m.index + whole.length;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

// A GFM table: a header row, a row of `---` cells (a colon says how a column aligns), body rows.
const TABLE_ROW = /^\s*\|?.*\|.*\|?\s*$/;
const TABLE_RULE = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;

function cells(line) {
  // A row's cells: split on pipes not escaped, the outer ones optional.
  const inner = line
    .trim()
    .replace(/^\|/, '')
    .replace(/(?<!\\)\|$/, '');
  return inner.split(/(?<!\\)\|/).map((cell) => cell.trim().replace(/\\\|/g, '|'));
}

function table(lines, start) {
  // The table starting at `start` (its header), and the index of the line after it; null when
  // the lines there are no table.
  if (
    !TABLE_ROW.test(lines[start]) ||
    start + 1 >= lines.length ||
    !TABLE_RULE.test(lines[start + 1])
  )
    return null;
  const head = cells(lines[start]);
  const align = cells(lines[start + 1]).map((rule) => {
    if (rule.startsWith(':') && rule.endsWith(':')) return 'center';
    return rule.endsWith(':') ? 'right' : rule.startsWith(':') ? 'left' : null;
  });
  if (align.length !== head.length) return null;
  let end = start + 2;
  const rows = [];
  while (end < lines.length && lines[end].trim() && lines[end].includes('|'))
    rows.push(cells(lines[end++]));
  const cell = (tag, text, i) =>
    h(
      tag,
      {
        class: align[i] ? `md-align-${align[i]}` : null,
        ...(tag === 'th' ? { scope: 'col' } : {}),
      },
      inlineMarkdown(text || ''),
    );
  const node = h(
    'div',
    { class: 'md-table-wrap', tabindex: '0', role: 'region', 'aria-label': 'Table' },
    h(
      'table',
      { class: 'md-table', 'data-testid': 'md-table' },
      h(
        'thead',
        {},
        h(
          'tr',
          {},
          head.map((text, i) => cell('th', text, i)),
        ),
      ),
      h(
        'tbody',
        {},
        rows.map((row) =>
          h(
            'tr',
            {},
            head.map((_, i) => cell('td', row[i], i)),
          ),
        ),
      ),
    ),
  );
  return { node, end };
}

function listItem(text) {
  // A task list's item (`[ ]` or `[x]`) shows its box, checked or not, which cannot be changed.
  const task = text.match(/^\[([ xX])\]\s+(.*)$/);
  if (!task) return h('li', {}, inlineMarkdown(text));
  const done = task[1] !== ' ';
  return h(
    'li',
    { class: 'md-task' },
    h('input', {
      type: 'checkbox',
      disabled: true,
      checked: done,
      'aria-label': done ? 'done' : 'not done',
    }),
    ' ',
    inlineMarkdown(task[2]),
  );
}

export function markdown(text) {
  const root = h('div', { class: 'md' });
  const lines = text.split('\n');
  let i = 0;
  const paragraph = [];
  const flush = () => {
    if (!paragraph.length) return;
    const p = h('p');
    paragraph.forEach((line, n) => {
      append(p, n ? h('br') : null, inlineMarkdown(line));
    });
    root.append(p);
    paragraph.length = 0;
  };
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*```\s*([\w+-]*)\s*$/);
    if (fence) {
      flush();
      const code = [];
      for (i++; i < lines.length && !/^\s*```\s*$/.test(lines[i]); i++) code.push(lines[i]);
      i++;
      const body = code.join('\n');
      root.append(
        h('pre', {
          class: 'code',
          'data-lang': fence[1] || null,
          text: fence[1] === 'json' ? prettyJson(body) : body,
        }),
      );
      continue;
    }
    const grid = line.includes('|') ? table(lines, i) : null;
    if (grid) {
      flush();
      root.append(grid.node);
      i = grid.end;
      continue;
    }
    const heading = line.match(/^(#{1,6})\s+(.*)$/);
    const item = line.match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
    if (heading) {
      flush();
      root.append(
        h(
          `h${Math.min(heading[1].length + 2, 6)}`,
          { class: 'md-heading' },
          inlineMarkdown(heading[2]),
        ),
      );
    } else if (item) {
      flush();
      const ordered = /\d/.test(item[1]);
      const list = h(ordered ? 'ol' : 'ul', ordered ? { start: parseInt(item[1], 10) } : {});
      while (i < lines.length) {
        const next = lines[i].match(/^\s*([-*+]|\d+[.)])\s+(.*)$/);
        if (!next || /\d/.test(next[1]) !== ordered) break;
        list.append(listItem(next[2]));
        i++;
      }
      root.append(list);
      continue;
    } else if (/^>\s?/.test(line)) {
      flush();
      root.append(h('blockquote', {}, inlineMarkdown(line.replace(/^>\s?/, ''))));
    } else if (!line.trim()) {
      flush();
    } else {
      paragraph.push(line);
    }
    i++;
  }
  flush();
  return root;
}

export function richText(text) {
  // A finished answer: its markdown rendered, with the text as recorded one click away.
  const raw = h('div', { class: 'msg-text', hidden: true, 'data-testid': 'assistant-raw', text });
  const rendered = markdown(text);
  rendered.dataset.testid = 'assistant-text';
  const toggle = h(
    'button',
    {
      class: 'btn btn-small btn-ghost md-toggle',
      type: 'button',
      'aria-pressed': 'false',
      onclick: () => {
        const showRaw = raw.hidden;
        raw.hidden = !showRaw;
        rendered.hidden = showRaw;
        toggle.setAttribute('aria-pressed', String(showRaw));
        toggle.textContent = showRaw ? 'Rendered' : 'Raw';
      },
    },
    'Raw',
  );
  return h('div', { class: 'rich' }, rendered, raw, /[*_`#[\]>\n|-]/.test(text) ? toggle : null);
}

export function folded(node, length) {
  // Long content folded: the first lines show, the rest one click away.
  if (length < 2000) return node;
  node.classList.add('folded');
  const more = h(
    'button',
    {
      class: 'btn btn-small btn-ghost',
      type: 'button',
      'data-testid': 'unfold',
      onclick: () => {
        node.classList.toggle('folded');
        more.textContent = node.classList.contains('folded')
          ? `Show all (${fmtInt(length)} characters)`
          : 'Show less';
      },
    },
    `Show all (${fmtInt(length)} characters)`,
  );
  return h('div', {}, node, more);
}

export function prettyJson(text) {
  if (typeof text !== 'string') return JSON.stringify(text, null, 2);
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}
