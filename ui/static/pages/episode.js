// One episode step by step: the prompt, each assistant turn with its tool calls (arguments,
// result or classified error, and the rows the call changed), the verdict and the reward.
import { COLORS, lineChart } from "../charts.js";
import { renderCounts, renderDiff } from "../diff.js";
import { api, badge, fill, fmt, h, query } from "../lib.js";

// Which error classes are the agent's: from the server's one definition (awm.errorclass), once.
let AGENT_FAULTS = new Set();
async function loadVocabulary() {
  if (AGENT_FAULTS.size) return;
  const vocabulary = await api("/api/vocabulary");
  AGENT_FAULTS = new Set(Object.entries(vocabulary.error_classes || {})
    .filter(([, info]) => info.fault === "agent").map(([name]) => name));
}

function message(m) {
  const text = typeof m.content === "string" ? m.content : JSON.stringify(m.content);
  return h("div", { class: `msg ${m.role}` }, h("div", { class: "role" }, m.role), h("pre", {}, text));
}

function call(c, result) {
  const args = c.malformed ? (c.raw || c.error || "") : fmt.json(c.arguments ?? {});
  const status = !result ? badge("no result", "warn")
    : result.is_error ? badge(result.error_kind || "error", AGENT_FAULTS.has(result.error_kind) ? "err" : "ours") : badge("ok");
  return h("li", { class: "call" },
    h("h4", {}, h("code", {}, c.name || "(malformed)"), " ", status, result ? h("span", { class: "muted" }, ` ${fmt.ms(result.ms)}`) : null,
      result && result.error_kind && !AGENT_FAULTS.has(result.error_kind) ? h("span", { class: "muted" }, " · the environment's fault: masked") : null),
    h("div", { class: "two" },
      h("div", {}, h("h5", {}, "Arguments"), h("pre", {}, args)),
      h("div", {}, h("h5", {}, result && result.is_error ? "Error" : "Result"), h("pre", {}, result ? result.text : ""))),
    result && "diff" in result ? h("div", {}, h("h5", {}, "Database change"), renderDiff(result.diff))
      : result && result.diff_error ? h("p", { class: "error" }, `diff not recorded: ${result.diff_error}`) : null);
}

// The policy's log-probability of each token it generated in this turn (what GRPO's ratio is
// taken against), drawn by position, with the mean and the least likely: where the model hesitated.
function tokenLogprobs(t) {
  const lps = (t.logprobs || []).filter((v) => typeof v === "number" && Number.isFinite(v));
  if (!lps.length) return null;
  const mean = lps.reduce((a, b) => a + b, 0) / lps.length;
  const min = Math.min(...lps);
  const unlikely = lps.filter((v) => v < Math.log(0.1)).length;
  return h("details", { class: "logprobs", "data-mean": mean.toFixed(6), "data-tokens": lps.length },
    h("summary", {}, `Token log-probs: ${lps.length} tokens, mean ${fmt.num(mean)}, lowest ${fmt.num(min)}, `
      + `${unlikely} below log 0.1`),
    lineChart([{ name: "log-prob", color: COLORS[0], points: lps.map((y, i) => ({ x: i + 1, y })) }],
      { title: `turn ${t.index + 1}: log-prob of each generated token`, xLabel: "token", width: 640, height: 160, log: false }));
}

function turn(t) {
  const byId = Object.fromEntries((t.results || []).map((r) => [r.tool_call_id, r]));
  const content = t.assistant && typeof t.assistant.content === "string" ? t.assistant.content : "";
  return h("section", { class: "turn", "aria-label": `Turn ${t.index + 1}` },
    h("h3", {}, `Turn ${t.index + 1}`, h("span", { class: "muted" }, ` · policy ${fmt.ms(t.policy_ms)} · version ${t.policy_version} · ${t.completion_tokens} tokens`)),
    content ? h("div", { class: "msg assistant" }, h("div", { class: "role" }, "assistant"), h("pre", {}, content)) : null,
    tokenLogprobs(t),
    (t.results || []).filter((r) => r.tool_call_id == null).map((r) => h("p", { class: "error format-error" },
      badge(r.error_kind || "error", "err"), ` ${r.text}`)),
    t.tool_calls.length ? h("ol", { class: "calls" }, t.tool_calls.map((c) => call(c, byId[c.id]))) : h("p", { class: "muted" }, "No tool call: the final answer."));
}

