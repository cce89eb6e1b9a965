// The run list, and the form that compares two runs.
import { api, badge, field, fill, fmt, h, table } from "../lib.js";

export async function render(main) {
  const runs = await api("/api/runs");
  if (!runs.length) {
    fill(main, h("h1", {}, "Runs"),
      h("p", {}, "No run directories found. Train or evaluate first (",
        h("code", {}, "awm train --config examples/train-tiny.yaml"), "), then start ",
        h("code", {}, "awm ui --runs runs"), "."));
    return;
  }
  const pick = (name, n) => h("select", { name }, runs.map((r, i) => h("option", { value: r.id, selected: i === n }, r.name)));
  const a = pick("a", 0), b = pick("b", Math.min(1, runs.length - 1));
  const form = h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); location.hash = `#/compare/${a.value}/${b.value}`; } },
    field("Run A", a), field("Run B", b), h("button", { type: "submit" }, "Compare"));
  fill(main, 
    h("h1", {}, "Runs"),
    table([
      { label: "Run", cell: (r) => h("a", { href: `#/run/${r.id}` }, r.name) },
      { label: "Kind", cell: (r) => badge(r.kind, "neutral") },
      { label: "Steps", cell: (r) => r.steps, cls: "num" },
      { label: "Last reward", cell: (r) => fmt.num(r.last_reward), cls: "num" },
      { label: "Modified", cell: (r) => new Date(r.modified * 1000).toLocaleString() },
      { label: "Directory", cell: (r) => h("code", {}, r.path) },
    ], runs),
    h("h2", {}, "Compare two runs"), form);
}
