// A form from a tool's JSON Schema (type object): one labelled control per property - text,
// number, checkbox, select for enums, JSON text for arrays, objects and anything else - and a
// reader that turns the controls back into arguments (empty optional fields are left out).
import { field, h } from "./lib.js";

function control(name, schema, required) {
  const common = { name, required: required || null, "aria-describedby": null };
  if (Array.isArray(schema.enum)) {
    return h("select", common, required ? null : h("option", { value: "" }, "(unset)"),
      schema.enum.map((v) => h("option", { value: JSON.stringify(v) }, String(v))));
  }
  const type = Array.isArray(schema.type) ? schema.type.find((t) => t !== "null") : schema.type;
  if (type === "boolean") return h("input", { ...common, type: "checkbox", required: null, checked: schema.default === true });
  if (type === "integer" || type === "number") {
    return h("input", { ...common, type: "number", step: type === "integer" ? "1" : "any", value: schema.default ?? "" });
  }
  if (type === "string") return h("input", { ...common, type: "text", value: schema.default ?? "" });
  return h("textarea", { ...common, rows: 2, placeholder: "JSON" }, schema.default !== undefined ? JSON.stringify(schema.default) : "");
}

export function schemaForm(schema, onSubmit, submitLabel = "Call") {
  const props = (schema && schema.properties) || {};
  const required = new Set((schema && schema.required) || []);
  const controls = Object.entries(props).map(([name, s]) => [name, s, control(name, s, required.has(name))]);
  const read = () => {
    const args = {};
    for (const [name, s, el] of controls) {
      const type = Array.isArray(s.type) ? s.type.find((t) => t !== "null") : s.type;
      if (el.type === "checkbox") { if (el.checked || required.has(name)) args[name] = el.checked; continue; }
      const raw = el.value;
      if (raw === "" && !required.has(name)) continue;
      if (Array.isArray(s.enum)) args[name] = JSON.parse(raw);
      else if (type === "integer") args[name] = Number.parseInt(raw, 10);
      else if (type === "number") args[name] = Number(raw);
      else if (type === "string") args[name] = raw;
      else args[name] = JSON.parse(raw);  // a parse error is shown next to the form
    }
    return args;
  };
  return h("form", { class: "schema-form", onsubmit: (e) => { e.preventDefault(); onSubmit(read); } },
    controls.length ? controls.map(([name, s, el]) => field(`${name}${required.has(name) ? " *" : ""}`, el, s.description || s.type || ""))
      : h("p", { class: "muted" }, "No arguments."),
    h("button", { type: "submit" }, submitLabel));
}