function verdict(ep) {
  const v = ep.verdict || {};
  const extra = Object.entries(v).filter(([k]) => !["verdict", "reason", "reward", "error_kind", "episode_id"].includes(k));
  const plain = extra.filter(([, value]) => value === null || typeof value !== "object");
  const nested = extra.filter(([, value]) => value !== null && typeof value === "object");  // evidence, judge
  return h("section", { class: "verdict", "aria-labelledby": "verdict-h" },
    h("h2", { id: "verdict-h" }, "Verdict ", badge(v.verdict || "none"), v.error_kind ? badge(v.error_kind, "ours") : null),
    v.reason ? h("p", { class: "reason" }, v.reason) : null,
    plain.length ? h("dl", { class: "facts" }, plain.map(([k, value]) => [h("dt", {}, k), h("dd", {}, String(value))])) : null,
    nested.map(([k, value]) => h("details", { open: true }, h("summary", {}, k === "judge" ? "Judge (reasoning, votes)" : k),
      h("pre", {}, fmt.json(value)))),
    h("h3", {}, "Reward ", h("strong", {}, fmt.num(ep.reward)), ep.masked ? badge(`masked: ${ep.mask_reason}`, "masked") : null),
    h("table", { class: "parts" }, h("caption", {}, "Reward parts"), h("tbody", {},
      Object.entries(ep.reward_components || {}).map(([k, value]) => h("tr", {}, h("th", { scope: "row" }, k), h("td", { class: "num" }, fmt.num(value)))))),
    h("h3", {}, "Database at the end"), renderCounts(ep.diff));
}

// The GRPO group as a unit: every episode sampled for the same task from the same policy, its
// reward and the advantage the learner gave it (reward minus the group's mean, over its spread).
function group(ep, runId) {
  const g = ep.group;
  if (!g || !g.episodes || g.episodes.length < 2) return null;
  return h("section", { class: "group", "aria-labelledby": "group-h" },
    h("h2", { id: "group-h" }, `GRPO group of ${g.size}`, g.step != null ? ` · trained at step ${g.step}` : " · not trained on yet"),
    h("p", { class: "muted" }, `Mean reward ${fmt.num(g.reward_mean)}. An advantage is what the learner gave the episode: `
      + "its reward against its group's; a masked episode has none."),
    h("div", { class: "table-wrap" }, h("table", { class: "group-members" },
      h("caption", {}, "Episodes of this group"),
      h("thead", {}, h("tr", {}, ["Episode", "Verdict", "Reward", "Advantage", "Turns"].map((c) => h("th", { scope: "col" }, c)))),
      h("tbody", {}, g.episodes.map((m) => h("tr", m.episode_id === ep.episode_id ? { "aria-current": "true", class: "current" } : {},
        h("td", {}, m.episode_id === ep.episode_id ? h("strong", {}, "this episode")
          : h("a", { href: `#/episode/${runId}/${m.episode_id}`, rel: "sibling" }, m.episode_id)),
        h("td", {}, badge(m.verdict || "none"), m.masked ? badge(`masked: ${m.mask_reason}`, "masked") : null),
        h("td", { class: "num" }, fmt.num(m.reward)),
        h("td", { class: "num", "data-advantage": m.advantage ?? "" }, m.advantage == null ? "–" : fmt.num(m.advantage)),
        h("td", { class: "num" }, String(m.turns ?? "–"))))))));
}

export async function render(main, [runId, episodeId]) {
  // the run's name for the breadcrumb from its (light) status; an episode still shows without it
  const [ep, run] = await Promise.all([api(`/api/runs/${runId}/episodes/${episodeId}`),
    api(`/api/runs/${runId}/status`).catch(() => null), loadVocabulary()]);
  const prompt = (ep.messages || []).slice(0, 2);
  fill(main,
    h("p", { class: "breadcrumb" }, h("a", { href: "#/runs" }, "Runs"), " / ", h("a", { href: `#/run/${runId}` }, run?.name || runId), " / ",
      ep.step != null ? [h("a", { href: `#/run/${runId}?step=${ep.step}` }, `step ${ep.step}`), " / "] : null, ep.episode_id),
    h("h1", {}, `${ep.env} · ${ep.task_id}`),
    h("nav", { class: "episode-nav", "aria-label": "Episodes" },
      ep.neighbours?.previous ? h("a", { href: `#/episode/${runId}/${ep.neighbours.previous}`, class: "button", rel: "prev" }, "← Previous episode") : null,
      ep.neighbours?.next ? h("a", { href: `#/episode/${runId}/${ep.neighbours.next}`, class: "button", rel: "next" }, "Next episode →") : null,
      h("a", { href: `#/catalog${query({ env: ep.env, task: ep.task_id })}`, class: "button" }, "The task in the catalog"),
      h("a", { href: `#/run/${runId}${query({ env: ep.env, task_id: ep.task_id })}`, class: "button" }, "All episodes of this task")),
    h("dl", { class: "cards" }, [
      ["Verdict", badge(ep.verdict?.verdict || "none")], ["Reward", fmt.num(ep.reward)], ["Stop", ep.stop_reason],
      ["Turns", ep.turns.length], ["Instance", ep.instance || "–"], ["Wall", fmt.ms(ep.timings?.wall_ms)],
    ].map(([k, v]) => h("div", { class: "card" }, h("dt", {}, k), h("dd", {}, v)))),
    ep.infra_error ? h("p", { class: "error" }, `Infrastructure: ${ep.infra_error}`) : null,
    h("h2", {}, "Prompt"), prompt.map(message),
    h("h2", {}, "Turns"), ep.turns.map(turn),
    ep.final_answer != null ? [h("h2", {}, "Final answer"), h("pre", {}, ep.final_answer)] : null,
    verdict(ep), group(ep, runId));
}
