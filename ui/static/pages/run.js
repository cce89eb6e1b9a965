// One run: its numbers, every metric it logged, its configuration, results per environment and
// per task with the failure classes, and its episodes (filtered, paged through the server's index).
import { api, badge, errorBox, field, fill, fmt, h, poll, query, runState, select, table } from "../lib.js";
import { COLORS, distributionChart, lineChart } from "../charts.js";
import { metricPanels, series } from "../metrics.js";
import { configuration, failureSummary, headline, kindBadges, perEnv, perTask, stepLink, stepValues, withInterval } from "./summary.js";

const FILTERS = ["env", "task_id", "verdict", "error_kind", "step", "version", "masked", "min_reward", "max_reward", "q"];
const PAGE = 50;

const pageUrl = (id, params) => `/api/runs/${id}/episodes${query({ ...Object.fromEntries(FILTERS.map((k) => [k, params[k]])),
  offset: Number(params.offset || 0), limit: PAGE })}`;

export async function render(main, [id], params) {
  // the summary and the first page of episodes in parallel: one round trip less before the paint
  const [run, page] = await Promise.all([api(`/api/runs/${id}`), api(pageUrl(id, params)).catch((err) => err)]);
  const list = h("section", { "aria-labelledby": "episodes-h" });
  const picked = params.step !== undefined && params.step !== "" ? Number(params.step)
    : params.version !== undefined && params.version !== "" ? Number(params.version) : null;
  const live = liveParts(run, picked);
  fill(main,
    h("p", {}, h("a", { href: "#/runs" }, "Runs"), " / ", run.name),
    h("h1", {}, run.name, " ", kindBadges(run)),
    live.state,
    run.eval || run.model ? h("p", {}, "Model: ", h("strong", {}, (run.eval && run.eval.model) || run.model)) : null,
    live.headline,
    picked !== null ? h("div", { class: "callout", role: "status" },
      h("p", {}, h("strong", {}, `${params.step !== undefined && params.step !== "" ? "Step" : "Policy version"} ${picked}`),
        " is marked on every chart; ", h("a", { href: "#episodes-h" }, "its episodes"), " are listed below. ",
        h("a", { href: `#/run/${run.id}` }, "Clear")),
      stepValues(run, picked)) : null,
    params.step !== undefined && params.step !== "" ? stepGroups(run, Number(params.step)) : null,
    live.metrics,
    live.distribution,
    live.results,
    configuration(run),
    live.news,
    list);
  const stops = [follow(id, run, live, picked, () => showEpisodes(list, run, params))];
  const indexing = run.indexing || page.indexing;
  if (!indexing) episodes(list, run, params, page);
  else stops.push(waitForIndex(id, params, list, indexing));
  return () => stops.forEach((stop) => stop());
}

// The parts of the page a run that is still writing changes, each replaceable in place
function liveParts(run, picked) {
  const curves = series(run);
  return {
    state: h("p", { id: "run-state" }, stateLine(run.status)),
    headline: h("div", {}, headline(run)),
    metrics: h("div", {}, curves.rows.length ? metricPanels([{ run, series: curves }], { highlight: picked, link: stepLink }) : null),
    distribution: h("div", {}, rewardDistribution(run), overCheckpoints(run)),
    results: h("div", {}, h("h2", {}, run.eval ? "Results per environment" : "Environments"), perEnv(run),
      failureSummary(run), perTask(run)),
    news: h("p", { class: "muted", id: "episodes-news", role: "status" }),
  };
}

