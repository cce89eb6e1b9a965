// A database change as tables of rows: inserted (+), deleted (−), updated (before → after, the
// changed cells marked). Used for each tool call of an episode and in the playground.
import { badge, h } from "./lib.js";

const cell = (v) => (v === null ? "NULL" : typeof v === "object" ? JSON.stringify(v) : String(v));

function rowsTable(table, entry) {
  const columns = [...new Set([...entry.inserted, ...entry.deleted, ...entry.updated.flatMap((u) => [u.before, u.after])]
    .flatMap((r) => Object.keys(r)))];
  const body = [];
  for (const r of entry.inserted) body.push(h("tr", { class: "ins" }, h("th", { scope: "row" }, h("span", { "aria-label": "inserted" }, "+")),
    columns.map((c) => h("td", {}, cell(r[c])))));
  for (const r of entry.deleted) body.push(h("tr", { class: "del" }, h("th", { scope: "row" }, h("span", { "aria-label": "deleted" }, "−")),
    columns.map((c) => h("td", {}, cell(r[c])))));
  for (const u of entry.updated) {
    body.push(h("tr", { class: "upd" }, h("th", { scope: "row" }, h("span", { "aria-label": "updated" }, "~")),
      columns.map((c) => {
        const before = cell(u.before[c]), after = cell(u.after[c]);
        return before === after ? h("td", {}, after)
          : h("td", { class: "changed" }, h("del", { "aria-label": `before: ${before}` }, before), " → ", h("ins", {}, after));
      })));
  }
  const counts = `${entry.inserted.length} inserted · ${entry.updated.length} updated · ${entry.deleted.length} deleted`;
  return h("div", { class: "diff-table" },
    h("h5", {}, h("code", {}, table), " ", h("span", { class: "muted" }, counts), entry.truncated ? badge("truncated", "warn") : null),
    h("table", { class: "rows" }, h("thead", {}, h("tr", {}, h("th", { scope: "col" }, h("span", { class: "sr" }, "change")),
      columns.map((c) => h("th", { scope: "col" }, c)))), h("tbody", {}, body)));
}

export function renderDiff(diff) {
  const tables = Object.entries(diff || {});
  if (!tables.length) return h("p", { class: "diff-none muted" }, "No change to the database.");
  return h("div", { class: "diff" }, tables.map(([t, e]) => rowsTable(t, e)));
}

// The end-of-episode counts (GET /diff without rows)
export function renderCounts(counts) {
  const tables = Object.entries(counts || {});
  if (!tables.length) return h("p", { class: "muted" }, "The episode left the database as the snapshot.");
  return h("ul", {}, tables.map(([t, c]) => h("li", {}, h("code", {}, t), `: ${c.inserted} inserted, ${c.updated} updated, ${c.deleted} deleted`)));
}
