// The gateway's admin UI: charts drawn as SVG elements (an ES module of the page; no build step).

import { h, s } from './dom.js';

export function meter(fraction, colour) {
  const fill = h('div', {
    class: 'meter-fill',
    style: { width: `${Math.max(0, Math.min(1, fraction)) * 100}%`, background: colour },
  });
  return h('div', { class: 'meter' }, fill);
}

function niceStep(value) {
  if (value <= 0) return 1;
  const power = 10 ** Math.floor(Math.log10(value));
  for (const step of [1, 2, 2.5, 5, 10]) if (step * power >= value) return step * power;
  return 10 * power;
}

// A chart is drawn at the width it is shown at, one unit a CSS pixel, and drawn again when that
// width changes: scaled from a fixed width, its labels were 5 px high on a phone. Its box has a
// fixed height (app.css), so drawing it again never resizes what the observer watches.
const CHART_HEIGHT = 240;

export function stackedBars(options) {
  let drawn = 720;
  const box = h('div', { class: 'chart-box' }, drawBars(options, drawn));
  new ResizeObserver(([entry]) => {
    const width = Math.round(entry.contentRect.width);
    if (width > 0 && width !== drawn) {
      drawn = width;
      box.replaceChildren(drawBars(options, Math.max(width, 200)));
    }
  }).observe(box);
  return box;
}

function drawBars({ periods, groups, data, colour, format, tick, name, label = String }, width) {
  const height = CHART_HEIGHT;
  const m = { top: 14, right: 12, bottom: 28, left: 64 };
  const plotW = width - m.left - m.right;
  const plotH = height - m.top - m.bottom;
  const totals = periods.map((t) =>
    groups.reduce((sum, g) => sum + (data.get(`${t}|${g}`) || 0), 0),
  );
  const step = niceStep(Math.max(...totals, 0) / 4);
  const ticks = Math.max(1, Math.ceil(Math.max(...totals, 0) / step));
  const top = step * ticks;
  const slot = plotW / Math.max(periods.length, 1);
  const barW = Math.max(Math.min(slot * 0.7, 42), 1.5);
  const y = (v) => m.top + plotH - (v / top) * plotH;
  const chart = s('svg', {
    viewBox: `0 0 ${width} ${height}`,
    class: 'chart',
    role: 'img',
    'aria-label': `${name} over time`,
    'data-chart': name,
  });
  for (let i = 0; i <= ticks; i++) {
    const v = step * i;
    chart.append(
      s('line', { x1: m.left, x2: width - m.right, y1: y(v), y2: y(v), class: 'grid-line' }),
      s(
        'text',
        { x: m.left - 8, y: y(v) + 4, 'text-anchor': 'end', class: 'axis-label' },
        format(v),
      ),
    );
  }
  const every = Math.max(1, Math.ceil(periods.length / Math.max(2, Math.floor(plotW / 72))));
  periods.forEach((t, i) => {
    const x = m.left + slot * i + (slot - barW) / 2;
    let base = 0;
    for (const g of groups) {
      const v = data.get(`${t}|${g}`) || 0;
      if (v <= 0) continue;
      const rect = s(
        'rect',
        {
          x: x.toFixed(2),
          y: y(base + v).toFixed(2),
          width: barW.toFixed(2),
          height: Math.max((v / top) * plotH, 0.5).toFixed(2),
          fill: colour(g),
          class: 'bar',
          'data-value': v,
          'data-group': g,
          rx: 1.5,
        },
        s('title', {}, `${label(g)} · ${tick(t)}: ${format(v)}`),
      );
      chart.append(rect);
      base += v;
    }
    if (i % every === 0)
      chart.append(
        s(
          'text',
          {
            x: m.left + slot * i + slot / 2,
            y: height - 8,
            'text-anchor': 'middle',
            class: 'axis-label',
          },
          tick(t),
        ),
      );
  });
  chart.append(
    s('line', {
      x1: m.left,
      x2: width - m.right,
      y1: m.top + plotH,
      y2: m.top + plotH,
      class: 'axis-line',
    }),
  );
  return chart;
}
