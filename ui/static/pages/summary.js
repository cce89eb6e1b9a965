// The parts of a run's page that compare reuses: headline numbers, the configuration, pass@k and
// results per environment and per task with how the failures failed, each linked to its episodes.
import { barChart, COLORS, exact } from "../charts.js";
import { notComputed } from "../metrics.js";
import { badge, fmt, h, query, table } from "../lib.js";

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);
const runLink = (run, params) => `#/run/${run.id}${query(params)}`;

// the episodes of one point of a curve: a step (awm's trainer logs which groups each step trained
// on) or a policy version (TRL, verl, SkyRL runs: every turn records the weights' version)
export function stepLink(run, x) {
  return runLink(run, run.metrics && run.metrics.length ? { step: x } : { version: x });
}

export function kindBadges(run) {
  return [badge(run.kind, "neutral"), run.framework ? badge(run.framework, "neutral") : null];
}

// the numbers a run is judged by, each saying what it is over (the last step, the whole run)
export function measures(run) {
  const m = run.metrics || [];
  const last = m[m.length - 1] || {};
  const rewards = m.map((r) => r.reward_mean).filter((v) => v != null);
  const versions = run.by_version || [];
  const episodes = run.episodes;
  const masked = (run.per_env || []).reduce((a, e) => a + (e.masked || 0), 0);
  const out = [["Episodes", episodes ?? "indexing…", episodes]];
  if (run.eval) {
    const k = run.eval.k;
    const tasks = run.eval.tasks || [];
    out.push(["Model", run.eval.model || "–"], ["pass@1 (all tasks)", withInterval(run.eval.overall["pass@1"], run.eval.overall["pass@1_ci95"]), run.eval.overall["pass@1"]],
      [`pass@${k} (all tasks)`, fmt.pct(run.eval.overall[`pass@${k}`]), run.eval.overall[`pass@${k}`]],
      ["Tasks", tasks.length || run.eval.overall.tasks || "–", tasks.length || run.eval.overall.tasks],
      ["Tasks never solved", tasks.length ? tasks.filter((t) => !t.complete).length : "–", tasks.filter((t) => !t.complete).length]);
  } else if (m.length) {
    out.push(["Steps", m.length, m.length], [`Reward, last step (${last.step})`, fmt.num(last.reward_mean), last.reward_mean],
      ["Reward, mean of all steps", fmt.num(mean(rewards)), mean(rewards)],
      [`Success, last step`, fmt.pct(last.success_rate), last.success_rate]);
    if (last.loss != null) out.push(["Loss, last step", exact(last.loss), last.loss]);
    if (last.kl != null && !notComputed(run).has("kl")) out.push(["KL, last step", exact(last.kl), last.kl]);
  } else if (versions.length) {
    const lastV = versions[versions.length - 1];
    out.push(["Policy versions", versions.length, versions.length],
      [`Reward, last version (${lastV.version})`, fmt.num(lastV.reward_mean), lastV.reward_mean],
      ["Success, last version", fmt.pct(lastV.success_rate), lastV.success_rate]);
  }
  const success = mean((run.per_env || []).map((e) => e.success_rate).filter((v) => v !== null));
  if (!run.eval) out.push(["Success, all episodes", fmt.pct(success), success]);
  out.push(["Masked (our faults)", episodes && !run.indexing ? fmt.pct(masked / episodes) : "–", episodes ? masked / episodes : null]);
  const staleness = m.flatMap((r) => r.staleness || []);
  if (staleness.length) out.push(["Mean staleness", fmt.num(mean(staleness), 2), mean(staleness)]);
  const rps = mean(m.map((r) => r.rollouts_per_s).filter((v) => v != null));
  if (rps !== null) out.push(["Rollouts/s, mean", fmt.num(rps, 2), rps]);
  return out;
}

// a rate with its 95 % interval over tasks (eval.json's bootstrap), when the report has one
export function withInterval(value, ci) {
  return Array.isArray(ci) && ci.length === 2 ? `${fmt.pct(value)} (95% CI ${fmt.pct(ci[0])}–${fmt.pct(ci[1])})` : fmt.pct(value);
}

