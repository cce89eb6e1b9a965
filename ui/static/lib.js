// Small helpers shared by the pages: DOM building (text only, never innerHTML, so nothing from
// a trajectory can inject markup), the JSON API, formatting.

export function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key.startsWith("on") && typeof value === "function") el.addEventListener(key.slice(2), value);
    else if (key === "class") el.className = value;
    else el.setAttribute(key, value === true ? "" : String(value));
  }
  append(el, children);
  return el;
}

// replaceChildren that takes what h() takes: nested arrays, nulls and falses left out
export function fill(el, ...children) {
  el.replaceChildren();
  append(el, children);
  return el;
}

function append(el, children) {
  for (const child of children.flat(Infinity)) {
    if (child === null || child === undefined || child === false) continue;
    el.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
}

export async function api(path, options = {}) {
  const init = { ...options, headers: { "Accept": "application/json", ...(options.headers || {}) } };
  if (options.body !== undefined && typeof options.body !== "string") {
    init.body = JSON.stringify(options.body);
    init.headers["Content-Type"] = "application/json";
    init.method = init.method || "POST";
  }
  const response = await fetch(path, init);
  const data = await response.json().catch(() => ({ error: response.statusText }));
  if (!response.ok) throw new Error(data.error || `HTTP ${response.status}`);
  return data;
}

export const fmt = {
  num(v, digits = 3) { return v === null || v === undefined ? "–" : Number(v).toFixed(digits).replace(/\.?0+$/, "") || "0"; },
  pct(v) { return v === null || v === undefined ? "–" : `${(100 * v).toFixed(1)}%`; },
  ms(v) { return v === null || v === undefined ? "–" : `${Number(v).toFixed(v < 10 ? 2 : 0)} ms`; },
  json(v) { return typeof v === "string" ? v : JSON.stringify(v, null, 2); },
};

// a table in a box of its own that scrolls sideways when a cell holds a long unbreakable value
// (the page never does)
export function table(columns, rows, caption) {
  return h("div", { class: "table-wrap" }, h("table", {},
    caption ? h("caption", {}, caption) : null,
    h("thead", {}, h("tr", {}, columns.map((c) => h("th", { scope: "col" }, c.label)))),
    h("tbody", {}, rows.map((row) => h("tr", {}, columns.map((c) => h("td", { class: c.cls || null }, c.cell(row))))))));
}

export function badge(text, kind) {
  return h("span", { class: `badge ${kind || text}` }, text);
}

export function field(label, control, hint) {
  const id = control.id || `f-${Math.random().toString(36).slice(2, 9)}`;
  control.id = id;
  return h("div", { class: "field" }, h("label", { for: id }, label), control, hint ? h("small", {}, hint) : null);
}

export function select(name, values, current, emptyLabel = "any") {
  return h("select", { name },
    h("option", { value: "" }, emptyLabel),
    values.map((v) => h("option", { value: v, selected: String(v) === String(current ?? "") }, String(v))));
}

export function errorBox(err) {
  return h("p", { class: "error", role: "alert" }, String(err.message || err));
}

export function query(params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v !== null && v !== undefined && v !== "") q.set(k, v);
  const s = q.toString();
  return s ? `?${s}` : "";
}

// Calls `tick` again and again while a page is open: `min` ms after a tick that saw a change,
// twice the last wait (up to `max`) after one that did not or failed (a restarting server is not
// hammered), and no request while the tab is hidden. Returns the function that stops it.
export function poll(tick, { min = 2000, max = 30000 } = {}) {
  let delay = min, timer = null, live = true;
  const run = async () => {
    let changed = false;
    if (!document.hidden) {
      try { changed = await tick(); } catch { changed = false; }
    }
    if (!live) return;
    delay = changed ? min : Math.min(max, delay * 2);
    timer = setTimeout(run, delay);
  };
  timer = setTimeout(run, delay);
  return () => { live = false; clearTimeout(timer); };
}

// A run's state as a badge with its reason, and its progress: "running · step 6 of 45"
export function runState(s) {
  const progress = s.total_steps ? `step ${s.step ?? 0} of ${s.total_steps}` : s.step ? `step ${s.step}` : null;
  return h("span", { class: "run-state", title: s.state_reason || null },
    badge(s.state, `state-${s.state}`), progress ? h("span", { class: "progress" }, ` ${progress}`) : null);
}
