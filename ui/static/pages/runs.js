// The run list (evaluations with their pass@1, training runs with their last reward, who trained
// them), and the choice of runs to compare.
import { api, badge, fill, fmt, h, table } from "../lib.js";

function result(r) {
  if (r.kind === "eval") return `pass@1 ${fmt.pct(r.pass_at_1)}${r.k && r.k > 1 ? ` · pass@${r.k} ${fmt.pct(r.pass_at_k)}` : ""}`;
  if (r.last_reward !== null && r.last_reward !== undefined) return `reward ${fmt.num(r.last_reward)} (last step)`;
  return "–";
}

export async function render(main) {
  const runs = await api("/api/runs");
  if (!runs.length) {
    fill(main, h("h1", {}, "Runs"),
      h("p", {}, "No run directories found. Train or evaluate first (",
        h("code", {}, "awm train --config examples/train-tiny.yaml"), "), then start ",
        h("code", {}, "awm ui --runs runs"), "."));
    return;
  }
  const status = h("p", { class: "muted", role: "status", id: "compare-status" }, "Tick two or more runs to compare them.");
  const boxes = runs.map((r) => h("input", { type: "checkbox", name: "compare", value: r.id, id: `cmp-${r.id}`,
    "aria-label": `compare ${r.name}` }));
  const form = h("form", { class: "compare-form", "aria-label": "Compare runs", onsubmit: (e) => {
    e.preventDefault();
    const ids = boxes.filter((b) => b.checked).map((b) => b.value);
    if (ids.length < 2) { status.textContent = "Choose at least two runs."; status.className = "error"; return; }
    location.hash = `#/compare/${ids.join("/")}`;
  } },
  table([
    { label: "Compare", cell: (r) => boxes[runs.indexOf(r)] },
    { label: "Run", cell: (r) => h("a", { href: `#/run/${r.id}` }, r.name) },
    { label: "Kind", cell: (r) => [badge(r.kind, "neutral"), r.framework ? badge(r.framework, "neutral") : null] },
    { label: "Model", cell: (r) => r.model || "–" },
    { label: "Steps", cell: (r) => (r.kind === "eval" ? "–" : r.steps), cls: "num" },
    { label: "Result", cell: result },
    { label: "Modified", cell: (r) => new Date(r.modified * 1000).toLocaleString() },
    { label: "Directory", cell: (r) => h("code", { class: "path" }, r.path) },
  ], runs),
  h("button", { type: "submit" }, "Compare selected"), status);
  fill(main, h("h1", {}, "Runs"), form);
}