// Which way each measure is better, so that compare colours a difference as better or worse, not
// by its sign (one more task never solved is worse). Counts of what was run (episodes, steps,
// tasks) and GRPO's loss and KL (neither is a score) have no better way.
const BETTER = [[/^(pass@|Reward|Success|Rollouts\/s)/, "higher"], [/^(Tasks never solved|Masked|Mean staleness)/, "lower"]];
export function betterWay(measure) {
  return (BETTER.find(([pattern]) => pattern.test(measure)) || [null, null])[1];
}

export function headline(run) {
  return h("dl", { class: "cards" }, measures(run).map(([k, v]) => h("div", { class: "card" }, h("dt", {}, k), h("dd", {}, String(v)))));
}

// the configuration as key = value rows (nested keys joined with dots), the way W&B lists it
export function flatten(value, prefix = "", out = []) {
  if (value && typeof value === "object" && !Array.isArray(value)) {
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  } else out.push([prefix, Array.isArray(value) || (value && typeof value === "object") ? JSON.stringify(value) : String(value)]);
  return out;
}

export function configuration(run) {
  const where = run.eval ? { model: run.eval.model, k: run.eval.k, environments: (run.eval.environments || []).map((e) => e.env),
    ...(run.eval.settings || {}), ...(run.eval.checkpoint ? { checkpoint: run.eval.checkpoint.path } : {}) }
    : run.config;
  const from = run.evaluated_run;
  const rows = where ? flatten(where) : [];
  const envs = (run.per_env || []).map((e) => e.env);
  return h("section", { "aria-labelledby": "config-h" },
    h("h2", { id: "config-h" }, "Configuration and environment"),
    h("dl", { class: "facts" },
      h("dt", {}, "Directory"), h("dd", {}, h("code", {}, run.path)),
      h("dt", {}, "Kind"), h("dd", {}, kindBadges(run)),
      run.model ? [h("dt", {}, "Policy"), h("dd", {}, run.model)] : null,
      from ? [h("dt", {}, "Evaluated"), h("dd", { id: "evaluated-run" }, "the checkpoint of step ", String(from.step), " of ",
        from.id ? h("a", { href: `#/run/${from.id}?step=${from.step}` }, from.name) : from.name)] : null,
      h("dt", {}, "Environments"), h("dd", {}, envs.length ? envs.join(", ") : "–")),
    rows.length ? h("details", { class: "config", open: true },
      h("summary", {}, run.eval ? "Evaluation (eval.json)" : `config.json (${rows.length} settings)`),
      h("table", { class: "kv" }, h("tbody", {}, rows.map(([k, v]) => h("tr", {}, h("th", { scope: "row" }, h("code", {}, k)),
        h("td", {}, looksLikePath(v) ? h("code", { class: "path" }, v) : v))))))
      : h("p", { class: "muted" }, "No config.json in this run directory."));
}

// a path (a catalog, a run directory) breaks anywhere, by design; a word of other text never does
const looksLikePath = (v) => typeof v === "string" && v.includes("/") && !/\s/.test(v);