// The GRPO groups a step trained on, each a unit: its task, its episodes' rewards and the
// advantages the learner gave them, each episode one click away. Drawn when the API answers.
function stepGroups(run, step) {
  const section = h("section", { class: "step-groups", "aria-labelledby": "step-groups-h" },
    h("h2", { id: "step-groups-h" }, `GRPO groups of step ${step}`), h("p", { class: "muted" }, "Loading…"));
  api(`/api/runs/${run.id}/steps/${step}/groups`).then(({ groups }) => {
    fill(section, h("h2", { id: "step-groups-h" }, `GRPO groups of step ${step}`),
      groups.length ? table([
        { label: "Task", cell: (g) => [h("code", {}, g.task_id), " ", h("span", { class: "muted" }, g.env)] },
        { label: "Episodes", cell: (g) => g.size, cls: "num" },
        { label: "Mean reward", cell: (g) => fmt.num(g.reward_mean), cls: "num" },
        { label: "Each episode: reward (advantage)", cell: (g) => h("span", { class: "members" }, g.episodes.map((e, i) => [
          i ? " · " : null,
          h("a", { href: `#/episode/${run.id}/${e.episode_id}`, "data-advantage": e.advantage ?? "" },
            `${fmt.num(e.reward)} (${e.masked ? "masked" : e.advantage == null ? "–" : fmt.num(e.advantage)})`)])) },
      ], groups, `The ${groups.length} groups step ${step} trained on`)
        : h("p", { class: "muted" }, "No group of this step in the trajectory log."));
  }).catch((err) => fill(section, errorBox(err)));
  return section;
}

// How reward was distributed at each step (the learner's `reward_distribution`: unmasked episodes
// by reward): a stacked column per step, each a link to that step's episodes. A mean hides a
// step whose episodes split between 0 and 1 behind the same 0.5 as one where all scored 0.5.
function rewardDistribution(run) {
  const columns = (run.metrics || []).filter((r) => r.reward_distribution && typeof r.reward_distribution === "object")
    .map((r) => ({ x: r.step, counts: r.reward_distribution }));
  if (!columns.length) return null;
  return h("section", { class: "reward-distribution", "aria-labelledby": "reward-dist-h" },
    h("h2", { id: "reward-dist-h" }, "Reward distribution per step"),
    h("p", { class: "muted" }, "Each step's unmasked episodes by reward, as shares; hover a segment for its count, click a column for its episodes."),
    h("figure", { class: "distribution-panel" }, distributionChart(columns, { title: "episodes by reward", valueLabel: "reward",
      href: (step) => stepLink(run, step) })));
}

// pass@1 of the run's checkpoints, from the evaluations that name it (`awm eval --checkpoint
// RUN/checkpoints/...`), with their 95 % intervals: whether training moved what it is judged by.
function overCheckpoints(run) {
  const evals = (run.evaluations || []).filter((e) => e["pass@1"] != null);
  if (!evals.length) return null;
  const point = (e, y, what) => ({ x: e.step, y, href: e.id ? `#/run/${e.id}` : null,
    label: `step ${e.step}: ${what} ${fmt.pct(y)} (${e.name}; open the evaluation)` });
  const withCi = evals.filter((e) => Array.isArray(e["pass@1_ci95"]));
  const lines = [{ name: "pass@1", color: COLORS[0], points: evals.map((e) => point(e, e["pass@1"], "pass@1")) }];
  if (withCi.length) {
    lines.push({ name: "95% CI, low", color: COLORS[2], dash: "4 3", points: withCi.map((e) => point(e, e["pass@1_ci95"][0], "95% CI low")) },
      { name: "95% CI, high", color: COLORS[2], dash: "4 3", points: withCi.map((e) => point(e, e["pass@1_ci95"][1], "95% CI high")) });
  }
  return h("section", { class: "over-checkpoints", "aria-labelledby": "checkpoints-h" },
    h("h2", { id: "checkpoints-h" }, "pass@1 over checkpoints"),
    h("p", { class: "muted" }, `${evals.length} evaluation${evals.length > 1 ? "s" : ""} of this run's checkpoints; each point opens its evaluation.`),
    h("figure", { class: "checkpoint-panel" }, lineChart(lines, { title: "pass@1 by checkpoint step", xLabel: "step", group: "checkpoints", yMin: 0, yMax: 1, log: false })),
    table([
      { label: "Step", cell: (e) => e.step, cls: "num" },
      { label: "Evaluation", cell: (e) => (e.id ? h("a", { href: `#/run/${e.id}` }, e.name) : e.name) },
      { label: "pass@1", cell: (e) => withInterval(e["pass@1"], e["pass@1_ci95"]), cls: "num" },
      { label: "k", cell: (e) => e.k ?? "–", cls: "num" },
      { label: "Temperature", cell: (e) => e.settings?.temperature ?? "–", cls: "num" },
      { label: "Max turns", cell: (e) => e.settings?.max_turns ?? "–", cls: "num" },
      { label: "Date", cell: (e) => e.settings?.date ?? "–" },
    ], evals, "Evaluations of this run's checkpoints"));
}

