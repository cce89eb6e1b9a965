// Inline SVG charts, no dependency. A line chart has rounded ("nice") ticks, a linear or log y
// axis, optional EMA smoothing (the raw line stays, faint), a highlighted x (the chosen step) and
// a crosshair shared by every chart of the same hover group: moving over one chart shows the exact
// values at that x in every chart's readout line. Points with an href are links: focusable, named
// for screen readers, Enter or click follows them (the reward curve's points open their step's
// episodes); a click anywhere on a chart with `pick` opens the hovered x the same way.
const NS = "http://www.w3.org/2000/svg";
const MAX_POINTS = 200;  // focusable points per series at most (thousands would slow the first paint)

function s(tag, attrs = {}, text) {
  const el = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== null && v !== undefined) el.setAttribute(k, v);
  if (text !== undefined) el.textContent = text;
  return el;
}

const present = (y) => y !== null && y !== undefined && Number.isFinite(y);

// how many decimals `x` needs to be written exactly (0.25: 2, 5: 0, 1e-7: 7), at most 12
export function decimalsOf(x) {
  for (let d = 0; d < 12; d++) {
    const scaled = Math.abs(x) * 10 ** d;
    if (Math.abs(scaled - Math.round(scaled)) < 1e-9 * Math.max(1, scaled)) return d;
  }
  return 12;
}

// 1, 2, 2.5 or 5 times a power of ten: the step of about `count` ticks over [lo, hi]. Each tick
// is its index times the step, rounded to the step's decimals: summing steps would drift (0.1
// added seven times is not 0.7, and the tick at zero came out as -7e-18).
export function niceTicks(lo, hi, count = 5) {
  if (!(hi > lo)) { const pad = Math.abs(lo) / 10 || 1; lo -= pad; hi += pad; }
  const raw = (hi - lo) / count;
  const mag = 10 ** Math.floor(Math.log10(raw));
  const step = Number(([1, 2, 2.5, 5, 10].map((m) => m * mag).find((st) => st >= raw * (1 - 1e-9)) || 10 * mag).toPrecision(12));
  const decimals = decimalsOf(step);
  const at = (k) => Number((k * step).toFixed(decimals)) || 0;  // `|| 0`: never a tick labelled -0
  const first = Math.floor(lo / step + 1e-9), last = Math.ceil(hi / step - 1e-9);
  const ticks = [];
  for (let k = first; k <= last; k++) ticks.push(at(k));
  return { ticks, step, lo: at(first), hi: at(last) };
}

// a tick's label: exactly as many decimals as the step has (a 0.25 step reads 0.25, not 0.3),
// thousands as k / M, steps below a millionth in exponent form. Without a step (a log axis' power
// of ten) the value's own decimals.
export function tickLabel(v, step = 0) {
  if (Math.abs(v) < 1e-12 * (step || 1)) v = 0;  // a zero computed as -7e-18 reads 0
  const a = Math.abs(v), unit = step || a || 1;
  if (a >= 1e6 && unit >= 1e3) return `${(v / 1e6).toFixed(decimalsOf(unit / 1e6))}M`;
  if (a >= 1e4 && unit >= 1) return `${(v / 1e3).toFixed(decimalsOf(unit / 1e3))}k`;
  const decimals = decimalsOf(unit);
  if (decimals <= 6) return v.toFixed(decimals);
  if (!v) return "0";
  return v.toExponential(Math.min(6, decimalsOf(v / 10 ** Math.floor(Math.log10(a) + 1e-9))));
}

// exact values in readouts: up to 6 significant digits, no trailing zeros
export function exact(v) {
  if (!present(v)) return "–";
  if (Number.isInteger(v)) return String(v);
  const a = Math.abs(v);
  return a !== 0 && (a < 1e-4 || a >= 1e7) ? v.toExponential(4) : String(Number(v.toPrecision(6)));
}

// TensorBoard's smoothing: an exponential moving average, debiased at the start
export function smooth(points, weight) {
  if (!weight) return points;
  let last = 0, n = 0;
  return points.map((p) => {
    if (!present(p.y)) return p;
    last = last * weight + (1 - weight) * p.y;
    n += 1;
    return { ...p, y: last / (1 - weight ** n) };
  });
}

// a log axis is useful when every value is positive and they span more than two decades
export function wantsLog(values) {
  const v = values.filter(present);
  if (!v.length || Math.min(...v) <= 0) return false;
  return Math.max(...v) / Math.min(...v) > 100;
}

