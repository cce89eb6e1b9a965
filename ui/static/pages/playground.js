// Act as the agent on a real instance: reset to a task, call tools from forms built from their
// JSON Schemas, see each call's result and database change, verify. In a cluster (the UI started
// with --playground-claims) an instance is first claimed from the operator with the person's own
// bearer token, which this tab keeps (sessionStorage) and sends with every playground request.
import { renderCounts, renderDiff } from "../diff.js";
import { api, badge, errorBox, field, fill, fmt, h, select } from "../lib.js";
import { schemaForm } from "../schemaform.js";

const TOKEN = "awm.playground.token";

function auth() {
  const token = sessionStorage.getItem(TOKEN);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

// The cluster's side: a fleet of a served namespace, an environment of it, and the token to claim with.
function claimForm(fleet) {
  const fleets = fleet.namespaces.flatMap((g) => g.fleets);
  const byKey = Object.fromEntries(fleets.map((f) => [`${f.namespace}/${f.fleet}`, f]));
  const which = select("fleet", Object.keys(byKey), Object.keys(byKey)[0], "choose a fleet");
  const env = select("environment", [], "", "any");
  const names = () => fill(env, h("option", { value: "" }, "any"),
    ((byKey[which.value] || {}).environmentNames || []).map((n) => h("option", { value: n }, n)));
  which.addEventListener("change", names);
  names();
  const token = h("input", { type: "password", name: "token", autocomplete: "off", value: sessionStorage.getItem(TOKEN) || "" });
  const problem = h("p", { class: "error", role: "alert", id: "claim-error", hidden: true });
  const form = h("form", { class: "inline", id: "claim", onsubmit: async (e) => {
    e.preventDefault();
    problem.hidden = true;
    const [namespace, name] = which.value.split("/");
    if (!name) { fill(problem, "Choose a fleet."); problem.hidden = false; return; }
    if (token.value.trim()) sessionStorage.setItem(TOKEN, token.value.trim()); else sessionStorage.removeItem(TOKEN);
    try {
      const r = await api("/api/playground/claim", { body: { namespace, fleet: name, environment: env.value || null }, headers: auth() });
      location.hash = `#/playground?instance=${encodeURIComponent(r.instance)}`;
    } catch (err) { fill(problem, String(err.message || err)); problem.hidden = false; }
  } }, field("Fleet", which), field("Environment", env),
    field("Your token", token, "a bearer token the operator accepts (kubectl create token ...); kept in this tab only"),
    h("button", { type: "submit" }, "Claim an instance"));
  return h("section", { "aria-labelledby": "claim-h" }, h("h2", { id: "claim-h" }, "Claim an instance in the cluster"), form, problem);
}

export async function render(main, args, params) {
  const fleet = await api("/api/fleet");
  const ready = fleet.instances.filter((i) => i.state === "ready");
  const claims = fleet.playground_claims && fleet.namespaces.some((g) => g.fleets.length);
  fill(main, h("h1", {}, "Playground"));
  if (!fleet.instances.length && !claims) {
    main.append(h("p", {}, "No instance to play on. Start the UI with ", h("code", {}, "awm ui --serve ENV"),
      " or give one with ", h("code", {}, "--instance MCP_URL,CONTROL_URL"),
      "; in a cluster, with ", h("code", {}, "--playground-claims"), " (the chart's ", h("code", {}, "ui.playground"), ")."));
    return;
  }
  if (claims) main.append(claimForm(fleet));
  const names = fleet.instances.map((i) => i.name);
  if (params.instance && !names.includes(params.instance)) names.push(params.instance);  // claimed above
  if (!names.length) return;
  const picker = select("instance", names, params.instance || (ready[0] || fleet.instances[0] || {}).name, "choose");
  picker.addEventListener("change", () => { location.hash = `#/playground?instance=${encodeURIComponent(picker.value)}`; });
  main.append(h("form", { class: "inline", onsubmit: (e) => e.preventDefault() }, field("Instance", picker)));
  const name = picker.value;
  if (!name) return;
  const session = await api(`/api/playground/${encodeURIComponent(name)}/open`, { method: "POST", headers: auth() });
  // the instance is released when the page is left: another page of the UI (the returned stop),
  // another instance, or the tab closed or navigated away (pagehide: a keepalive request, which
  // the browser sends even while unloading). The server also releases sessions idle longer than
  // its TTL (a claimed instance: the operator, at its claim's TTL).
  const releaseUrl = `/api/playground/${encodeURIComponent(name)}/release`;
  const release = () => fetch(releaseUrl, { method: "POST", keepalive: true, headers: auth() }).catch(() => {});
  window.addEventListener("pagehide", release);
  const stop = () => {
    window.removeEventListener("pagehide", release);
    release();
  };
  const log = h("ol", { class: "calls", "aria-live": "polite", id: "play-log" });
  const status = h("p", { class: "muted", id: "play-status" }, "Reset to a task to start an episode.");
  const guard = async (fn) => { try { await fn(); } catch (err) { log.append(h("li", {}, errorBox(err))); } };

  const task = select("task", session.tasks.map((t) => t.id), params.task, "(no task)");
  const reset = h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); guard(async () => {
    const r = await api(`/api/playground/${encodeURIComponent(name)}/reset`, { body: { task_id: task.value || null }, headers: auth() });
    fill(log);
    fill(status, `Episode ${r.episode_id} · reset in ${fmt.ms(r.reset_ms)}`, r.instruction ? h("blockquote", {}, r.instruction) : "");
  }); } }, field("Task", task), h("button", { type: "submit" }, "Reset"));

  const answer = h("input", { type: "text", name: "final_answer" });
  const verify = h("form", { class: "inline", onsubmit: (e) => { e.preventDefault(); guard(async () => {
    const r = await api(`/api/playground/${encodeURIComponent(name)}/verify`, { body: { final_answer: answer.value || null }, headers: auth() });
    log.append(h("li", { class: "call verify-result" }, h("h4", {}, "Verdict ", badge(r.verdict.verdict),
      r.masked ? [" ", badge(`masked: ${r.mask_reason}`, "masked")] : ` reward ${fmt.num(r.reward)}`),
      r.verdict.reason ? h("p", {}, r.verdict.reason) : null, renderCounts(r.diff)));
  }); } }, field("Final answer", answer), h("button", { type: "submit" }, "Verify"));

  const tools = h("div", { class: "tools" }, session.tools.map((tool) => h("details", { class: "tool", "data-tool": tool.name },
    h("summary", {}, h("code", {}, tool.name), " ", h("span", { class: "muted" }, tool.description.split("\n")[0])),
    schemaForm(tool.inputSchema || {}, (read) => guard(async () => {
      const r = await api(`/api/playground/${encodeURIComponent(name)}/call`, { body: { tool: tool.name, arguments: read() }, headers: auth() });
      log.append(h("li", { class: "call" },
        h("h4", {}, h("code", {}, r.name), " ", r.is_error ? badge(r.error_kind || "error", "err") : badge("ok"), h("span", { class: "muted" }, ` ${fmt.ms(r.ms)}`)),
        h("div", { class: "two" }, h("div", {}, h("h5", {}, "Arguments"), h("pre", {}, fmt.json(r.arguments))),
          h("div", {}, h("h5", {}, r.is_error ? "Error" : "Result"), h("pre", {}, r.text))),
        r.is_error ? null : h("div", {}, h("h5", {}, "Database change"), renderDiff(r.diff))));
    })))));

  main.append(h("p", { class: "muted", id: "play-held" }, session.claimed
    ? `${name}: claimed from the cluster for you (${session.instance.env}); released when you leave this page, or after ${Math.round(session.ttl_s / 60)} minutes idle.`
    : `Held by this page (released when you leave it, or after ${Math.round(session.ttl_s / 60)} minutes idle).`),
    reset, status, h("div", { class: "two" },
    h("section", { "aria-labelledby": "tools-h" }, h("h2", { id: "tools-h" }, "Tools"), tools),
    h("section", { "aria-labelledby": "log-h" }, h("h2", { id: "log-h" }, "Calls"), log, verify)));
  return stop;
}
