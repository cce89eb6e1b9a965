// Environments with their tables, tools (input schemas) and tasks (verifier kind, gate records);
// the search box filters all three by name and text.
import { api, badge, field, fill, fmt, h, table } from "../lib.js";

function gates(task) {
  if (!task.gates.length) return h("span", { class: "muted" }, "no gate record");
  return h("ul", { class: "gates" }, task.gates.map((g) => h("li", {},
    `${g.verifier_kind}: `,
    ["negative", "positive"].map((side) => g[side]
      ? h("span", { title: g[side].reason || "" }, ` ${side} `, badge(g[side].passed ? "passed" : "failed", g[side].passed ? "ok" : "err"), ` (${g[side].verdict}, ${g[side].at})`)
      : ` ${side} not run`))));
}

function environment(env, q) {
  const hit = (...texts) => !q || texts.some((t) => (t || "").toLowerCase().includes(q));
  const tools = env.tools.filter((t) => hit(t.name, t.description, env.name));
  const tasks = env.tasks.filter((t) => hit(t.id, t.instruction, env.name));
  const tables = env.tables.filter((t) => hit(t.name, env.name, ...t.columns.map((c) => c.name)));
  if (!tools.length && !tasks.length && !tables.length) return null;
  return h("section", { class: "env", "aria-labelledby": `env-${env.name}` },
    h("h2", { id: `env-${env.name}` }, env.name, " ", h("span", { class: "muted" }, `${env.tools.length} tools · ${env.tasks.length} tasks · ${env.tables.length} tables`)),
    h("p", {}, env.description),
    h("details", { open: !!q }, h("summary", {}, `Tables (${tables.length})`),
      table([
        { label: "Table", cell: (t) => h("code", {}, t.name) },
        { label: "Seed rows", cell: (t) => t.rows, cls: "num" },
        { label: "Columns", cell: (t) => t.columns.map((c) => `${c.name} ${c.type}`).join(", ") },
      ], tables)),
    h("details", { open: true }, h("summary", {}, `Tools (${tools.length})`),
      tools.map((t) => h("div", { class: "tool" }, h("h3", {}, h("code", {}, t.name)), h("p", {}, t.description),
        h("details", {}, h("summary", {}, "Input schema"), h("pre", {}, fmt.json(t.input_schema)))))),
    h("details", { open: true }, h("summary", {}, `Tasks (${tasks.length})`),
      table([
        { label: "Task", cell: (t) => h("code", {}, t.id) },
        { label: "Instruction", cell: (t) => t.instruction },
        { label: "Verifier", cell: (t) => [badge(t.verifier_kind, "neutral"), t.alt_verifier_kind ? [" alt ", badge(t.alt_verifier_kind, "neutral")] : null] },
        { label: "Gated", cell: (t) => [badge(t.gated ? "gated" : "ungated", t.gated ? "ok" : "warn"), t.gated ? null : h("small", {}, ` ${t.gate_reason}`)] },
        { label: "Gate records", cell: gates },
      ], tasks)));
}

export async function render(main, args, params) {
  const data = await api("/api/catalog");
  const search = h("input", { type: "search", name: "q", value: params.q || "", placeholder: "tool, task, table, text" });
  const list = h("div", {});
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    const envs = data.environments.map((e) => environment(e, q)).filter(Boolean);
    fill(list, ...(envs.length ? envs : [h("p", { class: "muted" }, "Nothing matches.")]));
  };
  search.addEventListener("input", draw);
  fill(main, h("h1", {}, "Catalog ", h("span", { class: "muted" }, data.catalog)),
    h("form", { role: "search", "aria-label": "Search the catalog", onsubmit: (e) => e.preventDefault() }, field("Search", search)),
    data.broken.length ? h("p", { class: "error" }, `Broken bundles: ${data.broken.map((b) => `${b.name}: ${b.error}`).join("; ")}`) : null,
    list);
  draw();
}
