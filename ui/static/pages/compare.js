// N runs compared: their numbers side by side with the difference from the first (the baseline),
// every metric they logged overlaid on shared axes, and per environment and per task the change.
import { exact } from "../charts.js";
import { api, fill, fmt, h, table } from "../lib.js";
import { metricPanels, series } from "../metrics.js";
import { kindBadges, measures, taskRows } from "./summary.js";

function delta(value, base, pct) {
  if (typeof value !== "number" || typeof base !== "number") return null;
  const d = value - base;
  if (Math.abs(d) < 1e-12) return h("span", { class: "delta same" }, "±0");
  const text = pct ? `${d > 0 ? "+" : "−"}${(100 * Math.abs(d)).toFixed(1)} pt` : `${d > 0 ? "+" : "−"}${exact(Number(Math.abs(d).toPrecision(3)))}`;
  return h("span", { class: `delta ${d > 0 ? "up" : "down"}` }, text);
}

function headlines(runs) {
  const rows = new Map();  // measure name -> per run [shown, value]
  runs.forEach((run, i) => {
    for (const [name, shown, value] of measures(run)) {
      const key = name.replace(/\(\d+\)/, "").replace(/\s+/g, " ").trim();  // "last step (30)" and "(12)" are one row
      if (!rows.has(key)) rows.set(key, runs.map(() => null));
      rows.get(key)[i] = [shown, value, name];
    }
  });
  return table([
    { label: "Measure", cell: ([key]) => key },
    ...runs.map((run, i) => ({ label: i === 0 ? `${run.name} (baseline)` : run.name, cls: "num", cell: ([key, cells]) => {
      const c = cells[i];
      if (!c) return "–";
      const pct = /pass@|Success|Masked/.test(key);
      return [String(c[0]), i > 0 && cells[0] ? [" ", delta(c[1], cells[0][1], pct)] : null];
    } })),
  ], [...rows], "Differences are to the first run");
}

function perTaskDiff(runs) {
  const maps = runs.map((run) => new Map(taskRows(run).map((t) => [`${t.env} / ${t.task_id}`, t])));
  const keys = [...new Set(maps.flatMap((m) => [...m.keys()]))];
  if (!keys.length) return h("p", { class: "muted" }, "No per-task results in these runs.");
  const rows = keys.map((key) => ({ key, cells: maps.map((m) => m.get(key) || null) }));
  const change = (r) => {
    const first = r.cells[0]?.pass1, last = r.cells[r.cells.length - 1]?.pass1;
    return typeof first === "number" && typeof last === "number" ? last - first : null;
  };
  rows.sort((a, b) => Math.abs(change(b) ?? -1) - Math.abs(change(a) ?? -1) || a.key.localeCompare(b.key));
  const onlyChanged = h("input", { type: "checkbox", id: "changed-only" });
  const body = h("div", {});
  const draw = () => body.replaceChildren(table([
    { label: "Task", cell: (r) => h("code", {}, r.key) },
    ...runs.map((run, i) => ({ label: `${run.name}: ${run.eval ? "pass@1" : "success"}`, cls: "num", cell: (r) => {
      const t = r.cells[i];
      if (!t) return "not run";
      return [h("a", { href: `#/run/${run.id}?env=${encodeURIComponent(t.env)}&task_id=${encodeURIComponent(t.task_id)}` }, fmt.pct(t.pass1)),
        i > 0 && r.cells[0] ? [" ", delta(t.pass1, r.cells[0].pass1, true)] : null];
    } })),
    { label: "Change, last vs first", cls: "num", cell: (r) => delta(change(r), 0, true) ?? "–" },
  ], onlyChanged.checked ? rows.filter((r) => change(r)) : rows,
  `${keys.length} tasks, the largest change first`));
  onlyChanged.addEventListener("change", draw);
  draw();
  return [h("p", {}, h("label", { class: "check", for: "changed-only" }, onlyChanged, " only tasks whose result changed")), body];
}

export async function render(main, ids) {
  const runs = await Promise.all(ids.filter(Boolean).map((id) => api(`/api/runs/${id}`)));
  const curves = runs.map((run) => ({ run, series: series(run) })).filter((r) => r.series.rows.length);
  fill(main,
    h("p", {}, h("a", { href: "#/runs" }, "Runs"), " / compare"),
    h("h1", {}, `Compare ${runs.length} runs`),
    h("ul", { class: "run-keys" }, runs.map((run) => h("li", {}, h("a", { href: `#/run/${run.id}` }, run.name), " ", kindBadges(run),
      run.eval?.model || run.model ? h("span", { class: "muted" }, ` · ${run.eval?.model || run.model}`) : null))),
    h("h2", {}, "Numbers"), headlines(runs),
    curves.length ? metricPanels(curves, { hoverGroup: "compare" }) : h("p", { class: "muted" }, "None of these runs logged metrics per step."),
    h("section", { "aria-labelledby": "task-diff-h" }, h("h2", { id: "task-diff-h" }, "Per task"), perTaskDiff(runs)));
}