export function perEnv(run) {
  if (run.eval) {
    const k = run.eval.k;
    return [
      barChart(run.eval.environments.map((e) => ({ label: e.env, values: [
        { name: "pass@1", value: e["pass@1"], color: COLORS[0] }, { name: `pass@${k}`, value: e[`pass@${k}`], color: COLORS[2] }] })),
      { title: `pass@1 and pass@${k} per environment` }),
      table([
        { label: "Environment", cell: (e) => h("a", { href: runLink(run, { env: e.env }) }, e.env) },
        { label: "Tasks", cell: (e) => e.tasks, cls: "num" },
        { label: "Episodes", cell: (e) => e.episodes, cls: "num" },
        { label: "Masked", cell: (e) => e.masked, cls: "num" },
        { label: "pass@1", cell: (e) => fmt.pct(e["pass@1"]), cls: "num" },
        { label: "pass@1, 95% CI", cell: (e) => (Array.isArray(e["pass@1_ci95"]) ? `${fmt.pct(e["pass@1_ci95"][0])}–${fmt.pct(e["pass@1_ci95"][1])}` : "–"), cls: "num" },
        { label: `pass@${k}`, cell: (e) => fmt.pct(e[`pass@${k}`]), cls: "num" },
        { label: "Mean reward", cell: (e) => fmt.num(e.mean_reward), cls: "num" },
      ], run.eval.environments, "Per environment (eval.json)"),
    ];
  }
  return table([
    { label: "Environment", cell: (e) => h("a", { href: runLink(run, { env: e.env }) }, e.env) },
    { label: "Episodes", cell: (e) => e.episodes, cls: "num" },
    { label: "Masked", cell: (e) => `${e.masked} (${fmt.pct(e.masked / e.episodes)})`, cls: "num" },
    { label: "Success rate", cell: (e) => fmt.pct(e.success_rate), cls: "num" },
    { label: "Mean reward", cell: (e) => fmt.num(e.reward_mean), cls: "num" },
  ], run.per_env, "Per environment (from the episodes)");
}

// per task: the eval report's pass@k (or the episodes' success rate) with the failure classes the
// index counted, linked to the task's episodes, its first failure and its catalog entry
export function taskRows(run) {
  const scored = new Map((run.eval?.tasks || []).map((t) => [`${t.env}/${t.task_id}`, t]));
  const seen = new Map((run.per_task || []).map((t) => [`${t.env}/${t.task_id}`, t]));
  const keys = [...new Set([...scored.keys(), ...seen.keys()])];
  return keys.map((key) => {
    const e = scored.get(key) || {}, i = seen.get(key) || {};
    const [env, task_id] = [e.env || i.env, e.task_id || i.task_id];
    return { env, task_id, samples: e.samples ?? i.episodes, pass1: run.eval ? e.pass_at_1 ?? null : i.success_rate,
      passk: e.pass_at_k ?? null, reward: e.mean_reward ?? i.reward_mean, masked: e.masked ?? i.masked,
      verdicts: i.verdicts || {}, stop_reasons: i.stop_reasons || {}, error_kinds: i.error_kinds || {},
      mask_reasons: i.mask_reasons || {}, first_failed: i.first_failed };
  });
}

function counts(obj, kind, filterKey, run, task) {
  return Object.entries(obj).map(([k, n]) => {
    const b = badge(`${k} ×${n}`, kind);
    return filterKey ? h("a", { href: runLink(run, { task_id: task.task_id, env: task.env, [filterKey]: k }), class: "badge-link" }, b) : b;
  });
}

export function failures(task, run) {
  return [counts(task.verdicts, "err", "verdict", run, task), counts(task.stop_reasons, "warn", null, run, task),
    counts(task.error_kinds, "err", "error_kind", run, task), counts(task.mask_reasons, "masked", null, run, task)];
}

