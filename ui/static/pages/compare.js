// N runs compared against a baseline the user chooses (?baseline=ID, else the first run: the runs
// list puts the oldest first): the settings that differ between them, their numbers side by side
// with the difference to the baseline coloured by whether it is better or worse, every metric
// they logged overlaid on shared axes, and per task the change.
import { exact } from "../charts.js";
import { api, field, fill, fmt, h, query, table } from "../lib.js";
import { metricPanels, series } from "../metrics.js";
import { betterWay, flatten, kindBadges, measures, taskRows } from "./summary.js";

const WORD = { better: "better", worse: "worse", same: "the same", neutral: "no better way" };

// value - base, signed; its class says better / worse by the measure's direction, or neutral
function delta(value, base, pct, better) {
  if (typeof value !== "number" || typeof base !== "number") return null;
  const d = value - base;
  if (Math.abs(d) < 1e-12) return h("span", { class: "delta same", title: WORD.same }, "±0");
  const text = pct ? `${d > 0 ? "+" : "−"}${(100 * Math.abs(d)).toFixed(1)} pt` : `${d > 0 ? "+" : "−"}${exact(Number(Math.abs(d).toPrecision(3)))}`;
  const judged = !better ? "neutral" : (d > 0) === (better === "higher") ? "better" : "worse";
  return h("span", { class: `delta ${judged}`, title: WORD[judged] }, text,
    judged === "neutral" ? null : h("span", { class: "sr" }, ` (${WORD[judged]})`));
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
  const arrow = { higher: "↑ higher is better", lower: "↓ lower is better" };
  return table([
    { label: "Measure", cell: ([key]) => [key, betterWay(key) ? h("small", { class: "muted better-way" }, ` ${arrow[betterWay(key)]}`) : null] },
    ...runs.map((run, i) => ({ label: i === 0 ? `${run.name} (baseline)` : run.name, cls: "num", cell: ([key, cells]) => {
      const c = cells[i];
      if (!c) return "–";
      const pct = /pass@|Success|Masked/.test(key);
      return [String(c[0]), i > 0 && cells[0] ? [" ", delta(c[1], cells[0][1], pct, betterWay(key))] : null];
    } })),
  ], [...rows], "Differences to the baseline: green where better, red where worse, grey where no way is better");
}

// what a run was run with: a training run's config.json, an evaluation's settings from eval.json
function settings(run) {
  const where = run.eval ? { model: run.eval.model, k: run.eval.k, environments: (run.eval.environments || []).map((e) => e.env) }
    : run.config;
  return new Map(where ? flatten(where) : []);
}

// the settings whose values are not all equal, each cell that differs from the baseline marked
function configDiff(runs) {
  const maps = runs.map(settings);
  const keys = [...new Set(maps.flatMap((m) => [...m.keys()]))].sort();
  if (!keys.length) return h("p", { class: "muted" }, "None of these runs has a configuration.");
  const differs = keys.filter((k) => new Set(maps.map((m) => m.get(k) ?? "\u0000absent")).size > 1);
  const all = h("input", { type: "checkbox", id: "config-all" });
  const body = h("div", {});
  const cell = (m, key, base) => {
    const value = m.get(key);
    const changed = value !== base.get(key);
    return h("span", { class: changed ? "differs" : null }, value ?? "(not set)",
      changed ? h("span", { class: "sr" }, " (differs from the baseline)") : null);
  };
  const draw = () => fill(body, table([
    { label: "Setting", cell: (k) => h("code", {}, k) },
    ...runs.map((run, i) => ({ label: i === 0 ? `${run.name} (baseline)` : run.name, cell: (k) => cell(maps[i], k, maps[0]) })),
  ], all.checked ? keys : differs,
  `${differs.length} of ${keys.length} settings differ${all.checked ? " (all shown)" : ""}; values that differ from the baseline are marked`));
  all.addEventListener("change", draw);
  draw();
  return [h("p", {}, h("label", { class: "check", for: "config-all" }, all, ` show all ${keys.length} settings`)), body];
}

