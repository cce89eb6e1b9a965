// Every metric a run logged, as W&B or TensorBoard would show it: one panel per metric (each its
// own y axis, so a 0-1 rate never shares one with a 0-37 count), grouped by what it is about, a
// chooser to show or hide any of them, smoothing, log scale where the values span decades, and
// one crosshair across all panels. Several runs overlay on the same panels (compare).
import { COLORS, exact, lineChart } from "./charts.js";
import { field, h } from "./lib.js";

// the group of a known key; anything else logged lands in "Other" (nothing is left out)
const GROUPS = [
  ["Reward", ["reward_mean", "success_rate", "reward_std", "zero_advantage_groups", "masked", "episodes", "tool_error_episode_fraction"]],
  ["Optimisation", ["loss", "kl", "grad_norm", "clip_fraction", "ratio_mean", "logprob_gap", "logprob_gap_signed",
    "tis_truncated_fraction", "lr", "learning_rate", "entropy"]],
  ["Episodes", ["episode_turns_mean", "tool_calls", "tool_calls_mean", "generated_tokens", "trained_tokens", "sequences"]],
  ["Throughput", ["rollouts_per_s", "tokens_per_s", "env_wait_fraction"]],
  ["Timing", ["step_s", "wait_s", "learner_s", "weight_sync_s", "elapsed_s"]],
  ["Policy", ["version", "staleness_mean", "staleness_max", "dropped_stale"]],
];
const GROUP_OF = Object.fromEntries(GROUPS.flatMap(([g, keys]) => keys.map((k) => [k, g])));
const ORDER = Object.fromEntries(GROUPS.flatMap(([, keys]) => keys).map((k, i) => [k, i]));
export const DEFAULT = ["reward_mean", "success_rate", "loss", "kl", "grad_norm", "clip_fraction", "logprob_gap",
  "episode_turns_mean", "rollouts_per_s", "tokens_per_s", "env_wait_fraction", "staleness_mean"];
const SKIP = new Set(["step"]);
const LABELS = { reward_mean: "reward (mean)", success_rate: "success rate", staleness_mean: "staleness (mean)",
  staleness_max: "staleness (max)", episode_turns_mean: "turns per episode", tool_calls_mean: "tool calls per episode",
  env_wait_fraction: "env wait (share of step)", tool_error_episode_fraction: "episodes with a tool error" };
export const label = (key) => LABELS[key] || key.replaceAll("_", " ");

// Metrics a run logged as a number though it never computed them: awm's learner logs `kl: 0.0`
// when grpo.kl_coef is 0 (no reference model, nothing measured), which on a chart reads as "the
// policy did not move". The configuration says so; such a metric is absent, with the reason.
export function notComputed(run) {
  const grpo = run.config && run.config.grpo;
  return grpo && typeof grpo === "object" && Number(grpo.kl_coef) === 0
    ? new Map([["kl", "grpo.kl_coef is 0: no reference model, nothing measured"]]) : new Map();
}

// the run's per-step records as {x, values}: numbers as they are, lists of numbers as their mean
// and max (staleness), nested objects left out (reward_distribution). A run without metrics.jsonl
// (TRL, verl, SkyRL) gets its steps from its episodes' policy versions.
export function series(run) {
  if (run.metrics && run.metrics.length) {
    const absent = notComputed(run);
    return { axis: "step", rows: run.metrics.map((r) => {
      const values = {};
      for (const [k, v] of Object.entries(r)) {
        if (SKIP.has(k) || absent.has(k)) continue;
        if (typeof v === "number") values[k] = v;
        else if (Array.isArray(v) && v.length && v.every((x) => typeof x === "number")) {
          values[`${k}_mean`] = v.reduce((a, b) => a + b, 0) / v.length;
          values[`${k}_max`] = Math.max(...v);
        }
      }
      return { x: r.step, values };
    }) };
  }
  if (run.by_version && run.by_version.length) {
    return { axis: "policy version", rows: run.by_version.map(({ version, ...rest }) => ({ x: version, values: rest })) };
  }
  return { axis: "step", rows: [] };
}