const hoverGroups = new Map();  // group name -> set of charts' show(x) functions

function nearest(sorted, x) {
  let lo = 0, hi = sorted.length - 1;
  while (lo < hi) { const mid = (lo + hi) >> 1; if (sorted[mid] < x) lo = mid + 1; else hi = mid; }
  return lo > 0 && Math.abs(sorted[lo - 1] - x) <= Math.abs(sorted[lo] - x) ? sorted[lo - 1] : sorted[lo];
}

// series: [{name, color, points: [{x, y, href?, label?}]}]
// options: title, xLabel, width, height, yMin, yMax, log ("auto" | true | false), smoothing (0..0.99),
//          highlight (an x), group (hover group), pick (x -> href), describe (series, x, y -> text)
export function lineChart(series, opts = {}) {
  const { width = 480, height = 220, title = "", xLabel = "", group = null, highlight = null, pick = null,
    xRange = null, onZoom = null } = opts;
  const pad = { l: 52, r: 12, t: 10, b: 34 };
  // xRange [lo, hi]: only that part of the x axis (a zoom); onZoom(range): a drag across the chart
  const inRange = (p) => !xRange || (p.x >= xRange[0] && p.x <= xRange[1]);
  const all = series.flatMap((se) => se.points).filter((p) => present(p.y) && inRange(p));
  const box = document.createElement("div");
  box.className = "chart-box";
  if (!all.length) {
    box.append(head(title, series), Object.assign(document.createElement("p"), { className: "muted", textContent: "No values." }));
    return box;
  }
  const xsAll = [...new Set(all.map((p) => p.x))].sort((a, b) => a - b);
  const x0 = xsAll[0], x1 = xsAll.length > 1 ? xsAll[xsAll.length - 1] : x0 + 1;
  const ys = all.map((p) => p.y);
  const log = opts.log === true ? ys.every((v) => v > 0) : opts.log === false ? false : wantsLog(ys);
  const T = log ? Math.log10 : (v) => v;
  let yTicks, y0, y1;
  if (log) {
    const lo = Math.floor(Math.log10(Math.min(...ys))), hi = Math.ceil(Math.log10(Math.max(...ys)));
    y0 = lo; y1 = Math.max(hi, lo + 1);
    yTicks = [];
    for (let e = y0; e <= y1; e++) yTicks.push({ v: e, label: tickLabel(Number((10 ** e).toPrecision(1))) });
  } else {
    const lo = opts.yMin ?? Math.min(...ys), hi = opts.yMax ?? Math.max(...ys);
    const nice = niceTicks(Math.min(lo, opts.yMin ?? lo), Math.max(hi, opts.yMax ?? hi), 4);
    y0 = nice.lo; y1 = nice.hi;
    yTicks = nice.ticks.map((v) => ({ v, label: tickLabel(v, nice.step) }));
  }
  const X = (x) => pad.l + ((x - x0) / (x1 - x0 || 1)) * (width - pad.l - pad.r);
  const Y = (y) => height - pad.b - ((T(y) - y0) / (y1 - y0 || 1)) * (height - pad.t - pad.b);
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title + (log ? " (log scale)" : ""), class: "chart" });
  svg.append(s("title", {}, title));
  for (const t of yTicks) {
    const y = height - pad.b - ((t.v - y0) / (y1 - y0 || 1)) * (height - pad.t - pad.b);
    svg.append(s("line", { x1: pad.l, x2: width - pad.r, y1: y, y2: y, class: "grid" }));
    svg.append(s("text", { x: pad.l - 6, y: y + 4, "text-anchor": "end", class: "tick" }, t.label));
  }
  // steps and versions are whole numbers: their ticks too (1 2 3, not 1.0 1.5 2.0 2.5 3.0)
  const integral = xsAll.every(Number.isInteger);
  const xt = niceTicks(x0, x1, integral ? Math.max(1, Math.min(6, x1 - x0)) : 6);
  for (const x of xt.ticks.filter((v) => v >= x0 && v <= x1 && (Number.isInteger(v) || !integral))) {
    svg.append(s("text", { x: X(x), y: height - pad.b + 16, "text-anchor": "middle", class: "tick" }, tickLabel(x, xt.step)));
  }
  if (xLabel) svg.append(s("text", { x: width - pad.r, y: height - 3, "text-anchor": "end", class: "tick" }, xLabel));
  if (highlight !== null && highlight !== undefined && highlight >= x0 && highlight <= x1) {
    svg.append(s("line", { x1: X(highlight), x2: X(highlight), y1: pad.t, y2: height - pad.b, class: "highlight" }));
  }
  const weight = opts.smoothing || 0;
  const drawn = series.map((se) => ({ ...se, raw: se.points.filter((p) => present(p.y) && inRange(p)) }))
    .map((se) => ({ ...se, line: smooth(se.raw, weight) }));
  // a line of more points than the panel has pixels is drawn through each pixel column's lowest
  // and highest point (its shape, spikes included, at a fraction of the DOM); hover reads all
  const columns = Math.round(width - pad.l - pad.r);
  const thin = (pts) => {
    if (pts.length <= 2 * columns) return pts;
    const out = [];
    let bucket = -1, lo = null, hi = null;
    const flush = () => { if (lo) out.push(...(lo === hi ? [lo] : lo.x < hi.x ? [lo, hi] : [hi, lo])); };
    for (const p of pts) {
      const b = Math.floor(((p.x - x0) / (x1 - x0 || 1)) * columns);
      if (b !== bucket) { flush(); bucket = b; lo = hi = p; continue; }
      if (p.y < lo.y) lo = p;
      if (p.y > hi.y) hi = p;
    }
    flush();
    return out;
  };
  const path = (pts) => thin(pts).map((p) => `${X(p.x).toFixed(1)},${Y(p.y).toFixed(1)}`).join(" ");
  for (const se of drawn) {
    if (!se.raw.length) continue;
    if (weight) svg.append(s("polyline", { points: path(se.raw), fill: "none", stroke: se.color, "stroke-width": 1, opacity: 0.3, class: "series raw" }));
    svg.append(s("polyline", { points: path(se.line), fill: "none", stroke: se.color, "stroke-width": 2, class: "series",
      "stroke-dasharray": se.dash || null }));
    if (se.raw.length === 1) svg.append(s("circle", { cx: X(se.raw[0].x), cy: Y(se.raw[0].y), r: 3, fill: se.color }));
    const linked = se.raw.filter((p) => p.href);
    const every = Math.ceil(linked.length / MAX_POINTS);
    for (const p of linked.filter((_, i) => i % every === 0 || i === linked.length - 1)) {
      const dot = s("circle", { cx: X(p.x), cy: Y(p.y), r: 4, fill: se.color, class: "point" });
      const label = p.label || `${se.name} ${p.x}: ${exact(p.y)}`;
      dot.append(s("title", {}, label));
      const link = s("a", { href: p.href, "aria-label": label, class: "point-link" });
      link.append(dot);
      svg.append(link);
    }
  }
  // the crosshair, its tooltip and the readout (exact values at the hovered x)
  const cross = s("line", { y1: pad.t, y2: height - pad.b, class: "crosshair", visibility: "hidden" });
  const overlay = s("rect", { x: pad.l, y: pad.t, width: width - pad.l - pad.r, height: height - pad.t - pad.b, class: "overlay",
    fill: "transparent" });
  svg.insertBefore(cross, svg.firstChild.nextSibling);
  svg.insertBefore(overlay, svg.querySelector(".point-link"));  // the points stay clickable above it
  const byX = drawn.map((se) => new Map(se.raw.map((p, i) => [p.x, [p.y, se.line[i].y]])));
  const readout = document.createElement("div");
  readout.className = "readout";
  const tip = document.createElement("div");
  tip.className = "tooltip";
  tip.hidden = true;
  const values = (x) => drawn.map((se, i) => {
    const v = byX[i].get(x);
    if (!v) return null;
    return `${se.name} ${exact(v[0])}${weight ? ` (smoothed ${exact(v[1])})` : ""}`;
  }).filter(Boolean);
  const show = (x, here) => {
    if (x === null || x < x0 || x > x1) {
      cross.setAttribute("visibility", "hidden"); tip.hidden = true; readout.textContent = ""; return;
    }
    const at = nearest(xsAll, x);
    cross.setAttribute("x1", X(at)); cross.setAttribute("x2", X(at)); cross.setAttribute("visibility", "visible");
    const text = `${xLabel || "x"} ${exact(at)}: ${values(at).join(" · ") || "no value"}`;
    readout.textContent = text;
    tip.hidden = !here;
    if (here) {
      tip.textContent = text;
      tip.style.left = `${Math.min(85, (100 * (X(at) / width)))}%`;
    }
  };
  const toX = (event) => {
    const pt = svg.createSVGPoint();
    pt.x = event.clientX; pt.y = event.clientY;
    const local = pt.matrixTransform(svg.getScreenCTM().inverse());
    return x0 + ((local.x - pad.l) / (width - pad.l - pad.r)) * (x1 - x0);
  };
  const members = group ? (hoverGroups.get(group) || hoverGroups.set(group, new Set()).get(group)) : new Set();
  const mine = (x) => show(x, false);
  mine.svg = svg;
  members.add(mine);
  const broadcast = (x) => {
    for (const other of members) {
      if (!other.svg.isConnected) members.delete(other);  // a chart of a page left or redrawn
      else if (other !== mine) other(x);
    }
  };
  // drag across the chart to zoom to that x range (a click without a drag still picks)
  let dragFrom = null, dragged = false;
  const band = s("rect", { y: pad.t, height: height - pad.t - pad.b, class: "zoom-band", visibility: "hidden" });
  svg.insertBefore(band, overlay);
  overlay.addEventListener("mousedown", (e) => {
    if (!onZoom || e.button !== 0) return;
    dragFrom = toX(e);
    e.preventDefault();
  });
  overlay.addEventListener("mousemove", (e) => {
    const x = toX(e);
    show(x, true);
    broadcast(x);
    if (dragFrom !== null) {
      const a = Math.max(pad.l, Math.min(X(dragFrom), X(x))), b = Math.min(width - pad.r, Math.max(X(dragFrom), X(x)));
      band.setAttribute("x", a); band.setAttribute("width", Math.max(0, b - a)); band.setAttribute("visibility", "visible");
    }
  });
  overlay.addEventListener("mouseup", (e) => {
    if (dragFrom === null) return;
    const x = toX(e), from = dragFrom;
    dragFrom = null;
    band.setAttribute("visibility", "hidden");
    if (Math.abs(X(x) - X(from)) > 6) {
      dragged = true;  // not a click
      // to the points nearest the drag's ends: the range holds the points the drag went over
      onZoom([nearest(xsAll, Math.min(from, x)), nearest(xsAll, Math.max(from, x))]);
    }
  });
  svg.addEventListener("mouseleave", () => { show(null); broadcast(null); dragFrom = null; band.setAttribute("visibility", "hidden"); });
  if (pick) {
    overlay.style.cursor = "pointer";
    overlay.addEventListener("click", (e) => {
      if (dragged) { dragged = false; return; }
      location.hash = pick(nearest(xsAll, toX(e)));
    });
  }
  if (onZoom) svg.classList.add("zoomable");
  box.append(head(title, series, log), svg, tip, readout);
  return box;
}

