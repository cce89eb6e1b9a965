// The catalog one environment at a time (tabs), its tables and tools folded, its tasks in pages
// of 20 with the gate status as one badge; the gate records once per environment (grouped, not
// repeated per task). The search box looks through every environment. #/catalog?env=E&task=T
// opens one task (an episode links to its task this way).
import { api, badge, field, fill, fmt, h, query, table } from "../lib.js";

const PAGE = 20;

function gateSummary(env) {
  const groups = new Map();
  for (const t of env.tasks) {
    for (const g of t.gates) {
      const side = (x) => (x ? `${x.passed ? "passed" : "failed"} (${x.verdict})` : "not run");
      const day = (x) => (x && x.at ? String(x.at).slice(0, 10) : "");
      const key = [g.verifier_kind, side(g.negative), side(g.positive), day(g.negative) || day(g.positive)].join("|");
      groups.set(key, (groups.get(key) || 0) + 1);
    }
  }
  const ungated = env.tasks.filter((t) => !t.gated);
  return h("section", { "aria-label": `Gate records of ${env.name}` },
    h("h3", {}, "Gates ", h("span", { class: "muted" }, `${env.tasks.length - ungated.length} of ${env.tasks.length} tasks gated`)),
    groups.size ? table([
      { label: "Verifier", cell: ([k]) => badge(k.split("|")[0], "neutral") },
      { label: "Negative run (does nothing)", cell: ([k]) => k.split("|")[1] },
      { label: "Positive run (reference solution)", cell: ([k]) => k.split("|")[2] },
      { label: "When", cell: ([k]) => k.split("|")[3] || "–" },
      { label: "Tasks", cell: ([, n]) => n, cls: "num" },
    ], [...groups], "Gate records, grouped") : h("p", { class: "muted" }, "No gate records."),
    ungated.length ? h("p", {}, "Not gated: ", ungated.map((t) => [h("code", {}, t.id), ` (${t.gate_reason}) `])) : null);
}

function taskDetails(env, t, open) {
  return h("details", { class: "task", id: `task-${env.name}-${t.id}`, open: open || null },
    h("summary", {}, h("code", {}, t.id), " ", t.gated ? badge("gated", "ok") : badge("ungated", "warn"), " ",
      badge(t.verifier_kind, "neutral"), " ", h("span", {}, t.instruction)),
    h("dl", { class: "facts" },
      h("dt", {}, "Success"), h("dd", {}, t.success_criteria || "–"),
      h("dt", {}, "Failure"), h("dd", {}, t.failure_criteria || "–"),
      t.alt_verifier_kind ? [h("dt", {}, "Alternative verifier"), h("dd", {}, t.alt_verifier_kind)] : null,
      t.gated ? null : [h("dt", {}, "Why not gated"), h("dd", {}, t.gate_reason)]),
    t.solution.length ? [h("h5", {}, "Reference solution"), h("ol", {}, t.solution.map((c) => h("li", {}, h("code", {}, c.tool || c.name || ""), " ",
      h("code", {}, JSON.stringify(c.arguments ?? c.args ?? {})))))] : null);
}

function environment(env, q, params) {
  const hit = (...texts) => !q || texts.some((t) => (t || "").toLowerCase().includes(q));
  const tools = env.tools.filter((t) => hit(t.name, t.description, env.name));
  const tasks = env.tasks.filter((t) => hit(t.id, t.instruction, env.name));
  const tables = env.tables.filter((t) => hit(t.name, env.name, ...t.columns.map((c) => c.name)));
  if (!tools.length && !tasks.length && !tables.length) return null;
  const wanted = params.task && params.env === env.name ? params.task : null;
  let page = wanted ? Math.floor(Math.max(0, tasks.findIndex((t) => t.id === wanted)) / PAGE) : 0;
  const list = h("div", {});
  const drawTasks = () => {
    const shown = tasks.slice(page * PAGE, (page + 1) * PAGE);
    const pages = Math.ceil(tasks.length / PAGE);
    fill(list, shown.map((t) => taskDetails(env, t, t.id === wanted)),
      pages > 1 ? h("nav", { class: "pager", "aria-label": `Task pages of ${env.name}` },
        h("button", { type: "button", class: "secondary", disabled: page === 0 || null, onclick: () => { page -= 1; drawTasks(); } }, "← Previous tasks"),
        h("span", { class: "muted" }, `page ${page + 1} of ${pages}`),
        h("button", { type: "button", class: "secondary", disabled: page >= pages - 1 || null, onclick: () => { page += 1; drawTasks(); } }, "Next tasks →")) : null);
  };
  drawTasks();
  return h("section", { class: "env", "aria-labelledby": `env-${env.name}` },
    h("h2", { id: `env-${env.name}` }, env.name, " ", h("span", { class: "muted" }, `${env.tools.length} tools · ${env.tasks.length} tasks · ${env.tables.length} tables`)),
    h("p", {}, env.description),
    h("details", { open: !!q || null }, h("summary", {}, `Tables (${tables.length})`),
      table([
        { label: "Table", cell: (t) => h("code", {}, t.name) },
        { label: "Seed rows", cell: (t) => t.rows, cls: "num" },
        { label: "Columns", cell: (t) => t.columns.map((c) => `${c.name} ${c.type}`).join(", ") },
      ], tables)),
    h("details", { open: !!q || null }, h("summary", {}, `Tools (${tools.length})`),
      tools.map((t) => h("div", { class: "tool" }, h("h3", {}, h("code", {}, t.name)), h("p", {}, t.description),
        h("details", {}, h("summary", {}, "Input schema"), h("pre", {}, fmt.json(t.input_schema)))))),
    gateSummary(env),
    h("h3", {}, `Tasks (${tasks.length})`), list);
}

export async function render(main, args, params) {
  const data = await api("/api/catalog");
  const names = data.environments.map((e) => e.name);
  const current = names.includes(params.env) ? params.env : names[0];
  const search = h("input", { type: "search", name: "q", value: params.q || "", placeholder: "tool, task, table, text" });
  const list = h("div", {});
  const draw = () => {
    const q = search.value.trim().toLowerCase();
    // a search looks through every environment; otherwise the chosen one
    const envs = data.environments.filter((e) => q || e.name === current).map((e) => environment(e, q, params)).filter(Boolean);
    fill(list, ...(envs.length ? envs : [h("p", { class: "muted" }, "Nothing matches.")]));
  };
  search.addEventListener("input", draw);
  fill(main, h("h1", {}, "Catalog ", h("span", { class: "muted" }, data.catalog)),
    h("form", { role: "search", "aria-label": "Search the catalog", onsubmit: (e) => e.preventDefault() }, field("Search all environments", search)),
    h("nav", { "aria-label": "Environments" }, h("ul", { class: "env-tabs" }, data.environments.map((e) => h("li", {},
      h("a", { href: `#/catalog${query({ env: e.name })}`, "aria-current": e.name === current ? "page" : null },
        `${e.name} (${e.tasks.length})`))))),
    data.broken.length ? h("p", { class: "error" }, `Broken bundles: ${data.broken.map((b) => `${b.name}: ${b.error}`).join("; ")}`) : null,
    list);
  draw();
  if (params.task) {
    const target = document.getElementById(`task-${params.env}-${params.task}`);
    if (target) { target.scrollIntoView(); target.querySelector("summary").focus(); }
  }
}
