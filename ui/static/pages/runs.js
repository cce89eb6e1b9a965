// The run list (evaluations with their pass@1, training runs with their last reward, who trained
// them, each run's state and progress, kept live while the page is open), and the choice of runs
// to compare.
import { api, badge, field, fill, fmt, h, poll, runState, table } from "../lib.js";

function result(r) {
  if (r.kind === "eval") return `pass@1 ${fmt.pct(r.pass_at_1)}${r.k && r.k > 1 ? ` · pass@${r.k} ${fmt.pct(r.pass_at_k)}` : ""}`;
  if (r.last_reward !== null && r.last_reward !== undefined) return `reward ${fmt.num(r.last_reward)} (last step)`;
  return "–";
}

// a run stopped short says why under its badge (the others say it on hover)
function state(r) {
  return [runState(r), r.state === "stopped" ? h("small", { class: "muted state-reason" }, r.state_reason) : null];
}

// the settings whose values differ between the runs (at most 8, those most runs have first): the
// columns W&B users look at first
function differing(runs) {
  const values = new Map();
  for (const r of runs) for (const [k, v] of Object.entries(r.hyper || {})) {
    if (!values.has(k)) values.set(k, { runs: 0, distinct: new Set() });
    const entry = values.get(k);
    entry.runs += 1;
    entry.distinct.add(JSON.stringify(v));
  }
  return [...values].filter(([, e]) => e.distinct.size > 1)  // a setting some runs lack is no difference
    .sort(([a, x], [b, y]) => y.runs - x.runs || a.localeCompare(b)).slice(0, 8).map(([k]) => k).sort();
}

// in `dir` (1 ascending, -1 descending) order: numbers by value, anything else as text, and runs
// without the value last either way
function compare(a, b, dir) {
  const missing = (v) => v === null || v === undefined || v === "";
  if (missing(a) || missing(b)) return Number(missing(a)) - Number(missing(b));
  if (typeof a === "number" && typeof b === "number") return (a - b) * dir;
  return String(a).localeCompare(String(b), undefined, { numeric: true }) * dir;
}

// what a poll compares: everything but the server's clock
const fingerprint = (runs) => JSON.stringify(runs.map(({ now, ...rest }) => rest));

export async function render(main) {
  let runs = await api("/api/runs");
  if (!runs.length) {
    fill(main, h("h1", {}, "Runs"),
      h("p", {}, "No run directories found. Train or evaluate first (",
        h("code", {}, "awm train --config examples/train-tiny.yaml"), "), then start ",
        h("code", {}, "awm ui --runs runs"), "."));
    return poll(async () => { if ((await api("/api/runs")).length) window.dispatchEvent(new HashChangeEvent("hashchange")); return false; });
  }
  const status = h("p", { class: "muted", role: "status", id: "compare-status" }, "Tick two or more runs to compare them.");
  const boxes = new Map();  // run id -> its checkbox, kept across redraws so a tick survives them
  const box = (r) => boxes.get(r.id) || boxes.set(r.id, h("input", { type: "checkbox", name: "compare", value: r.id,
    id: `cmp-${r.id}`, "aria-label": `compare ${r.name}` })).get(r.id);
  const holder = h("div", {});
  // search, filters and sorting, as W&B's runs table has them; the settings that differ between
  // the runs listed are columns of their own
  const view = { q: "", kind: "", state: "", sort: "modified", dir: -1 };
  const search = h("input", { type: "search", id: "runs-search", placeholder: "name, model, setting…" });
  const kind = h("select", { id: "runs-kind" }, [["", "all kinds"], ["train", "training"], ["eval", "evaluation"]]
    .map(([v, t]) => h("option", { value: v }, t)));
  const stateFilter = h("select", { id: "runs-state" }, [["", "any state"], ["running", "running"], ["finished", "finished"],
    ["stopped", "stopped"], ["idle", "idle"]].map(([v, t]) => h("option", { value: v }, t)));
  search.addEventListener("input", () => { view.q = search.value.trim().toLowerCase(); draw(); });
  kind.addEventListener("change", () => { view.kind = kind.value; draw(); });
  stateFilter.addEventListener("change", () => { view.state = stateFilter.value; draw(); });
  const resultValue = (r) => (r.kind === "eval" ? r.pass_at_1 : r.last_reward);
  const draw = () => {
    const settings = differing(runs);
    const sortable = (label, key, value) => ({ key, value, label: h("button", { type: "button", class: "sort", "data-sort": key,
      "aria-label": `sort by ${label}`, onclick: () => { view.dir = view.sort === key ? -view.dir : 1; view.sort = key; draw(); } },
      label, view.sort === key ? (view.dir > 0 ? " ▲" : " ▼") : "") });
    const columns = [
      { label: "Compare", cell: box },
      { ...sortable("Run", "name", (r) => r.name), cell: (r) => h("a", { href: `#/run/${r.id}` }, r.name) },
      { ...sortable("State", "state", (r) => r.state), cell: state },
      { label: "Kind", cell: (r) => [badge(r.kind, "neutral"), r.framework ? badge(r.framework, "neutral") : null] },
      { ...sortable("Model", "model", (r) => r.model), cell: (r) => r.model || "–" },
      { ...sortable("Result", "result", resultValue), cell: result },
      ...settings.map((key) => ({ ...sortable(key, `hyper:${key}`, (r) => r.hyper?.[key]),
        cell: (r) => (r.hyper && key in r.hyper ? String(r.hyper[key]) : "–"), cls: "setting" })),
      { ...sortable("Modified", "modified", (r) => r.modified), cell: (r) => new Date(r.modified * 1000).toLocaleString() },
      { label: "Directory", cell: (r) => h("code", { class: "path" }, r.path) },
    ];
    const by = columns.find((c) => c.key === view.sort) || columns.find((c) => c.key === "modified");
    const shown = runs.filter((r) => (!view.kind || r.kind === view.kind) && (!view.state || r.state === view.state)
      && (!view.q || [r.name, r.model, r.path, ...Object.entries(r.hyper || {}).map(([k, v]) => `${k}=${v}`)]
        .some((text) => String(text ?? "").toLowerCase().includes(view.q))))
      .sort((a, b) => compare(by.value(a), by.value(b), view.dir));
    fill(holder, table(columns, shown), h("p", { class: "muted", id: "runs-count" },
      `${shown.length} of ${runs.length} runs${settings.length ? ` · settings that differ: ${settings.join(", ")}` : ""}`));
  };
  const form = h("form", { class: "compare-form", "aria-label": "Compare runs", onsubmit: (e) => {
    e.preventDefault();
    // the oldest first: the compare page's baseline is the first run unless another is chosen there
    const ids = runs.filter((r) => boxes.get(r.id)?.checked).sort((a, b) => a.modified - b.modified).map((r) => r.id);
    if (ids.length < 2) { status.textContent = "Choose at least two runs."; status.className = "error"; return; }
    location.hash = `#/compare/${ids.join("/")}`;
  } }, holder, h("button", { type: "submit" }, "Compare selected"), status);
  draw();
  fill(main, h("h1", {}, "Runs"), h("div", { class: "inline runs-filters" },
    field("Search runs", search), field("Kind", kind), field("State", stateFilter)), form);
  let seen = fingerprint(runs);
  return poll(async () => {
    const next = await api("/api/runs");
    if (fingerprint(next) === seen) return false;
    runs = next;
    seen = fingerprint(next);
    draw();
    return true;
  });
}