// forget the hover members of charts no longer in the page (called by pages when they redraw)
export function resetHover(group) { hoverGroups.delete(group); }

// The chart's visible title and a legend in HTML (readable, and checked for contrast like text)
function head(title, series, log = false) {
  const el = document.createElement("div");
  el.className = "chart-head";
  const name = document.createElement("strong");
  name.textContent = title;
  el.append(name);
  if (log) {
    const tag = document.createElement("span");
    tag.className = "muted";
    tag.textContent = "log scale";
    el.append(tag);
  }
  if (series.length > 1 || series.some((se) => se.name !== title)) {
    for (const se of series) {
      const key = document.createElement("span");
      key.className = "key";
      const swatch = document.createElement("span");
      swatch.className = "swatch";
      swatch.style.background = se.color;
      key.append(swatch, se.name);
      el.append(key);
    }
  }
  return el;
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
      const rect = s("rect", { x, y: Y(v.value || 0), width: Math.max(1, bw - 2), height: Y(0) - Y(v.value || 0), fill: v.color });
      rect.append(s("title", {}, `${g.label} ${v.name}: ${((v.value || 0) * 100).toFixed(1)}%`));
      svg.append(rect);
    });
    svg.append(s("text", { x: pad.l + gi * slot + slot / 2, y: height - pad.b + 16, "text-anchor": "middle", class: "tick" }, g.label));
  });
  const box = document.createElement("div");
  box.className = "chart-box";
  box.append(head(title, (groups[0] || { values: [] }).values.map((v) => ({ name: v.name, color: v.color }))), svg);
  return box;
}