function stateLine(status) {
  return status ? [runState(status), h("span", { class: "muted" }, ` · ${status.state_reason}`)] : null;
}

// Keeps the page up to date while the run writes: its state line on every poll; numbers, curves
// and results when a step (metrics.jsonl), the report or the state changed, or every 15 s while
// only episodes come in (an evaluation); the episode list only when asked (it may be filtered or
// paged by hand), with a line saying how many more episodes there are.
function follow(id, run, live, picked, redrawList) {
  const sizes = (s) => JSON.stringify([s.state, s.step, s.sizes?.["metrics.jsonl"], s.sizes?.["eval.json"]]);
  let shown = run.status ? sizes(run.status) : null, episodesShown = run.episodes, drawnAt = Date.now();
  let logSize = run.status?.sizes?.["trajectories.jsonl"];
  return poll(async () => {
    const status = await api(`/api/runs/${id}/status`);
    fill(live.state, stateLine(status));
    const grew = status.sizes?.["trajectories.jsonl"] !== logSize;
    logSize = status.sizes?.["trajectories.jsonl"];
    if (sizes(status) === shown && !(grew && Date.now() - drawnAt > 15000)) return grew;
    const next = await api(`/api/runs/${id}`);
    shown = sizes(status);
    drawnAt = Date.now();
    redraw(live, next, picked);
    const more = typeof next.episodes === "number" && typeof episodesShown === "number" ? next.episodes - episodesShown : 0;
    if (more > 0) {
      fill(live.news, `${more} more episode${more === 1 ? "" : "s"} logged since the list was drawn. `,
        h("button", { type: "button", class: "secondary", onclick: () => { episodesShown = next.episodes; fill(live.news); redrawList(); } },
          "Show them"));
    }
    return true;
  });
}

function redraw(live, run, picked) {
  fill(live.headline, headline(run));
  const panels = live.metrics.firstChild;
  const curves = series(run);
  if (!(panels && panels.update && panels.update([{ run, series: curves }]))) {  // new metrics: the section anew
    fill(live.metrics, curves.rows.length ? metricPanels([{ run, series: curves }], { highlight: picked, link: stepLink }) : null);
  }
  fill(live.distribution, rewardDistribution(run), overCheckpoints(run));
  fill(live.results, h("h2", {}, run.eval ? "Results per environment" : "Environments"), perEnv(run),
    failureSummary(run), perTask(run));
}

async function showEpisodes(list, run, params) {
  const [next, page] = await Promise.all([api(`/api/runs/${run.id}`), api(pageUrl(run.id, params)).catch((err) => err)]);
  episodes(list, next, params, page);
}

// a big run's first open: the index is being built. Ask the (cheap) list until it is, showing
// the progress, then draw the whole page again (per-environment numbers and filters need it).
function waitForIndex(id, params, list, indexing) {
  const mb = (n) => (n / 2 ** 20).toFixed(0);
  const status = h("p", { class: "muted", role: "status" });
  const show = (p) => fill(status, `Indexing the episodes: ${mb(p.scanned)} of ${mb(p.size)} MB of trajectories.jsonl…`);
  fill(list, h("h2", { id: "episodes-h" }, "Episodes"), status);
  show(indexing);
  let timer = null, live = true;
  const check = async () => {
    const next = await api(pageUrl(id, params)).catch(() => ({ indexing }));
    if (!live) return;
    if (next.indexing) { show(next.indexing); timer = setTimeout(check, 1000); } else window.dispatchEvent(new HashChangeEvent("hashchange"));
  };
  timer = setTimeout(check, 1000);
  return () => { live = false; clearTimeout(timer); };
}