// a chart as a standalone SVG file (its styles inlined where the page's CSS gave them)
function svgUrl(svg) {
  const copy = svg.cloneNode(true);
  copy.setAttribute("xmlns", "http://www.w3.org/2000/svg");
  const css = "text{font:11px sans-serif;fill:#4f5660}.grid{stroke:#e3e6eb}.crosshair,.overlay,.zoom-band{display:none}";
  copy.insertBefore(Object.assign(document.createElementNS("http://www.w3.org/2000/svg", "style"), { textContent: css }), copy.firstChild);
  return `data:image/svg+xml;charset=utf-8,${encodeURIComponent(new XMLSerializer().serializeToString(copy))}`;
}

export function keysOf(runsSeries) {
  const keys = new Set();
  for (const { rows } of runsSeries) for (const r of rows) for (const [k, v] of Object.entries(r.values)) if (v !== null) keys.add(k);
  return [...keys].sort((a, b) => (ORDER[a] ?? 999) - (ORDER[b] ?? 999) || a.localeCompare(b));
}

export const groupOf = (key) => GROUP_OF[key] || "Other";

// which logged metrics are not drawn because the run did not compute them, and why
function absentNote(runs) {
  const lines = runs.flatMap(({ run }) => [...notComputed(run)]
    .filter(([key]) => (run.metrics || []).some((r) => typeof r[key] === "number"))
    .map(([key, why]) => `${key}${runs.length > 1 ? ` of ${run.name}` : ""} (logged as a number, but ${why})`));
  return lines.length ? h("p", { class: "muted", id: "not-computed" }, `Not drawn: ${lines.join("; ")}.`) : null;
}

// The x axes a run's metrics can be drawn against: its steps (or policy versions), the time since
// it began (`elapsed_s`, in minutes) and the episodes it had run by then (the sum of `episodes`).
// Each point keeps its step, so that a link or a pick still names the step.
export function axes(runs) {
  const has = (key) => runs.some(({ series: se }) => se.rows.some((row) => typeof row.values[key] === "number"));
  const stepName = runs[0].series.axis === "step" ? "step" : "policy version";
  return [["step", stepName], ...(has("elapsed_s") ? [["elapsed", "elapsed (minutes)"]] : []),
    ...(has("episodes") ? [["episodes", "episodes run"]] : [])];
}

// [{row, x}] of one run's rows on ``axis`` (rows without a value on it left out)
export function along(se, axis) {
  if (axis === "elapsed") return se.rows.filter((row) => typeof row.values.elapsed_s === "number").map((row) => ({ row, x: row.values.elapsed_s / 60 }));
  if (axis === "episodes") {
    let total = 0;
    return se.rows.map((row) => { total += typeof row.values.episodes === "number" ? row.values.episodes : 0; return { row, x: total }; });
  }
  return se.rows.map((row) => ({ row, x: row.x }));
}

