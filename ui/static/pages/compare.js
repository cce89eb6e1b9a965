// Two runs side by side: the same summary parts for each, in two columns.
import { api, fill, h } from "../lib.js";
import { headline, perEnv, rewardCurve, throughput } from "./summary.js";

export async function render(main, [a, b]) {
  const runs = await Promise.all([api(`/api/runs/${a}`), api(`/api/runs/${b}`)]);
  fill(main, 
    h("p", {}, h("a", { href: "#/runs" }, "Runs"), " / compare"),
    h("h1", {}, `${runs[0].name} vs ${runs[1].name}`),
    h("div", { class: "two" }, runs.map((run) => h("section", { "aria-label": run.name },
      h("h2", {}, h("a", { href: `#/run/${run.id}` }, run.name)), headline(run), rewardCurve(run), throughput(run), perEnv(run)))));
}
