// Campaigns and EnvFleets in the cluster (through the operator), instances per environment and
// state, who holds them, episodes/s and tool-call latency; polled every 2 s while the page is open.
import { api, badge, errorBox, fill, fmt, h, table } from "../lib.js";

const POLL_MS = 2000;

function view(data) {
  const parts = [h("h1", {}, "Fleet"),
    h("p", { class: "muted" }, `Updated ${new Date(data.at * 1000).toLocaleTimeString()} · every ${POLL_MS / 1000} s · `,
      data.grafana_url ? h("a", { href: data.grafana_url }, "Grafana dashboard") : "Grafana dashboard: charts/awm/files/awm-dashboard.json (pass --grafana-url to link it)")];
  if (!data.instances.length && !data.operator.length && !data.namespaces.length) {
    parts.push(h("p", {}, "No instances. Start the UI with ", h("code", {}, "awm ui --serve ENV"), " or ",
      h("code", {}, "--instance MCP_URL,CONTROL_URL"), " or ", h("code", {}, "--operator-url URL --fleet NS/NAME"),
      " or ", h("code", {}, "--operator-url URL --namespace NS"), "."));
  }
  for (const group of data.namespaces) parts.push(...namespace(group));
  if (data.environments.length) parts.push(h("h2", {}, "Environments"), table([
    { label: "Environment", cell: (e) => e.env },
    { label: "Instances", cell: (e) => e.instances, cls: "num" },
    { label: "States", cell: (e) => Object.entries(e.states).map(([s, n]) => badge(`${s} ${n}`, s === "ready" ? "ok" : "err")) },
    { label: "Held", cell: (e) => e.held, cls: "num" },
    { label: "Episodes/s", cell: (e) => fmt.num(e.episodes_per_s), cls: "num" },
    { label: "Tool calls/s", cell: (e) => fmt.num(e.tool_calls_per_s), cls: "num" },
    { label: "Tool p50", cell: (e) => fmt.ms(e.tool_p50_ms), cls: "num" },
    { label: "Tool p99", cell: (e) => fmt.ms(e.tool_p99_ms), cls: "num" },
  ], data.environments));
  if (data.instances.length) parts.push(h("h2", {}, "Instances"), table([
    { label: "Instance", cell: (i) => h("code", {}, i.name) },
    { label: "Environment", cell: (i) => i.env },
    { label: "State", cell: (i) => badge(i.state, i.state === "ready" ? "ok" : "err") },
    { label: "Holder", cell: (i) => i.holder || "–" },
    { label: "Episodes", cell: (i) => fmt.num(i.episodes, 0), cls: "num" },
    { label: "Tool calls", cell: (i) => fmt.num(i.tool_calls, 0), cls: "num" },
    { label: "Tool mean", cell: (i) => fmt.ms(i.tool_mean_ms), cls: "num" },
    { label: "Control", cell: (i) => h("code", {}, i.control_url) },
  ], data.instances));
  if (data.operator.length) parts.push(h("h2", {}, "Operator fleets"), table([
    { label: "Fleet", cell: (f) => f.namespace ? `${f.namespace}/${f.fleet}` : f.fleet },
    { label: "Replicas", cell: (f) => f.replicas ?? "–", cls: "num" },
    { label: "Ready", cell: (f) => f.ready ?? "–", cls: "num" },
    { label: "Allocated (claimed)", cell: (f) => f.allocated ?? "–", cls: "num" },
    { label: "Starting", cell: (f) => f.starting ?? "–", cls: "num" },
    { label: "Per environment", cell: (f) => Object.entries(f.environments || {}).map(([env, states]) =>
      h("div", {}, `${env}: `, Object.entries(states).map(([s, n]) => badge(`${s} ${n}`, s === "starting" || s === "failed" ? "err" : "ok")))) },
    { label: "Error", cell: (f) => f.error || "" },
  ], data.operator));
  for (const f of data.operator.filter((f) => (f.instances || []).length)) {
    parts.push(h("h3", {}, `${f.namespace}/${f.fleet}: instances`), table([
      { label: "Pod", cell: (i) => h("code", {}, i.pod) },
      { label: "Environment", cell: (i) => i.environment },
      { label: "State", cell: (i) => badge(i.state, i.state === "ready" || i.state === "allocated" ? "ok" : "err") },
      { label: "Claim", cell: (i) => i.claim || "–" },
      { label: "Holder", cell: (i) => i.holder || "–" },
      { label: "Problem", cell: (i) => i.problem || "" },
    ], f.instances));
    if (f.claims.length) parts.push(h("h3", {}, `${f.namespace}/${f.fleet}: claims`), table([
      { label: "Claim", cell: (c) => h("code", {}, c.id) },
      { label: "Holder", cell: (c) => c.holder || "–" },
      { label: "Owner", cell: (c) => c.owner || "–" },
      { label: "Instances", cell: (c) => c.instances, cls: "num" },
      { label: "Groups", cell: (c) => c.groups, cls: "num" },
      { label: "Age", cell: (c) => `${fmt.num(c.ageSeconds, 0)} s`, cls: "num" },
      { label: "Expires in", cell: (c) => (c.expiresInSeconds == null ? "never" : `${fmt.num(c.expiresInSeconds, 0)} s`), cls: "num" },
    ], f.claims));
  }
  if (data.prometheus) parts.push(h("h2", {}, "Prometheus (whole fleet)"), h("dl", { class: "cards" },
    [["Episodes/s", fmt.num(data.prometheus.episodes_per_s)], ["Tool calls/s", fmt.num(data.prometheus.tool_calls_per_s)],
      ["Tool p50", fmt.ms(data.prometheus.tool_p50_s == null ? null : data.prometheus.tool_p50_s * 1000)],
      ["Tool p99", fmt.ms(data.prometheus.tool_p99_s == null ? null : data.prometheus.tool_p99_s * 1000)]]
      .map(([k, v]) => h("div", { class: "card" }, h("dt", {}, k), h("dd", {}, v)))));
  return parts;
}