function filterForm(run, params) {
  const f = run.facets || {};
  const controls = {
    env: select("env", f.env || [], params.env),
    task_id: select("task_id", f.task_id || [], params.task_id),
    verdict: select("verdict", f.verdict || [], params.verdict),
    error_kind: select("error_kind", f.error_kind || [], params.error_kind),
    step: select("step", f.step || [], params.step),
    version: h("input", { name: "version", type: "number", step: "1", value: params.version || "" }),
    masked: select("masked", ["true", "false"], params.masked),
    min_reward: h("input", { name: "min_reward", type: "number", step: "any", value: params.min_reward || "" }),
    max_reward: h("input", { name: "max_reward", type: "number", step: "any", value: params.max_reward || "" }),
    q: h("input", { name: "q", type: "search", value: params.q || "", placeholder: "episode or task id" }),
  };
  const labels = { env: "Environment", task_id: "Task", verdict: "Verdict", error_kind: "Error class", step: "Step", version: "Policy version",
    masked: "Masked", min_reward: "Reward ≥", max_reward: "Reward ≤", q: "Search" };
  return h("form", { class: "filters", role: "search", "aria-label": "Filter episodes", onsubmit: (e) => {
    e.preventDefault();
    const next = {};
    for (const k of FILTERS) next[k] = controls[k].value;
    location.hash = `#/run/${run.id}${query(next)}`;
  } }, FILTERS.map((k) => field(labels[k], controls[k])), h("button", { type: "submit" }, "Filter"),
  h("a", { href: `#/run/${run.id}`, class: "button" }, "Clear"));
}

function episodes(section, run, params, page) {
  const offset = Number(params.offset || 0);
  const filters = Object.fromEntries(FILTERS.map((k) => [k, params[k]]));
  fill(section, h("h2", { id: "episodes-h" }, "Episodes"), filterForm(run, params));
  if (!run.episodes) { section.append(h("p", { class: "muted" }, "This run has no trajectories.jsonl.")); return; }
  if (page instanceof Error) { section.append(errorBox(page)); return; }
  const nav = (to, label) => h("a", { href: `#/run/${run.id}${query({ ...filters, offset: to })}`, class: "button" }, label);
  section.append(
    h("p", { class: "muted", id: "episode-count" }, `${page.total} episodes match · showing ${page.total ? offset + 1 : 0}–${offset + page.episodes.length}`),
    table([
      { label: "Episode", cell: (e) => h("a", { href: `#/episode/${run.id}/${e.episode_id}` }, e.episode_id) },
      { label: "Step", cell: (e) => e.step ?? "–", cls: "num" },
      { label: "Environment", cell: (e) => e.env },
      { label: "Task", cell: (e) => e.task_id },
      { label: "Verdict", cell: (e) => badge(e.verdict || "none") },
      { label: "Reward", cell: (e) => fmt.num(e.reward), cls: "num" },
      { label: "Masked", cell: (e) => (e.masked ? badge(e.mask_reason || "masked", "masked") : "") },
      { label: "Turns", cell: (e) => e.turns, cls: "num" },
      { label: "Calls", cell: (e) => e.tool_calls, cls: "num" },
      { label: "Errors", cell: (e) => e.error_kinds.map((k) => badge(k, "err")) },
    ], page.episodes),
    h("nav", { class: "pager", "aria-label": "Episode pages" },
      offset > 0 ? nav(Math.max(0, offset - PAGE), "← Previous") : null,
      offset + PAGE < page.total ? nav(offset + PAGE, "Next →") : null));
}