function perTaskDiff(runs) {
  const maps = runs.map((run) => new Map(taskRows(run).map((t) => [`${t.env} / ${t.task_id}`, t])));
  const keys = [...new Set(maps.flatMap((m) => [...m.keys()]))];
  if (!keys.length) return h("p", { class: "muted" }, "No per-task results in these runs.");
  const rows = keys.map((key) => ({ key, cells: maps.map((m) => m.get(key) || null) }));
  // the largest change from the baseline, over the other runs
  const change = (r) => {
    const base = r.cells[0]?.pass1;
    const diffs = r.cells.slice(1).map((c) => c?.pass1).filter((v) => typeof v === "number" && typeof base === "number").map((v) => v - base);
    return diffs.length ? diffs.reduce((a, b) => (Math.abs(b) > Math.abs(a) ? b : a)) : null;
  };
  rows.sort((a, b) => Math.abs(change(b) ?? -1) - Math.abs(change(a) ?? -1) || a.key.localeCompare(b.key));
  const onlyChanged = h("input", { type: "checkbox", id: "changed-only" });
  const body = h("div", {});
  const draw = () => fill(body, table([
    { label: "Task", cell: (r) => h("code", {}, r.key) },
    ...runs.map((run, i) => ({ label: `${run.name}${i === 0 ? " (baseline)" : ""}: ${run.eval ? "pass@1" : "success"}`, cls: "num", cell: (r) => {
      const t = r.cells[i];
      if (!t) return "not run";
      return [h("a", { href: `#/run/${run.id}?env=${encodeURIComponent(t.env)}&task_id=${encodeURIComponent(t.task_id)}` }, fmt.pct(t.pass1)),
        i > 0 && r.cells[0] ? [" ", delta(t.pass1, r.cells[0].pass1, true, "higher")] : null];
    } })),
    { label: "Largest change from the baseline", cls: "num", cell: (r) => delta(change(r), 0, true, "higher") ?? "–" },
  ], onlyChanged.checked ? rows.filter((r) => change(r)) : rows,
  `${keys.length} tasks, the largest change first`));
  onlyChanged.addEventListener("change", draw);
  draw();
  return [h("p", {}, h("label", { class: "check", for: "changed-only" }, onlyChanged, " only tasks whose result changed")), body];
}

// the baseline chooser: the choice lives in the URL (shareable), the page is drawn again for it
function baselineChooser(runs, ids, baseline) {
  const choice = h("select", { id: "baseline" }, runs.map((run) => h("option", { value: run.id, selected: run.id === baseline }, run.name)));
  choice.addEventListener("change", () => { location.hash = `#/compare/${ids.join("/")}${query({ baseline: choice.value })}`; });
  return h("div", { class: "inline baseline" }, field("Baseline (differences are to it)", choice));
}

export async function render(main, args, params) {
  const ids = args.filter(Boolean);
  const fetched = await Promise.all(ids.map((id) => api(`/api/runs/${id}`)));
  const baseline = ids.includes(params.baseline) ? params.baseline : ids[0];
  const runs = [...fetched.filter((r) => r.id === baseline), ...fetched.filter((r) => r.id !== baseline)];
  const curves = runs.map((run) => ({ run, series: series(run) })).filter((r) => r.series.rows.length);
  fill(main,
    h("p", {}, h("a", { href: "#/runs" }, "Runs"), " / compare"),
    h("h1", {}, `Compare ${runs.length} runs`),
    h("ul", { class: "run-keys" }, runs.map((run, i) => h("li", {}, h("a", { href: `#/run/${run.id}` }, run.name), " ", kindBadges(run),
      i === 0 ? h("strong", {}, " baseline") : null,
      run.eval?.model || run.model ? h("span", { class: "muted" }, ` · ${run.eval?.model || run.model}`) : null))),
    baselineChooser(runs, ids, baseline),
    h("section", { "aria-labelledby": "config-diff-h" }, h("h2", { id: "config-diff-h" }, "Configuration: what differs"), configDiff(runs)),
    h("h2", {}, "Numbers"), headlines(runs),
    curves.length ? metricPanels(curves, { hoverGroup: "compare" }) : h("p", { class: "muted" }, "None of these runs logged metrics per step."),
    h("section", { "aria-labelledby": "task-diff-h" }, h("h2", { id: "task-diff-h" }, "Per task"), perTaskDiff(runs)));
}