const PHASE = { Succeeded: "ok", Running: "ok", Pending: "warn", Failed: "err" };

function mean(values) {
  const v = Object.values(values || {});
  return v.length ? v.reduce((a, b) => a + b, 0) / v.length : null;
}

// One namespace as the operator lists it: its Campaigns (phase, progress newer than the object's
// status, which is written at most every few seconds, and the fleet's instances) and EnvFleets.
function namespace(group) {
  const out = [h("h2", {}, `Namespace ${group.namespace}`)];
  if (group.error) out.push(h("p", { class: "error", role: "alert" }, `Cannot read it from the operator: ${group.error}`));
  if (group.campaigns.length) out.push(h("h3", {}, "Campaigns"), table([
    { label: "Campaign", cell: (c) => c.run ? h("a", { href: `#/run/${c.run}` }, c.name) : c.name },
    { label: "Mode", cell: (c) => c.mode || "–" },
    { label: "Phase", cell: (c) => badge(c.status.phase || "Pending", PHASE[c.status.phase] || "warn") },
    { label: "Step", cell: (c) => c.status.step ?? "–", cls: "num" },
    { label: "Reward", cell: (c) => fmt.num(c.status.rewardMean), cls: "num" },
    { label: "Rollouts/s", cell: (c) => fmt.num(c.status.rolloutsPerS, 2), cls: "num" },
    { label: "pass@1", cell: (c) => fmt.pct(mean(c.status.passRates)), cls: "num" },
    { label: "Envs", cell: (c) => c.environments, cls: "num" },
    { label: "Instances", cls: "num", cell: (c) => c.fleetCounts
      ? `${c.fleetCounts.ready} / ${c.fleetCounts.allocated} / ${c.fleetCounts.replicas}` : "–" },
    { label: "Started", cell: (c) => c.status.startedAt ? new Date(c.status.startedAt).toLocaleString() : "–" },
    { label: "Message", cell: (c) => c.status.message || "" },
  ], group.campaigns, "Reward: the mean of the last reported step · pass@1: the mean over environments (evaluation) · " +
    "Instances: ready / allocated / of the campaign's fleet · a name links to its run when the UI reads its run directory"));
  if (group.fleets.length) out.push(h("h3", {}, "EnvFleets"), table([
    { label: "Fleet", cell: (f) => f.fleet },
    { label: "Binding", cell: (f) => f.binding },
    { label: "Envs", cell: (f) => f.environments, cls: "num" },
    { label: "Replicas", cell: (f) => f.replicas, cls: "num" },
    { label: "Ready", cell: (f) => f.ready, cls: "num" },
    { label: "Allocated", cell: (f) => f.allocated, cls: "num" },
    { label: "Starting", cell: (f) => f.starting, cls: "num" },
    { label: "Demand", cell: (f) => f.demand ?? "–", cls: "num" },
    { label: "State", cell: (f) => f.condition ? badge(f.condition.reason || f.condition.status,
      f.condition.status === "True" ? "ok" : "warn") : "–" },
    { label: "Why", cls: "prose", cell: (f) => (f.condition && f.condition.status !== "True" ? f.condition.message : "") },
  ], group.fleets, "Ready: unallocated and serving · live counts from the operator that acts on the fleet, else its status"));
  if (!group.error && !group.campaigns.length && !group.fleets.length) {
    out.push(h("p", { class: "muted" }, "No Campaign and no EnvFleet in this namespace."));
  }
  return out;
}

export async function render(main) {
  let timer = null, live = true, shown = null;
  // redrawn only when the fleet changed: a redraw takes the focus, a selection, an open row away
  const tick = async () => {
    try {
      const fleet = await api("/api/fleet");
      const seen = JSON.stringify(fleet);
      if (seen !== shown) fill(main, ...view(fleet));
      shown = seen;
    } catch (err) { fill(main, errorBox(err)); shown = null; }
    if (live) timer = setTimeout(tick, POLL_MS);
  };
  await tick();
  return () => { live = false; clearTimeout(timer); };
}
