// Inline SVG charts. Points are links: focusable, named for screen readers, Enter or click
// follows them (the reward curve's points open the episodes of their step).
const NS = "http://www.w3.org/2000/svg";
const MAX_POINTS = 200;

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

// series: [{name, color, points: [{x, y, href?, label?}]}]; y range from the data (or yMin/yMax)
export function lineChart(series, { width = 640, height = 240, title = "", xLabel = "", yMin, yMax } = {}) {
  const pad = { l: 48, r: 12, t: 12, b: 36 };
  const all = series.flatMap((se) => se.points).filter((p) => p.y !== null && p.y !== undefined);
  const xs = all.map((p) => p.x), ys = all.map((p) => p.y);
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const y0 = yMin ?? Math.min(...ys, 0), y1 = yMax ?? Math.max(...ys, 1);
  const X = (x) => pad.l + ((x - x0) / (x1 - x0 || 1)) * (width - pad.l - pad.r);
  const Y = (y) => height - pad.b - ((y - y0) / (y1 - y0 || 1)) * (height - pad.t - pad.b);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title, class: "chart" });
  svg.append(s("title", {}, title));
  for (let i = 0; i <= 4; i++) {
    const v = y0 + ((y1 - y0) * i) / 4;
    svg.append(s("line", { x1: pad.l, x2: width - pad.r, y1: Y(v), y2: Y(v), class: "grid" }));
    svg.append(s("text", { x: pad.l - 6, y: Y(v) + 4, "text-anchor": "end", class: "tick" }, v.toFixed(2)));
  }
  const ticks = [...new Set(xs)].sort((a, b) => a - b);
  const every = Math.max(1, Math.ceil(ticks.length / 10));
  ticks.filter((_, i) => i % every === 0).forEach((x) =>
    svg.append(s("text", { x: X(x), y: height - pad.b + 16, "text-anchor": "middle", class: "tick" }, String(x))));
  if (xLabel) svg.append(s("text", { x: (width + pad.l) / 2, y: height - 4, "text-anchor": "middle", class: "tick" }, xLabel));
  for (const se of series) {
    const pts = se.points.filter((p) => p.y !== null && p.y !== undefined);
    if (!pts.length) continue;
    svg.append(s("polyline", { points: pts.map((p) => `${X(p.x)},${Y(p.y)}`).join(" "), fill: "none",
      stroke: se.color, "stroke-width": 2, class: "series" }));
    // a long run's curve keeps every step in the line but at most MAX_POINTS links (evenly
    // spaced, the last one included): thousands of focusable dots would slow the first paint
    const every = Math.ceil(pts.length / MAX_POINTS);
    for (const p of pts.filter((_, i) => i % every === 0 || i === pts.length - 1)) {
      const dot = s("circle", { cx: X(p.x), cy: Y(p.y), r: 4.5, fill: se.color, class: "point" });
      const label = p.label || `${se.name} ${p.x}: ${p.y}`;
      dot.append(s("title", {}, label));
      if (p.href) {
        const link = s("a", { href: p.href, "aria-label": label, class: "point-link" });
        link.append(dot);
        svg.append(link);
      } else svg.append(dot);
    }
  }
  return withLegend(svg, series, title);
}

// The chart's visible title and a legend in HTML (readable, and checked for contrast like text)
function withLegend(svg, series, title) {
  const box = document.createElement("div");
  box.className = "chart-box";
  const head = document.createElement("div");
  head.className = "chart-head";
  const name = document.createElement("strong");
  name.textContent = title;
  head.append(name);
  for (const se of series) {
    const key = document.createElement("span");
    key.className = "key";
    const swatch = document.createElement("span");
    swatch.className = "swatch";
    swatch.style.background = se.color;
    key.append(swatch, se.name);
    head.append(key);
  }
  box.append(head, svg);
  return box;
}

// bars: [{label, values: [{name, value, color}]}], values in [0, 1]
export function barChart(groups, { width = 640, height = 220, title = "" } = {}) {
  const pad = { l: 44, r: 12, t: 12, b: 40 };
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title, class: "chart" });
  svg.append(s("title", {}, title));
  const Y = (v) => height - pad.b - v * (height - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    svg.append(s("line", { x1: pad.l, x2: width - pad.r, y1: Y(i / 4), y2: Y(i / 4), class: "grid" }));
    svg.append(s("text", { x: pad.l - 6, y: Y(i / 4) + 4, "text-anchor": "end", class: "tick" }, `${i * 25}%`));
  }
  const slot = (width - pad.l - pad.r) / Math.max(groups.length, 1);
  groups.forEach((g, gi) => {
    const bw = (slot * 0.8) / Math.max(g.values.length, 1);
    g.values.forEach((v, vi) => {
      const x = pad.l + gi * slot + slot * 0.1 + vi * bw;
      const rect = s("rect", { x, y: Y(v.value || 0), width: bw - 2, height: Y(0) - Y(v.value || 0), fill: v.color });
      rect.append(s("title", {}, `${g.label} ${v.name}: ${((v.value || 0) * 100).toFixed(1)}%`));
      svg.append(rect);
    });
    svg.append(s("text", { x: pad.l + gi * slot + slot / 2, y: height - pad.b + 16, "text-anchor": "middle", class: "tick" }, g.label));
  });
  return withLegend(svg, (groups[0] || { values: [] }).values.map((v) => ({ name: v.name, color: v.color })), title);
}

export const COLORS = ["#1f5fbf", "#b3261e", "#1b7a3a", "#7a4bc0", "#8a5a00"];
