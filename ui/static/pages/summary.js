// The parts of a run's page that the comparison shows side by side: headline numbers, the reward
// curve (points link to their step's episodes), throughput and staleness, pass@k per environment.
import { barChart, COLORS, lineChart } from "../charts.js";
import { fmt, h, table } from "../lib.js";

const mean = (xs) => (xs.length ? xs.reduce((a, b) => a + b, 0) / xs.length : null);

export function headline(run) {
  const m = run.metrics;
  const episodes = run.episodes;
  const masked = run.per_env.reduce((a, e) => a + (e.masked || 0), 0);
  const staleness = m.flatMap((r) => r.staleness || []);
  const last = m[m.length - 1] || {};
  const success = run.eval ? run.eval.overall["pass@1"] : mean(run.per_env.map((e) => e.success_rate).filter((v) => v !== null));
  const cards = [
    ["Episodes", episodes ?? "indexing…"],
    ["Steps", m.length],
    ["Last reward", fmt.num(last.reward_mean)],
    [run.eval ? "pass@1" : "Success rate", fmt.pct(success)],
    ...(run.eval ? [[`pass@${run.eval.k}`, fmt.pct(run.eval.overall[`pass@${run.eval.k}`])]] : []),
    ["Masked (our faults)", episodes && !run.indexing ? fmt.pct(masked / episodes) : "–"],
    ["Mean staleness", fmt.num(mean(staleness), 2)],
    ["Rollouts/s", fmt.num(mean(m.map((r) => r.rollouts_per_s).filter((v) => v != null)), 2)],
  ];
  return h("dl", { class: "cards" }, cards.map(([k, v]) => h("div", { class: "card" }, h("dt", {}, k), h("dd", {}, String(v)))));
}

export function rewardCurve(run) {
  if (!run.metrics.length) return h("p", { class: "muted" }, "No training steps (metrics.jsonl) in this run.");
  const link = (r) => `#/run/${run.id}?step=${r.step}`;
  return lineChart([
    { name: "reward", color: COLORS[0], points: run.metrics.map((r) => ({ x: r.step, y: r.reward_mean, href: link(r),
      label: `step ${r.step}: reward ${fmt.num(r.reward_mean)} (open its episodes)` })) },
    { name: "success", color: COLORS[2], points: run.metrics.map((r) => ({ x: r.step, y: r.success_rate, href: link(r),
      label: `step ${r.step}: success ${fmt.pct(r.success_rate)} (open its episodes)` })) },
  ], { title: "Reward and success rate per step", xLabel: "step" });
}

export function throughput(run) {
  if (!run.metrics.length) return null;
  return lineChart([
    { name: "rollouts/s", color: COLORS[3], points: run.metrics.map((r) => ({ x: r.step, y: r.rollouts_per_s })) },
    { name: "mean staleness", color: COLORS[4], points: run.metrics.map((r) => ({ x: r.step, y: mean(r.staleness || []) })) },
  ], { title: "Rollouts per second and staleness per step", xLabel: "step", height: 180 });
}

export function perEnv(run) {
  if (run.eval) {
    const k = run.eval.k;
    return [
      barChart(run.eval.environments.map((e) => ({ label: e.env, values: [
        { name: "pass@1", value: e["pass@1"], color: COLORS[0] }, { name: `pass@${k}`, value: e[`pass@${k}`], color: COLORS[2] }] })),
      { title: `pass@1 and pass@${k} per environment` }),
      table([
        { label: "Environment", cell: (e) => h("a", { href: `#/run/${run.id}?env=${encodeURIComponent(e.env)}` }, e.env) },
        { label: "Tasks", cell: (e) => e.tasks, cls: "num" },
        { label: "Episodes", cell: (e) => e.episodes, cls: "num" },
        { label: "Masked", cell: (e) => e.masked, cls: "num" },
        { label: "pass@1", cell: (e) => fmt.pct(e["pass@1"]), cls: "num" },
        { label: `pass@${k}`, cell: (e) => fmt.pct(e[`pass@${k}`]), cls: "num" },
        { label: "Mean reward", cell: (e) => fmt.num(e.mean_reward), cls: "num" },
      ], run.eval.environments, "Per environment (eval.json)"),
    ];
  }
  return table([
    { label: "Environment", cell: (e) => h("a", { href: `#/run/${run.id}?env=${encodeURIComponent(e.env)}` }, e.env) },
    { label: "Episodes", cell: (e) => e.episodes, cls: "num" },
    { label: "Masked", cell: (e) => `${e.masked} (${fmt.pct(e.masked / e.episodes)})`, cls: "num" },
    { label: "Success rate", cell: (e) => fmt.pct(e.success_rate), cls: "num" },
    { label: "Mean reward", cell: (e) => fmt.num(e.reward_mean), cls: "num" },
  ], run.per_env, "Per environment (from the episodes)");
}
