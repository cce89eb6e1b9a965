// The run list (evaluations with their pass@1, training runs with their last reward, who trained
// them, each run's state and progress, kept live while the page is open), and the choice of runs
// to compare.
import { api, badge, fill, fmt, h, poll, runState, table } from "../lib.js";

function result(r) {
  if (r.kind === "eval") return `pass@1 ${fmt.pct(r.pass_at_1)}${r.k && r.k > 1 ? ` · pass@${r.k} ${fmt.pct(r.pass_at_k)}` : ""}`;
  if (r.last_reward !== null && r.last_reward !== undefined) return `reward ${fmt.num(r.last_reward)} (last step)`;
  return "–";
}

// a run stopped short says why under its badge (the others say it on hover)
function state(r) {
  return [runState(r), r.state === "stopped" ? h("small", { class: "muted state-reason" }, r.state_reason) : null];
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
  const draw = () => fill(holder, table([
    { label: "Compare", cell: box },
    { label: "Run", cell: (r) => h("a", { href: `#/run/${r.id}` }, r.name) },
    { label: "State", cell: state },
    { label: "Kind", cell: (r) => [badge(r.kind, "neutral"), r.framework ? badge(r.framework, "neutral") : null] },
    { label: "Model", cell: (r) => r.model || "–" },
    { label: "Result", cell: result },
    { label: "Modified", cell: (r) => new Date(r.modified * 1000).toLocaleString() },
    { label: "Directory", cell: (r) => h("code", { class: "path" }, r.path) },
  ], runs));
  const form = h("form", { class: "compare-form", "aria-label": "Compare runs", onsubmit: (e) => {
    e.preventDefault();
    // the oldest first: the compare page's baseline is the first run unless another is chosen there
    const ids = runs.filter((r) => boxes.get(r.id)?.checked).sort((a, b) => a.modified - b.modified).map((r) => r.id);
    if (ids.length < 2) { status.textContent = "Choose at least two runs."; status.className = "error"; return; }
    location.hash = `#/compare/${ids.join("/")}`;
  } }, holder, h("button", { type: "submit" }, "Compare selected"), status);
  draw();
  fill(main, h("h1", {}, "Runs"), form);
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