export function perTask(run) {
  const rows = taskRows(run);
  if (!rows.length) return null;
  const k = run.eval?.k;
  rows.sort((a, b) => (a.pass1 ?? 2) - (b.pass1 ?? 2) || a.env.localeCompare(b.env) || a.task_id.localeCompare(b.task_id));
  const body = h("div", {});
  const onlyFailed = h("input", { type: "checkbox", id: "failed-only" });
  const draw = () => body.replaceChildren(table([
    { label: "Environment", cell: (t) => t.env },
    { label: "Task", cell: (t) => h("a", { href: `#/catalog${query({ env: t.env, task: t.task_id })}`, title: "the task in the catalog" }, h("code", {}, t.task_id)) },
    { label: run.eval ? "Samples" : "Episodes", cell: (t) => t.samples ?? "–", cls: "num" },
    { label: run.eval ? "pass@1" : "Success", cell: (t) => fmt.pct(t.pass1), cls: "num" },
    ...(k ? [{ label: `pass@${k}`, cell: (t) => fmt.pct(t.passk), cls: "num" }] : []),
    { label: "Mean reward", cell: (t) => fmt.num(t.reward), cls: "num" },
    { label: "How it failed", cell: (t) => failures(t, run) },
    { label: "Episodes", cell: (t) => [h("a", { href: runLink(run, { env: t.env, task_id: t.task_id }) }, "all"),
      t.first_failed ? [" · ", h("a", { href: `#/episode/${run.id}/${t.first_failed}` }, "first failure")] : null] },
  ], onlyFailed.checked ? rows.filter((t) => (t.pass1 ?? 0) < 1) : rows,
  `${rows.length} tasks, the least successful first${run.per_task?.length ? "" : " (failure classes once the episodes are indexed)"}`));
  onlyFailed.addEventListener("change", draw);
  draw();
  return h("section", { "aria-labelledby": "tasks-h" }, h("h2", { id: "tasks-h" }, "Per task"),
    h("p", {}, h("label", { class: "check", for: "failed-only" }, onlyFailed, " only tasks with failures")), body);
}

// the run's failure classes over all tasks: verdicts, stop reasons, tool errors, masks
export function failureSummary(run) {
  const total = { verdict: {}, stop: {}, error_kind: {}, mask: {} };
  for (const t of run.per_task || []) {
    for (const [k, n] of Object.entries(t.verdicts)) total.verdict[k] = (total.verdict[k] || 0) + n;
    for (const [k, n] of Object.entries(t.stop_reasons)) total.stop[k] = (total.stop[k] || 0) + n;
    for (const [k, n] of Object.entries(t.error_kinds)) total.error_kind[k] = (total.error_kind[k] || 0) + n;
    for (const [k, n] of Object.entries(t.mask_reasons)) total.mask[k] = (total.mask[k] || 0) + n;
  }
  const rows = [
    ...Object.entries(total.verdict).map(([k, n]) => ({ what: "verdict", k, n, href: runLink(run, { verdict: k }) })),
    ...Object.entries(total.stop).map(([k, n]) => ({ what: "stopped by (failed episodes)", k, n })),
    ...Object.entries(total.error_kind).map(([k, n]) => ({ what: "tool error class", k, n, href: runLink(run, { error_kind: k }) })),
    ...Object.entries(total.mask).map(([k, n]) => ({ what: "masked (the environment's fault)", k, n, href: runLink(run, { masked: "true" }) })),
  ].sort((a, b) => b.n - a.n);
  if (!rows.length) return null;
  return h("section", { "aria-labelledby": "fail-h" }, h("h2", { id: "fail-h" }, "Failure classes"),
    table([
      { label: "Class", cell: (r) => r.what },
      { label: "Value", cell: (r) => (r.href ? h("a", { href: r.href }, r.k) : r.k) },
      { label: "Episodes", cell: (r) => r.n, cls: "num" },
    ], rows, "Episodes that did not complete, by how; a tool error can also occur in a completed episode"));
}

// the values of every metric at one step (the highlighted one)
export function stepValues(run, x) {
  const m = (run.metrics || []).find((r) => r.step === x);
  const v = m || (run.by_version || []).find((r) => r.version === x);
  if (!v) return null;
  const absent = notComputed(run);
  const rows = Object.entries(v).filter(([, val]) => typeof val === "number" || (Array.isArray(val) && val.every((n) => typeof n === "number")));
  return h("details", { class: "step-values", open: true }, h("summary", {}, `All values at ${m ? "step" : "version"} ${x}`),
    h("table", { class: "kv" }, h("tbody", {}, rows.map(([k, val]) => h("tr", {}, h("th", { scope: "row" }, h("code", {}, k)),
      h("td", { class: "num" }, absent.has(k) ? "not computed" : Array.isArray(val) ? val.map(exact).join(", ") : exact(val)))))));
}
