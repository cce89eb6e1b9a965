// A typed form from a tool's JSON Schema (an object): per property a labelled control of its type -
// text, number (integer step, bounds), a dropdown for enums (optional ones get "(unset)"), a
// checkbox for a required boolean and unset/true/false for an optional one, a list of typed items
// for arrays, nested fields for objects, JSON text only for what has no type. Optional fields
// start empty (never "null") and are left out of the arguments when empty. Errors are shown at the
// field (aria-invalid, described by the message) and the call is not made.
import { h } from "./lib.js";

let uid = 0;
const nextId = (name) => `sf-${String(name).replace(/[^\w-]/g, "_")}-${++uid}`;

// Optional[X] is anyOf [X, null] (pydantic), or a type list; a $ref points into $defs
export function resolve(schema, root) {
  let s = schema || {};
  for (let i = 0; i < 8 && s.$ref; i++) {
    const path = s.$ref.replace(/^#\//, "").split("/");
    const found = path.reduce((o, k) => (o ? o[k] : undefined), root);
    const { $ref, ...rest } = s;
    s = { ...(found || {}), ...rest };
  }
  const variants = s.anyOf || s.oneOf;
  if (Array.isArray(variants)) {
    const real = variants.filter((v) => v.type !== "null");
    const nullable = real.length < variants.length;
    if (real.length === 1) {
      const { anyOf, oneOf, ...rest } = s;
      return { ...resolve(real[0], root), ...rest, nullable: nullable || undefined };
    }
  }
  if (Array.isArray(s.type)) {
    const real = s.type.filter((t) => t !== "null");
    return { ...s, type: real.length === 1 ? real[0] : undefined, nullable: real.length < s.type.length || undefined };
  }
  return s;
}

const hint = (s) => [s.description, s.format ? `format ${s.format}` : null,
  s.minimum !== undefined ? `≥ ${s.minimum}` : null, s.maximum !== undefined ? `≤ ${s.maximum}` : null]
  .filter(Boolean).join(" · ");

// one field: {el, read() -> {value, empty, error}}; `required` = the property must be given
function build(name, schema, root, required, labelText) {
  const s = resolve(schema, root);
  const id = nextId(name);
  const errorId = `${id}-error`;
  const error = h("small", { class: "field-error", id: errorId, "aria-live": "polite" });
  const described = (extra) => ({ id, name, "aria-describedby": extra ? `${errorId} ${id}-hint` : errorId });
  const text = hint(s);
  const wrap = (control, label = labelText) => h("div", { class: "field" },
    h("label", { for: id }, label, required ? h("span", { "aria-hidden": "true" }, " *") : null, required ? h("span", { class: "sr" }, " (required)") : null),
    control, text ? h("small", { id: `${id}-hint` }, text) : null, error);
  const fail = (control, message) => {
    error.textContent = message || "";
    if (message) control.setAttribute("aria-invalid", "true"); else control.removeAttribute("aria-invalid");
    return message;
  };
  const def = s.default !== undefined && s.default !== null ? s.default : undefined;

  if (Array.isArray(s.enum)) {
    const control = h("select", described(text), required && def === undefined ? h("option", { value: "" }, "(choose)") : null,
      !required ? h("option", { value: "" }, "(unset)") : null,
      s.enum.map((v, i) => h("option", { value: String(i), selected: def !== undefined && v === def }, String(v))));
    return { el: wrap(control), control, read: () => {
      if (control.value === "") return required ? { error: fail(control, "Choose a value.") } : (fail(control), { empty: true });
      fail(control);
      return { value: s.enum[Number(control.value)] };
    } };
  }
  if (s.type === "boolean") {
    if (required) {
      const control = h("input", { ...described(text), type: "checkbox", checked: def === true });
      return { el: wrap(control), control, read: () => ({ value: control.checked }) };
    }
    const control = h("select", described(text), h("option", { value: "" }, "(unset)"),
      h("option", { value: "true", selected: def === true }, "true"), h("option", { value: "false", selected: def === false }, "false"));
    return { el: wrap(control), control, read: () => (control.value === "" ? { empty: true } : { value: control.value === "true" }) };
  }
  if (s.type === "integer" || s.type === "number") {
    const control = h("input", { ...described(text), type: "number", step: s.type === "integer" ? "1" : "any", inputmode: "decimal",
      min: s.minimum ?? null, max: s.maximum ?? null, value: def ?? "" });
    return { el: wrap(control), control, read: () => {
      const raw = control.value.trim();
      if (raw === "") {
        if (control.validity && control.validity.badInput) return { error: fail(control, "Not a number.") };
        return required ? { error: fail(control, "Required.") } : (fail(control), { empty: true });
      }
      const value = Number(raw);
      if (!Number.isFinite(value)) return { error: fail(control, "Not a number.") };
      if (s.type === "integer" && !Number.isInteger(value)) return { error: fail(control, "A whole number is needed.") };
      if (s.minimum !== undefined && value < s.minimum) return { error: fail(control, `At least ${s.minimum}.`) };
      if (s.maximum !== undefined && value > s.maximum) return { error: fail(control, `At most ${s.maximum}.`) };
      fail(control);
      return { value };
    } };
  }
  if (s.type === "string") {
    const long = (s.maxLength || 0) > 200 || /body|text|content|description|notes?$/i.test(name);
    const control = long ? h("textarea", { ...described(text), rows: 2 }, def ?? "")
      : h("input", { ...described(text), type: s.format === "date" ? "date" : "text", value: def ?? "" });
    return { el: wrap(control), control, read: () => {
      const raw = control.value;
      if (raw === "") return required ? { error: fail(control, "Required.") } : (fail(control), { empty: true });
      if (s.minLength !== undefined && raw.length < s.minLength) return { error: fail(control, `At least ${s.minLength} characters.`) };
      if (s.maxLength !== undefined && raw.length > s.maxLength) return { error: fail(control, `At most ${s.maxLength} characters.`) };
      if (s.pattern && !new RegExp(s.pattern, "u").test(raw)) return { error: fail(control, `Must match ${s.pattern}.`) };
      fail(control);
      return { value: raw };
    } };
  }
  if (s.type === "array" && s.items && resolve(s.items, root).type) {
    const items = [];
    const list = h("ol", { class: "array-items" });
    const add = h("button", { type: "button", class: "secondary", id, "aria-describedby": errorId }, `Add ${labelText} item`);
    const addItem = (value) => {
      const item = build(`${name}-${items.length}`, { ...s.items, ...(value !== undefined ? { default: value } : {}) }, root, true,
        `${labelText} item ${items.length + 1}`);
      const li = h("li", { class: "array-item" }, item.el);
      const remove = h("button", { type: "button", class: "secondary", "aria-label": `Remove ${labelText} item ${items.length + 1}`,
        onclick: () => { items.splice(items.indexOf(item), 1); li.remove(); } }, "Remove");
      li.append(remove);
      items.push(item);
      list.append(li);
    };
    add.addEventListener("click", () => { addItem(); items[items.length - 1].control?.focus(); });
    for (const v of Array.isArray(def) ? def : []) addItem(v);
    const el = h("fieldset", { class: "object-field" }, h("legend", {}, labelText, required ? " *" : ""), text ? h("small", {}, text) : null,
      list, add, error);
    return { el, control: add, read: () => {
      const read = items.map((i) => i.read());
      if (read.some((r) => r.error)) return { error: "item" };
      const values = read.filter((r) => !r.empty).map((r) => r.value);
      if (!values.length) return required ? { error: fail(add, "Add at least one item.") } : (fail(add), { empty: true });
      if (s.minItems !== undefined && values.length < s.minItems) return { error: fail(add, `At least ${s.minItems} items.`) };
      fail(add);
      return { value: values };
    } };
  }
  if (s.type === "object" && s.properties) {
    const form = objectFields(s, root, `${labelText}.`);
    const el = h("fieldset", { class: "object-field" }, h("legend", {}, labelText, required ? " *" : ""), text ? h("small", {}, text) : null, form.els);
    return { el, control: form.first, read: () => {
      const r = form.read();
      if (r.error) return r;
      return Object.keys(r.value).length || required ? { value: r.value } : { empty: true };
    } };
  }
  // no usable type (a free object, a union): JSON text, checked here
  const control = h("textarea", { ...described(text), rows: 2, placeholder: "JSON" }, def !== undefined ? JSON.stringify(def) : "");
  return { el: wrap(control, `${labelText} (JSON)`), control, read: () => {
    const raw = control.value.trim();
    if (raw === "") return required ? { error: fail(control, "Required.") } : (fail(control), { empty: true });
    try { const value = JSON.parse(raw); fail(control); return { value }; } catch (err) { return { error: fail(control, `Not JSON: ${err.message}`) }; }
  } };
}

function objectFields(schema, root, prefix = "") {
  const required = new Set(schema.required || []);
  const fields = Object.entries(schema.properties || {}).map(([name, s]) => [name, build(name, s, root, required.has(name), `${prefix}${name}`)]);
  return {
    els: fields.map(([, f]) => f.el),
    first: fields.length ? fields[0][1].control : null,
    read: () => {
      const value = {};
      let bad = null;
      for (const [name, f] of fields) {
        const r = f.read();
        if (r.error) bad = bad || f;
        else if (!r.empty) value[name] = r.value;
      }
      return bad ? { error: "field", field: bad } : { value };
    },
  };
}

// onSubmit(args) runs only when every field is valid; the first invalid one gets the focus
export function schemaForm(schema, onSubmit, submitLabel = "Call") {
  const root = schema || {};
  const fields = objectFields(root, root);
  const status = h("p", { class: "field-error", role: "alert" });
  return h("form", { class: "schema-form", novalidate: true, onsubmit: (e) => {
    e.preventDefault();
    const r = fields.read();
    if (r.error) {
      status.textContent = "Fix the marked fields first.";
      const first = e.target.querySelector("[aria-invalid='true']");
      if (first) first.focus();
      return;
    }
    status.textContent = "";
    onSubmit(() => r.value);
  } },
  fields.els.length ? fields.els : h("p", { class: "muted" }, "No arguments."),
  h("button", { type: "submit" }, submitLabel), status);
}
