// The router: #/page/arg/arg?query. Each page module exports render(main, args, params) and may
// return a function that stops its timers when the page is left.
import { errorBox, fill, h } from "./lib.js";
import * as catalog from "./pages/catalog.js";
import * as runs from "./pages/runs.js";
import * as run from "./pages/run.js";
import * as compare from "./pages/compare.js";
import * as episode from "./pages/episode.js";
import * as fleet from "./pages/fleet.js";
import * as playground from "./pages/playground.js";

const PAGES = { catalog, runs, run, compare, episode, fleet, playground };
const NAV = { run: "runs", compare: "runs", episode: "runs" };
let stop = null;
let shown = null;

export function parse(hash) {
  const [path, q = ""] = (hash.replace(/^#\/?/, "") || "runs").split("?");
  const [page, ...args] = path.split("/").map(decodeURIComponent);
  return { page: PAGES[page] ? page : "runs", args, params: Object.fromEntries(new URLSearchParams(q)) };
}

async function route() {
  if (stop) { stop(); stop = null; }
  const { page, args, params } = parse(location.hash);
  const main = document.getElementById("main");
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === (NAV[page] || page)) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  if (location.hash !== shown) fill(main, h("p", { class: "muted" }, "Loading…"));  // not on a redraw
  shown = location.hash;
  try {
    stop = (await PAGES[page].render(main, args, params)) || null;
  } catch (err) {
    fill(main, errorBox(err));
  }
  document.body.dataset.ready = page;  // the browser tests wait for this
}

// In-page anchors (#main, #episodes-h) move the focus and scroll, and leave the route alone
document.addEventListener("click", (event) => {
  const link = event.target.closest && event.target.closest('a[href^="#"]:not([href^="#/"])');
  if (!link) return;
  const target = document.getElementById(link.getAttribute("href").slice(1));
  if (!target) return;
  event.preventDefault();
  if (!target.hasAttribute("tabindex")) target.setAttribute("tabindex", "-1");
  target.focus();
  target.scrollIntoView();
});

window.addEventListener("hashchange", route);
route();