// one panel's values as CSV: the x axis, the step (unless that is the axis), one column per run
export function panelCsv(key, lines, xName) {
  const xs = [...new Set(lines.flatMap((l) => l.points.map((p) => p.x)))].sort((a, b) => a - b);
  const byRun = lines.map((l) => new Map(l.points.map((p) => [p.x, p])));
  const cell = (v) => (v === null || v === undefined ? "" : /[",\n]/.test(String(v)) ? `"${String(v).replaceAll('"', '""')}"` : String(v));
  const bySteps = lines.every((l) => l.points.every((p) => p.step === p.x));  // the x axis is the step itself
  const rows = [[xName, ...(bySteps ? [] : ["step"]), ...lines.map((l) => (lines.length > 1 ? `${key} (${l.name})` : key))].map(cell).join(",")];
  for (const x of xs) {
    const step = byRun.map((m) => m.get(x)?.step).find((v) => v !== undefined);
    rows.push([x, ...(bySteps ? [] : [step]), ...byRun.map((m) => m.get(x)?.y)].map(cell).join(","));
  }
  return rows.join("\n") + "\n";
}

const STORE = "awm-ui-metrics";
function saved() {
  try { return JSON.parse(localStorage.getItem(STORE) || "null") || {}; } catch { return {}; }
}

// runs: [{run, series: series(run)}]; opts: highlight (x), link (run, x) -> href of that step's
// episodes (points of the reward panel are links; a click on any panel picks its hovered step)
export function metricPanels(runs, { highlight = null, link = null, hoverGroup = "metrics" } = {}) {
  const keys = keysOf(runs.map((r) => r.series));
  const root = h("section", { class: "metrics", "aria-labelledby": "metrics-h" });
  if (!keys.length) return root;
  const state = { smoothing: 0, log: "auto", chosen: null, xAxis: "step", ...saved() };
  const chosen = new Set((state.chosen || DEFAULT).filter((k) => keys.includes(k)));
  if (!chosen.size) keys.slice(0, 8).forEach((k) => chosen.add(k));
  const axis = runs[0].series.axis;
  const axisChoices = axes(runs);
  if (!axisChoices.some(([v]) => v === state.xAxis)) state.xAxis = "step";
  let xRange = null;  // a zoom: every panel shows the same x range (dragged on any of them)
  const expanded = new Set();  // panels drawn across the whole width
  const panels = h("div", {});
  const resetZoom = h("button", { type: "button", id: "reset-zoom", onclick: () => { xRange = null; draw(); } }, "Reset zoom");
  const store = () => { try { localStorage.setItem(STORE, JSON.stringify({ ...state, chosen: [...chosen] })); } catch { /* private mode */ } };

  const draw = () => {
    const groups = new Map();
    for (const key of keys.filter((k) => chosen.has(k))) {
      const g = groupOf(key);
      if (!groups.has(g)) groups.set(g, []);
      groups.get(g).push(key);
    }
    panels.replaceChildren(...[...groups].map(([g, members]) => h("div", { class: "metric-group" },
      h("h3", {}, g),
      h("div", { class: "panels" }, members.map((key) => {
        const lines = runs.map((r, i) => ({
          name: runs.length > 1 ? r.run.name : label(key), color: COLORS[i % COLORS.length], dash: i >= COLORS.length ? "4 3" : null,
          points: along(r.series, state.xAxis).filter(({ row }) => row.values[key] !== undefined).map(({ row, x }) => ({
            x, step: row.x, y: row.values[key],
            href: link && key === "reward_mean" ? link(r.run, row.x) : null,
            label: `${axis === "step" ? "step" : "version"} ${row.x}: reward ${exact(row.values[key])}${runs.length > 1 ? ` (${r.run.name})` : ""} (open its episodes)`,
          })),
        }));
        const xName = axisChoices.find(([v]) => v === state.xAxis)[1];
        const marked = highlight === null ? null : lines[0].points.find((p) => p.step === highlight)?.x ?? null;
        const figure = h("figure", { class: `panel${expanded.has(key) ? " expanded" : ""}`, "data-metric": key }, lineChart(lines, {
          title: label(key), xLabel: xName, highlight: marked, log: state.log === "auto" ? "auto" : state.log === "on",
          smoothing: Number(state.smoothing), group: hoverGroup, xRange, onZoom: (range) => { xRange = range; draw(); },
          width: expanded.has(key) ? 960 : 480, height: expanded.has(key) ? 320 : 220,
          pick: link && runs.length === 1 ? (x) => link(runs[0].run, lines[0].points.find((p) => p.x === x)?.step ?? x) : null }));
        const tools = h("div", { class: "panel-tools" },
          h("button", { type: "button", class: "link", "aria-pressed": String(expanded.has(key)),
            onclick: () => { if (expanded.has(key)) expanded.delete(key); else expanded.add(key); draw(); } },
          expanded.has(key) ? "Shrink" : "Expand"),
          // made on click: a long run's panels hold thousands of points each (the page draws first)
          h("a", { href: "#", download: `${key}.csv`, class: "csv",
            onclick: (e) => { e.currentTarget.href = `data:text/csv;charset=utf-8,${encodeURIComponent(panelCsv(key, lines, xName))}`; } }, "CSV"),
          h("a", { href: "#", download: `${key}.svg`, class: "svg",
            onclick: (e) => { e.currentTarget.href = svgUrl(figure.querySelector("svg")); } }, "SVG"));
        figure.prepend(tools);
        return figure;
      })))));
    resetZoom.style.display = xRange === null ? "none" : "";  // (the hidden attribute loses to the buttons' CSS)
  };

  // the chooser: a checkbox per metric, by group, with a filter; smoothing; log scale
  const boxes = keys.map((key) => {
    const box = h("input", { type: "checkbox", name: "metric", value: key, checked: chosen.has(key), id: `metric-${key}` });
    box.addEventListener("change", () => { if (box.checked) chosen.add(key); else chosen.delete(key); store(); draw(); });
    return box;
  });
  const filter = h("input", { type: "search", id: "metric-filter", placeholder: "loss, kl, reward…" });
  const list = h("div", { class: "metric-list" });
  const drawList = () => {
    const q = filter.value.trim().toLowerCase();
    const byGroup = new Map();
    keys.forEach((key, i) => {
      if (q && !key.includes(q) && !label(key).includes(q)) return;
      const g = groupOf(key);
      if (!byGroup.has(g)) byGroup.set(g, []);
      byGroup.get(g).push(h("label", { class: "check", for: `metric-${key}` }, boxes[i], ` ${label(key)}`));
    });
    list.replaceChildren(...[...byGroup].map(([g, items]) => h("fieldset", {}, h("legend", {}, g), items)));
  };
  filter.addEventListener("input", drawList);
  const setAll = (on) => { for (const b of boxes) { b.checked = on; if (on) chosen.add(b.value); else chosen.delete(b.value); } store(); draw(); };
  const smoothing = h("input", { type: "range", min: "0", max: "0.99", step: "0.01", value: String(state.smoothing), id: "smoothing" });
  const shown = h("output", { for: "smoothing" }, String(state.smoothing));
  smoothing.addEventListener("input", () => { state.smoothing = Number(smoothing.value); shown.textContent = smoothing.value; store(); draw(); });
  const log = h("select", { id: "log-scale" }, [["auto", "auto (when values span decades)"], ["on", "on"], ["off", "off"]]
    .map(([v, t]) => h("option", { value: v, selected: state.log === v }, t)));
  log.addEventListener("change", () => { state.log = log.value; store(); draw(); });
  const xAxis = h("select", { id: "x-axis" }, axisChoices.map(([v, t]) => h("option", { value: v, selected: state.xAxis === v }, t)));
  xAxis.addEventListener("change", () => { state.xAxis = xAxis.value; xRange = null; store(); draw(); });
  drawList();
  draw();
  // a live page's new steps: the same metrics redrawn in place (the chooser as it is); false when
  // the run logged a metric not seen before (the caller draws the section anew)
  root.update = (next) => {
    if (keysOf(next.map((r) => r.series)).join() !== keys.join()) return false;
    runs = next;
    draw();
    return true;
  };
  root.append(
    h("h2", { id: "metrics-h" }, "Metrics ", h("span", { class: "muted" }, `${chosen.size} of ${keys.length} shown · per ${axis}`)),
    h("div", { class: "metric-controls" },
      h("details", { class: "chooser" }, h("summary", {}, `Choose metrics (${keys.length} logged)`),
        field("Filter metrics", filter),
        h("div", { class: "inline" }, h("button", { type: "button", onclick: () => setAll(true) }, "Show all"),
          h("button", { type: "button", onclick: () => setAll(false) }, "Hide all")),
        list),
      h("div", { class: "field" }, h("label", { for: "smoothing" }, "Smoothing (EMA)"), h("span", {}, smoothing, " ", shown)),
      field("Log scale", log), field("X axis", xAxis), resetZoom),
    absentNote(runs) || "",  // (Element.append writes a null as the text "null")
    h("p", { class: "muted" }, (link ? "Hover a chart for the exact values at a step in every chart; click to open that step's episodes."
      : "Hover a chart for the exact values at a step in every chart.") + " Drag across a chart to zoom every chart to that range."),
    panels);
  return root;
}
