// The gateway's admin UI: formatting numbers, times and ids (an ES module of the page; no build step).

export const pad = (n, w = 2) => String(n).padStart(w, '0');

// Times show in the browser's time zone, named wherever they appear (bucketed usage is UTC).
export const ZONE = Intl.DateTimeFormat().resolvedOptions().timeZone || 'local time';

export function fmtTime(seconds, withSeconds = true) {
  if (seconds === null || seconds === undefined) return '—';
  const d = new Date(seconds * 1000);
  const date = `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())}`;
  const time = `${pad(d.getHours())}:${pad(d.getMinutes())}${withSeconds ? `:${pad(d.getSeconds())}` : ''}`;
  return `${date} ${time}`;
}

export function fmtAgo(seconds) {
  if (!seconds) return '—';
  const delta = Date.now() / 1000 - seconds;
  if (delta < 60) return 'just now';
  if (delta < 3600) return `${Math.floor(delta / 60)} min ago`;
  if (delta < 86400) return `${Math.floor(delta / 3600)} h ago`;
  return `${Math.floor(delta / 86400)} d ago`;
}

export function fmtMs(ms) {
  if (ms === null || ms === undefined) return '—';
  if (ms < 1000) return `${Math.round(ms)} ms`;
  return `${(ms / 1000).toFixed(ms < 10000 ? 2 : 1)} s`;
}

export function fmtUsd(value) {
  // Every cost the UI shows, by one rule: from $1 up, to the cent (`$12.35`); under $1, as exact
  // as the price makes it, up to six decimals and never fewer than two (`$0.25`, `$0.022`,
  // `$0.000165`).
  if (value === null || value === undefined) return '—';
  if (Math.abs(value) >= 1) return `$${value.toFixed(2)}`;
  const text = value.toFixed(6).replace(/0+$/, '');
  const [whole, fraction = ''] = text.split('.');
  return `$${whole}.${fraction.padEnd(2, '0')}`;
}

export const fmtUsdExact = fmtUsd;

// One formatter for every count: `toLocaleString` makes a new one each call, which a page of a
// few thousand cells (the Usage page by user) spends most of its script time on.
const INTEGER = new Intl.NumberFormat('en-US', { maximumFractionDigits: 0 });

export function fmtInt(value) {
  if (value === null || value === undefined) return '—';
  return INTEGER.format(Math.round(value));
}

export function fmtCompact(value) {
  const abs = Math.abs(value);
  if (abs >= 1e9) return `${(value / 1e9).toFixed(1)}B`;
  if (abs >= 1e6) return `${(value / 1e6).toFixed(1)}M`;
  if (abs >= 1e4) return `${(value / 1e3).toFixed(0)}k`;
  if (abs >= 1e3) return `${(value / 1e3).toFixed(1)}k`;
  return String(Math.round(value * 100) / 100);
}

export function plural(count, word, many = `${word}s`) {
  return `${fmtInt(count)} ${count === 1 ? word : many}`;
}

export function fmtPct(part, whole) {
  // A share: never above 100% (each count is of a subset of what it is divided by).
  if (!whole) return '—';
  return `${Math.min(100, (100 * part) / whole).toFixed(1)}%`;
}

export function shortId(id) {
  // Generated ids are `<prefix>_<12 hex of ms time><20 random hex>`: the head is the time (alike
  // for every id of a minute), so the random tail is what tells two ids apart.
  if (!id) return '—';
  const cut = id.indexOf('_');
  const [prefix, rest] = cut >= 0 ? [id.slice(0, cut + 1), id.slice(cut + 1)] : ['', id];
  if (/^[0-9a-f]{32}$/.test(rest)) return `${prefix}…${rest.slice(-8)}`;
  return id.length > 28 ? `${id.slice(0, 27)}…` : id; // a client-chosen id: its head
}

export function textOf(content) {
  if (content === null || content === undefined) return '';
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    return content
      .map((part) =>
        typeof part === 'string'
          ? part
          : part.text !== undefined
            ? part.text
            : `[${part.type || 'part'}]`,
      )
      .join('');
  }
  return JSON.stringify(content);
}

export function utcDay(value) {
  // <input type=date> value -> Unix seconds at that UTC midnight.
  return value ? Date.parse(`${value}T00:00:00Z`) / 1000 : null;
}

export function periodStart(period, now) {
  // Where a budget's current period began (UTC), as the gateway counts it.
  const d = new Date(now * 1000);
  if (period === 'day') return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate()) / 1000;
  if (period === 'week') {
    const back = (d.getUTCDay() + 6) % 7; // Monday
    return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), d.getUTCDate() - back) / 1000;
  }
  if (period === 'month') return Date.UTC(d.getUTCFullYear(), d.getUTCMonth(), 1) / 1000;
  return 0;
}

export function limitsText(limits) {
  if (!limits) return '—';
  const parts = [];
  if (limits.rpm) parts.push(`${limits.rpm} rpm`);
  if (limits.tpm) parts.push(`${fmtCompact(limits.tpm)} tpm`);
  if (limits.max_concurrent) parts.push(`${limits.max_concurrent} concurrent`);
  if (limits.budget)
    parts.push(`${fmtUsd(limits.budget.usd)}/${limits.budget.period} ${limits.budget.mode}`);
  return parts.join(' · ') || '—';
}