// How a value was distributed at each x: one stacked column per x, a segment per value (its
// share of that x's count), the values' colours from the lowest to the highest. columns:
// [{x, counts: {value: count}}] (e.g. each step's episodes by reward); a segment's <title> and
// data attributes say its x, value, count and share; a column is a link when `href(x)` is given.
export function distributionChart(columns, { width = 640, height = 220, title = "", xLabel = "step", valueLabel = "value", href = null } = {}) {
  const pad = { l: 44, r: 12, t: 12, b: 34 };
  // more columns than ~2 pixels each: adjacent ones summed into one (x "first–last"), as a long
  // run's 6,250 steps would otherwise be 6,250 columns of segments
  const most = Math.floor((width - pad.l - pad.r) / 3);
  if (columns.length > most) {
    const size = Math.ceil(columns.length / most);
    const merged = [];
    for (let i = 0; i < columns.length; i += size) {
      const part = columns.slice(i, i + size), counts = {};
      for (const c of part) for (const [v, n] of Object.entries(c.counts || {})) counts[v] = (counts[v] || 0) + n;
      merged.push({ x: part.length > 1 ? `${part[0].x}–${part[part.length - 1].x}` : part[0].x, first: part[0].x, counts });
    }
    columns = merged;
  }
  const values = [...new Set(columns.flatMap((c) => Object.keys(c.counts || {})))].sort((a, b) => Number(a) - Number(b) || a.localeCompare(b));
  const color = Object.fromEntries(values.map((v, i) => [v, scale(i, values.length)]));
  const svg = s("svg", { viewBox: `0 0 ${width} ${height}`, role: "img", "aria-label": title, class: "chart distribution" });
  svg.append(s("title", {}, title));
  const Y = (share) => height - pad.b - share * (height - pad.t - pad.b);
  for (let i = 0; i <= 4; i++) {
    svg.append(s("line", { x1: pad.l, x2: width - pad.r, y1: Y(i / 4), y2: Y(i / 4), class: "grid" }));
    svg.append(s("text", { x: pad.l - 6, y: Y(i / 4) + 4, "text-anchor": "end", class: "tick" }, `${i * 25}%`));
  }
  const slot = (width - pad.l - pad.r) / Math.max(columns.length, 1);
  const every = Math.max(1, Math.ceil(columns.length / 12));  // at most ~12 x labels
  columns.forEach((c, ci) => {
    const total = Object.values(c.counts || {}).reduce((a, b) => a + b, 0);
    const x = pad.l + ci * slot + slot * 0.1, w = Math.max(1, slot * 0.8);
    const column = href ? s("a", { href: href(c.first ?? c.x), "aria-label": `${xLabel} ${c.x}: open its episodes` }) : s("g", {});
    let below = 0;
    for (const v of values) {
      const n = (c.counts || {})[v] || 0;
      if (!n || !total) continue;
      const share = n / total;
      const rect = s("rect", { x, y: Y(below + share), width: w, height: Y(below) - Y(below + share), fill: color[v],
        "data-x": c.x, "data-value": v, "data-count": n, "data-share": share.toFixed(4) });
      rect.append(s("title", {}, `${xLabel} ${c.x}: ${valueLabel} ${v}, ${n} of ${total} (${(100 * share).toFixed(1)}%)`));
      column.append(rect);
      below += share;
    }
    svg.append(column);
    if (ci % every === 0) svg.append(s("text", { x: x + w / 2, y: height - pad.b + 14, "text-anchor": "middle", class: "tick" }, String(c.x)));
  });
  svg.append(s("text", { x: pad.l + (width - pad.l - pad.r) / 2, y: height - 4, "text-anchor": "middle", class: "tick" }, xLabel));
  const box = document.createElement("div");
  box.className = "chart-box";
  box.append(head(title, values.map((v) => ({ name: `${valueLabel} ${v}`, color: color[v] }))), svg);
  return box;
}

// the i-th of n values from low to high: hues from red through amber and green to blue, each its
// own, dark enough for text-level contrast on white
function scale(i, n) {
  return `hsl(${Math.round((n > 1 ? i / (n - 1) : 1) * 220)}, 70%, 34%)`;
}

// distinct, dark enough for text-level contrast on white
export const COLORS = ["#1f5fbf", "#b3261e", "#1b7a3a", "#7a4bc0", "#8a5a00", "#00727a", "#a4247a", "#4d5a00"];
