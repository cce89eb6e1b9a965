"""`awm ui` in a real headless browser: Debian's chromium driven through its chromedriver by
selenium (nothing is downloaded at run time; .ci/run installs both packages).

The data is real: a short `awm train` run of examples/train-tiny.yaml (3 steps instead of 30),
an `awm eval` of its checkpoint, and `awm ui --serve lamps` with its own local fleet on the
session's PostgreSQL, all as subprocesses through the CLI a user would type. Screenshots of every
page go to ``$AWM_UI_SCREENSHOTS`` when set (CI keeps that directory as an artifact), else to the
session's temporary directory (printed either way).

The questions a newcomer must be able to answer from the UI alone each have a test: how did my
run's loss, KL and reward move (test_run_page_*); which tasks did my model fail at evaluation and
why (test_evaluation_page_*); what changed between these three runs (test_compare_*).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

import pytest
import yaml

from tests.conftest import FIXTURES, require
from tests.test_trainer_learn import EXAMPLE, awm
from awm.ui.runs import run_id

CHROMIUM = shutil.which("chromium")
CHROMEDRIVER = shutil.which("chromedriver")
LAMPS = FIXTURES / "lamps"
WAIT_S = 30.0

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def runs(pg, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A real training run (3 steps of the tiny example) and an evaluation of its checkpoint."""
    root = tmp_path_factory.mktemp("ui-runs")
    config = yaml.safe_load(EXAMPLE.read_text())
    config.update(catalog=str(LAMPS), replicas=2, steps=3, checkpoint_every=3, run_dir=str(root / "tiny"))
    config["rollout"].update(group_size=4)
    path = root / "train-tiny-short.yaml"
    path.write_text(yaml.safe_dump(config))
    trained = awm("train", "--config", str(path), home=pg.root.parent)
    assert trained.returncode == 0, trained.stderr[-3000:]
    config.update(seed=config.get("seed", 0) + 1, steps=2, checkpoint_every=2, run_dir=str(root / "tiny-seed2"))
    path.write_text(yaml.safe_dump(config))
    again = awm("train", "--config", str(path), home=pg.root.parent)  # the third run compare shows
    assert again.returncode == 0, again.stderr[-3000:]
    evaluated = awm("eval", "--checkpoint", str(root / "tiny" / "checkpoints" / "step-000003"), "--catalog", str(LAMPS),
                    "--task", "green_on", "-k", "2", "--max-turns", "2", "--out", str(root / "eval"), home=pg.root.parent)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    return root


@pytest.fixture(scope="module")
def ui(pg, runs: Path) -> Iterator[str]:
    """`awm ui` as a user starts it, with a local fleet of lamps for the fleet page and playground."""
    environ = dict(os.environ, AWM_HOME=str(pg.root.parent))
    environ.pop("AWM_DATABASE_URL", None)
    proc = subprocess.Popen([sys.executable, "-m", "awm.cli", "ui", "--runs", str(runs), "--catalog", str(LAMPS),
                             "--serve", "lamps", "--port", "0", "--grafana-url", "http://grafana.invalid/d/awm"],
                            stderr=subprocess.PIPE, text=True, env=environ)
    assert proc.stderr is not None
    url, seen = None, []
    while url is None:
        line = proc.stderr.readline()
        if not line:
            pytest.fail("awm ui exited: " + "".join(seen)[-3000:])
        seen.append(line)
        found = re.search(r"awm ui on (http://\S+)", line)
        url = found.group(1) if found else None
    yield url
    proc.terminate()
    proc.wait(30)


@pytest.fixture(scope="module")
def shots(tmp_path_factory: pytest.TempPathFactory) -> Path:
    named = os.environ.get("AWM_UI_SCREENSHOTS")
    path = Path(named) if named else tmp_path_factory.mktemp("ui-screenshots")
    path.mkdir(parents=True, exist_ok=True)
    print(f"screenshots: {path}")
    return path


def full_shot(driver, path: Path) -> None:  # type: ignore[no-untyped-def]
    """The whole page, not only the window: the window is made as tall as the page, then restored."""
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(height, 1000), 8000))
    driver.save_screenshot(str(path))
    driver.set_window_size(1400, 1000)


# What chromedriver and Chrome get of this process's environment: no more (earlier tests of the
# session - vLLM, torch, TRL - leave variables behind). Chromium crashed at start (SIGTRAP, a
# failed CHECK) in some CI runs late in the suite: the cause was this process's umask, left at
# 0o177 by provisioner servers that narrowed it around bind (awm/postgres/provisioner.py no
# longer touches it); Chrome's profile directories were made 0600 and could not be entered.
CHROME_ENV = ("PATH", "HOME", "USER", "LOGNAME", "LANG", "LC_ALL", "TMPDIR", "TZ")


def chrome_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k in CHROME_ENV}
    if "TMPDIR" in env and not os.path.isdir(env["TMPDIR"]):  # a test's temporary directory, gone
        del env["TMPDIR"]
    return env


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    require(CHROMIUM and CHROMEDRIVER,
            "chromium and chromedriver are not installed (.ci/run installs Debian's chromium and chromium-driver)")
    from selenium import webdriver

    def options() -> Any:  # a fresh profile per attempt (a crashed start can leave its lock behind)
        opts = webdriver.ChromeOptions()
        opts.binary_location = CHROMIUM  # type: ignore[assignment]
        for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
                    f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", "--no-first-run", "--disable-extensions"):
            opts.add_argument(arg)
        opts.set_capability("goog:loggingPrefs", {"browser": "ALL"})
        return opts

    # Chromium has exited at start in some CI runs (all three attempts of the run; never by hand
    # right after). Three attempts; a failure keeps chromedriver's verbose log, and Chrome is then
    # started once by itself, so that the failure says how it exited (code or signal) and what it
    # printed, with the machine's state at that moment.
    from selenium.common.exceptions import SessionNotCreatedException

    for attempt in range(3):
        log = tmp_path_factory.mktemp("chromedriver") / "chromedriver.log"
        service = webdriver.ChromeService(executable_path=CHROMEDRIVER, service_args=["--verbose"], log_output=str(log),
                                          env=chrome_env())
        try:
            driver = webdriver.Chrome(options=options(), service=service)
            break
        except SessionNotCreatedException as exc:
            tail = log.read_text(errors="replace")[-3000:] if log.exists() else "(no chromedriver log)"
            if attempt == 2:
                raise AssertionError(f"chromium did not start three times: {exc.msg}\n"
                                     f"{_chromium_alone(options().arguments)}\nchromedriver log:\n{tail}") from None
            print(f"chromium did not start (attempt {attempt + 1}): {exc.msg}\n{tail}", file=sys.stderr)
            time.sleep(2)
    yield driver
    driver.quit()


def _chromium_alone(arguments: list[str]) -> str:
    """Chrome started without chromedriver, with its own logging: how it exited, what it printed,
    and what the machine had then (processes, memory, disk, this process's signal masks)."""
    args = [CHROMIUM, *arguments, "--enable-logging=stderr", "--v=1", "--dump-dom", "about:blank"]
    try:
        done = subprocess.run(args, capture_output=True, text=True, timeout=60, env=chrome_env())
        how = f"exit code {done.returncode}" if done.returncode >= 0 else f"signal {-done.returncode}"
        printed = (done.stderr or "")[-2000:]
    except subprocess.TimeoutExpired as exc:
        how, printed = "still running after 60 s", str(exc.stderr or "")[-2000:]
    status = Path("/proc/self/status").read_text()
    masks = " ".join(line for line in status.splitlines()
                     if line.startswith(("SigBlk", "SigIgn", "Threads", "Umask", "NoNewPrivs", "Seccomp:")))
    machine = subprocess.run("ps -eLf | wc -l; free -m; df -h /tmp /dev/shm; ulimit -a",
                             shell=True, capture_output=True, text=True).stdout
    return (f"chromium alone: {how}\npytest: {masks}\nthreads, memory, disk, limits:\n{machine}\n"
            f"this process's environment, not passed to Chrome: {sorted(set(os.environ) - set(CHROME_ENV))}\n"
            f"what it printed (its tail):\n{printed}")


def wait(predicate, what: str) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


@contextlib.contextmanager
def ui_in_thread(state: Any) -> Iterator[str]:
    """The UI's app (``build_app``, as ``awm ui`` serves it) on uvicorn in a thread of this process,
    for a test that sets what a subprocess could not (a module constant, an in-process operator):
    its URL, without the trailing slash. Stopped when the block ends."""
    import socket
    import threading

    import uvicorn

    from awm.ui.app import build_app

    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(state), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait(lambda: server.started, "the in-process UI server")
    try:
        yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()


def episode_count(driver) -> str:  # type: ignore[no-untyped-def]
    """The episode list's count line once it is drawn (the list is redrawn after the page's ready
    flag when a filter or a step changes, so look until it is there)."""
    def text() -> str:
        found = driver.find_elements("id", "episode-count")
        try:
            return found[0].text if found else ""
        except Exception:  # replaced while read (stale element): look again
            return ""
    return wait(text, "the episode count")


def open_page(driver, url: str, fragment: str, page: str) -> None:  # type: ignore[no-untyped-def]
    """Go to a page of the single-page app and wait until it has drawn (data-ready)."""
    if driver.current_url.startswith(url):
        driver.execute_script("document.body.dataset.ready = ''; if (location.hash === arguments[0]) "
                              "window.dispatchEvent(new HashChangeEvent('hashchange')); else location.hash = arguments[0];",
                              fragment)  # the same hash again (a test left the page there): draw it again
    else:
        driver.get(url + fragment)
    wait(lambda: driver.execute_script("return document.body.dataset.ready") == page, f"page {fragment}")


def severe(driver) -> list[dict[str, Any]]:  # type: ignore[no-untyped-def]
    return [e for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def episodes_of(run: Path) -> tuple[dict[str, int], list[dict[str, Any]]]:
    events = [json.loads(line) for line in (run / "trajectories.jsonl").read_text().splitlines()]
    steps = {g: e["step"] for e in events if e["event"] == "step" for g in e["groups"]}
    return steps, [e for e in events if e["event"] == "end"]


def test_every_page_loads_without_console_errors(ui, browser, runs, shots):
    train, evaluated = run_id(runs / "tiny"), run_id(runs / "eval")
    _, ended = episodes_of(runs / "tiny")
    pages = [("#/runs", "runs"), ("#/catalog", "catalog"), ("#/fleet", "fleet"), ("#/playground", "playground"),
             (f"#/run/{train}", "run"), (f"#/run/{evaluated}", "run"), (f"#/compare/{train}/{evaluated}", "compare"),
             (f"#/episode/{train}/{ended[0]['episode_id']}", "episode")]
    for fragment, page in pages:
        open_page(browser, ui, fragment, page)
        main = browser.find_element("id", "main")
        assert main.find_elements("tag name", "h1"), fragment
        assert not main.find_elements("css selector", ".error"), (fragment, main.text[:500])
        assert severe(browser) == [], fragment
        browser.save_screenshot(str(shots / f"{page}-{len(list(shots.iterdir()))}.png"))
    # what the pages say, not only that they drew
    open_page(browser, ui, "#/runs", "runs")
    assert {"tiny", "eval"} <= {a.text for a in browser.find_elements("css selector", "main table a")}
    open_page(browser, ui, "#/catalog", "catalog")
    for details in browser.find_elements("css selector", "main details:not([open])"):
        browser.execute_script("arguments[0].open = true", details)
    text = browser.find_element("id", "main").text
    assert "switch_on" in text and "green_on" in text and "gated" in text
    open_page(browser, ui, "#/fleet", "fleet")
    fleet = browser.find_element("id", "main")
    assert "lamps" in fleet.text and "ready 1" in fleet.text
    link = fleet.find_element("link text", "Grafana dashboard")
    assert link.get_attribute("href") == "http://grafana.invalid/d/awm"
    open_page(browser, ui, f"#/run/{evaluated}", "run")
    assert "pass@2" in browser.find_element("id", "main").text


def test_reward_curve_point_to_an_episode_with_its_tool_calls_and_diffs(ui, browser, runs, shots):
    steps, ended = episodes_of(runs / "tiny")
    # an episode whose first call switched a lamp on: that call changed a row of `lamps`
    chosen = next(e for e in ended if e["group_id"] in steps and e["turns"] and e["turns"][0]["results"]
                  and e["turns"][0]["results"][0]["name"] == "switch_on" and not e["turns"][0]["results"][0]["is_error"])
    step = steps[chosen["group_id"]]
    in_step = sum(1 for e in ended if steps.get(e["group_id"]) == step)
    open_page(browser, ui, f"#/run/{run_id(runs / 'tiny')}", "run")
    point = browser.find_element("css selector", f'svg a.point-link[aria-label^="step {step}: reward"]')
    browser.execute_script("document.body.dataset.ready = ''")
    point.click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "run", "the step's episodes")
    assert f"step={step}" in browser.current_url
    wait(lambda: episode_count(browser).startswith(f"{in_step} episodes match"), "the step's episode count")
    # the filter form narrows the step's episodes further, and the URL says how (shareable)
    from selenium.webdriver.support.ui import Select

    verdict = chosen["verdict"]["verdict"]
    Select(browser.find_element("name", "verdict")).select_by_value(verdict)
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element("xpath", "//form[@role='search']//button[text()='Filter']").click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "run", "the filtered episodes")
    assert f"step={step}" in browser.current_url and f"verdict={verdict}" in browser.current_url
    same = sum(1 for e in ended if steps.get(e["group_id"]) == step and e["verdict"]["verdict"] == verdict)
    wait(lambda: episode_count(browser).startswith(f"{same} episodes match"), "the filtered episode count")
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element("link text", chosen["episode_id"]).click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "episode", "the episode")
    main = browser.find_element("id", "main")
    first = main.find_elements("css selector", "li.call")[0]
    assert "switch_on" in first.text and '"color"' in first.text
    changed = first.find_elements("css selector", "table.rows tr.upd td.changed")
    assert [c.text for c in changed] == ["false → true"]  # is_on, before → after
    assert "lamps" in first.find_element("css selector", ".diff-table h5").text
    panel = main.find_element("css selector", "section.verdict")
    assert verdict in panel.text and "Reward parts" in panel.text
    assert severe(browser) == []
    browser.execute_script("arguments[0].scrollIntoView()", main.find_elements("css selector", "section.turn")[0])
    browser.save_screenshot(str(shots / "episode-diff.png"))  # docs/ui-episode.png is one of these


def test_playground_calls_a_real_instance(ui, browser, shots):
    from selenium.webdriver.support.ui import Select

    open_page(browser, ui, "#/playground", "playground")
    main = browser.find_element("id", "main")
    Select(main.find_element("name", "task")).select_by_value("green_on")
    main.find_element("xpath", "//button[text()='Reset']").click()
    wait(lambda: "green" in browser.find_element("id", "play-status").text, "the reset")
    tool = main.find_element("css selector", 'details[data-tool="switch_on"]')
    tool.find_element("tag name", "summary").click()
    tool.find_element("name", "color").send_keys("green")
    tool.find_element("xpath", ".//button[text()='Call']").click()
    call = wait(lambda: browser.find_elements("css selector", "#play-log li.call"), "the call's result")[0]
    assert [c.text for c in call.find_elements("css selector", "tr.upd td.changed")] == ["false → true"]
    tool.find_element("name", "color").clear()
    tool.find_element("name", "color").send_keys("purple")  # no such lamp: the tool's error, no change
    tool.find_element("xpath", ".//button[text()='Call']").click()
    wait(lambda: len(browser.find_elements("css selector", "#play-log li.call")) == 2, "the second call")
    assert "tool_error" in browser.find_elements("css selector", "#play-log li.call")[1].text
    main.find_element("xpath", "//button[text()='Verify']").click()
    result = wait(lambda: browser.find_elements("css selector", "#play-log .verify-result"), "the verdict")[0]
    assert "complete" in result.text and "lamps: 0 inserted, 1 updated, 0 deleted" in result.text
    assert severe(browser) == []
    browser.save_screenshot(str(shots / "playground.png"))


CONTRAST = """
const lum = (c) => { const [r, g, b] = c.slice(0, 3).map((v) => { v /= 255; return v <= 0.03928 ? v / 12.92 : ((v + 0.055) / 1.055) ** 2.4; });
  return 0.2126 * r + 0.7152 * g + 0.0722 * b; };
const rgba = (s) => { const p = s.match(/rgba?\\(([^)]+)\\)/)[1].split(",").map(Number); return p.length === 4 ? p : [...p, 1]; };
const background = (el) => { for (; el; el = el.parentElement) { const c = rgba(getComputedStyle(el).backgroundColor); if (c[3] > 0.5) return c; }
  return [255, 255, 255, 1]; };
const low = [];
for (const el of document.querySelectorAll("body *")) {
  if (el.closest("svg") || ![...el.childNodes].some((n) => n.nodeType === 3 && n.textContent.trim())) continue;
  const box = el.getBoundingClientRect(), style = getComputedStyle(el);
  if (!box.width || !box.height || style.visibility === "hidden") continue;
  const a = lum(rgba(style.color)), b = lum(background(el));
  const ratio = (Math.max(a, b) + 0.05) / (Math.min(a, b) + 0.05);
  if (ratio < 4.5) low.push(`${el.tagName} "${el.textContent.trim().slice(0, 30)}" ${ratio.toFixed(2)}`);
}
return low;
"""

UNLABELLED = """
return [...document.querySelectorAll("input, select, textarea, button")].filter((el) => {
  if (el.type === "hidden") return false;
  const label = el.id && document.querySelector(`label[for="${el.id}"]`);
  return !(label && label.textContent.trim()) && !el.getAttribute("aria-label") && !(el.tagName === "BUTTON" && el.textContent.trim());
}).map((el) => el.outerHTML.slice(0, 80));
"""


def test_accessibility_labels_contrast_and_keyboard(ui, browser, runs):
    from selenium.webdriver.common.keys import Keys

    train = run_id(runs / "tiny")
    _, ended = episodes_of(runs / "tiny")
    for fragment, page in [("#/runs", "runs"), ("#/catalog", "catalog"), ("#/fleet", "fleet"),
                           ("#/playground", "playground"), (f"#/run/{train}", "run"), (f"#/run/{train}?step=2", "run"),
                           (f"#/run/{run_id(runs / 'eval')}", "run"), ("#/catalog?env=lamps&task=green_on", "catalog"),
                           (f"#/compare/{train}/{run_id(runs / 'tiny-seed2')}/{run_id(runs / 'eval')}", "compare"),
                           (f"#/episode/{train}/{ended[-1]['episode_id']}", "episode")]:
        open_page(browser, ui, fragment, page)
        for details in browser.find_elements("css selector", "details:not([open])"):  # hidden forms too
            browser.execute_script("arguments[0].open = true", details)
        assert browser.execute_script(UNLABELLED) == [], fragment
        assert browser.execute_script(CONTRAST) == [], fragment
    # keyboard only: the skip link first, then through the page to a reward-curve point, Enter
    browser.get("about:blank")
    open_page(browser, ui, f"#/run/{train}", "run")
    body = browser.find_element("tag name", "body")
    body.send_keys(Keys.TAB)
    assert browser.switch_to.active_element.text == "Skip to content"
    for _ in range(100):
        active = browser.switch_to.active_element
        if "point-link" in (active.get_attribute("class") or ""):
            break
        active.send_keys(Keys.TAB)
    else:
        pytest.fail("no reward-curve point reachable with the Tab key")
    label = active.get_attribute("aria-label")
    assert label.startswith("step 1: reward")
    browser.execute_script("document.body.dataset.ready = ''")
    active.send_keys(Keys.ENTER)
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "run", "the step's episodes")
    assert "step=1" in browser.current_url


def test_a_foreign_page_cannot_drive_the_ui(ui):
    """DNS-rebinding protection, as the env servers have it (awm.envserver.hostguard): a page on
    another origin, or a request for another host name, is refused before the playground."""
    import httpx

    with httpx.Client(base_url=ui) as client:
        assert client.get("/api/fleet").status_code == 200
        assert client.get("/api/fleet", headers={"Host": "evil.example"}).status_code == 421
        refused = client.post("/api/playground/any/open", headers={"Origin": "http://evil.example"})
        assert refused.status_code == 403
        assert client.post("/api/playground/nobody/open", headers={"Origin": ui.rstrip("/")}).status_code == 404


def test_a_big_runs_page_draws_before_its_index_is_built(browser, runs, tmp_path, monkeypatch):
    """A run whose log is too big to index within a request (here: every run) draws its numbers
    and curves at once, says that it is indexing, and lists its episodes when the index is built.
    The server runs in process to set that threshold; the rest is the same app."""
    import awm.ui.runs
    from awm.ui.app import UiState
    from awm.ui.runs import Runs

    monkeypatch.setattr(awm.ui.runs, "SYNC_BYTES", 0)
    monkeypatch.setenv("AWM_HOME", str(tmp_path / "home"))  # no index yet
    with ui_in_thread(UiState(Runs([runs]))) as url:
        open_page(browser, url + "/", f"#/run/{run_id(runs / 'tiny')}", "run")
        main = browser.find_element("id", "main")
        assert "Indexing the episodes" in main.text and main.find_elements("css selector", "svg a.point-link")
        count = wait(lambda: browser.find_elements("id", "episode-count"), "the episode list")[0]
        assert count.text.startswith(f"{len(episodes_of(runs / 'tiny')[1])} episodes match")
        assert severe(browser) == []


def metric_rows(run: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def hover(driver, panel, step: int, first: int, last: int) -> None:  # type: ignore[no-untyped-def]
    """Move the mouse over a panel at a step's x (the real pointer, through ActionChains)."""
    from selenium.webdriver.common.action_chains import ActionChains

    overlay = panel.find_element("css selector", "rect.overlay")
    width = overlay.rect["width"]
    offset = ((step - first) / max(1, last - first) - 0.5) * width * 0.999
    ActionChains(driver).move_to_element_with_offset(overlay, int(offset), 0).perform()


def readout_value(panel, name: str) -> float:  # type: ignore[no-untyped-def]
    text = panel.find_element("css selector", ".readout").text
    found = re.search(rf"{re.escape(name)} (-?[\d.]+(?:e[-+]?\d+)?)", text)
    assert found, (name, text)
    return float(found.group(1))


def test_run_page_answers_how_loss_kl_and_reward_moved(ui, browser, runs, shots):
    """Every logged metric can be drawn; loss, KL and reward are by default; hovering one panel
    shows the exact value at that step in every panel; the chooser, smoothing, the configuration
    and a highlighted step with its episodes."""
    train = run_id(runs / "tiny")
    metrics = metric_rows(runs / "tiny")
    open_page(browser, ui, "#/runs", "runs")
    browser.execute_script("localStorage.removeItem('awm-ui-metrics')")  # the default choice
    open_page(browser, ui, f"#/run/{train}", "run")
    panels = {p.get_attribute("data-metric"): p for p in browser.find_elements("css selector", "figure.panel")}
    assert {"reward_mean", "success_rate", "loss", "grad_norm", "clip_fraction"} <= set(panels)
    # the tiny example trains with kl_coef 0: no reference model, so its learner logs kl as null
    # (not computed), never 0.0, and the page draws no KL (runs logged before say why, #not-computed)
    assert json.loads((runs / "tiny" / "config.json").read_text())["grpo"]["kl_coef"] == 0
    assert all(m.get("kl") is None for m in metrics)
    assert "kl" not in panels
    metrics_section = browser.find_element("css selector", "section.metrics").text
    assert "null" not in metrics_section.split() and "undefined" not in metrics_section.split()
    logged = {k for m in metrics for k, v in m.items() if isinstance(v, (int, float)) and k != "step"}
    boxes = {b.get_attribute("value") for b in browser.find_elements("css selector", "input[name=metric]")}
    assert logged - {"kl"} <= boxes and "kl" not in boxes, logged - boxes  # every number a step computed can be chosen
    first, last = metrics[0]["step"], metrics[-1]["step"]
    for record in metrics:
        hover(browser, panels["loss"], record["step"], first, last)
        for key in ("loss", "reward_mean"):
            if record.get(key) is None:
                continue
            name = {"loss": "loss", "reward_mean": "reward (mean)"}[key]
            readout = panels[key].find_element("css selector", ".readout").text
            assert readout.startswith(f"step {record['step']}:"), readout  # the crosshair is shared
            assert readout_value(panels[key], name) == pytest.approx(record[key], rel=1e-5, abs=1e-9)
    assert panels["loss"].find_element("css selector", ".tooltip").is_displayed()
    # the chooser hides and shows any metric; smoothing draws the raw line faintly behind
    chooser = browser.find_element("css selector", "details.chooser")
    chooser.find_element("tag name", "summary").click()
    box = browser.find_element("id", "metric-grad_norm")
    box.click()
    assert not browser.find_elements("css selector", 'figure.panel[data-metric="grad_norm"]')
    box.click()
    assert browser.find_elements("css selector", 'figure.panel[data-metric="grad_norm"]')
    browser.execute_script("const r = document.getElementById('smoothing'); r.value = '0.6'; r.dispatchEvent(new Event('input'));")
    assert browser.find_elements("css selector", 'figure.panel[data-metric="loss"] polyline.raw')
    browser.execute_script("const r = document.getElementById('smoothing'); r.value = '0'; r.dispatchEvent(new Event('input'));")
    config = browser.find_element("css selector", "section[aria-labelledby=config-h]").text
    assert "steps" in config and "group_size" in config and "lamps" in config
    full_shot(browser, shots / "run-metrics.png")
    # a step highlighted: marked on every panel, its values listed, its episodes below
    steps, ended = episodes_of(runs / "tiny")
    open_page(browser, ui, f"#/run/{train}?step=2", "run")
    drawn = browser.find_elements("css selector", "figure.panel svg")
    assert drawn and all(svg.find_elements("css selector", "line.highlight") for svg in drawn)
    assert "Step 2" in browser.find_element("css selector", ".callout").text
    in_step = sum(1 for e in ended if steps.get(e["group_id"]) == 2)
    wait(lambda: episode_count(browser).startswith(f"{in_step} episodes match"), "the step's episodes")
    assert severe(browser) == []


def test_run_page_charts_zoom_change_their_x_axis_expand_and_download(ui, browser, runs, shots):
    """The W&B chart controls (issue 48): a drag across a chart zooms every chart to that x range
    (reset by one button); the x axis can be the step, the elapsed time or the episodes run; a
    panel expands to the page's width; each panel downloads as CSV (its exact values) and SVG."""
    import urllib.parse

    from selenium.webdriver.common.action_chains import ActionChains

    train = run_id(runs / "tiny")
    metrics = metric_rows(runs / "tiny")
    open_page(browser, ui, "#/runs", "runs")
    browser.execute_script("localStorage.removeItem('awm-ui-metrics')")
    open_page(browser, ui, f"#/run/{train}", "run")
    assert not browser.find_element("id", "reset-zoom").is_displayed()  # nothing zoomed yet
    loss = browser.find_element("css selector", 'figure.panel[data-metric="loss"]')
    # CSV (made on click): the step and the loss of every step that logged one, exactly
    loss.find_element("css selector", "a.csv").click()
    href = loss.find_element("css selector", "a.csv").get_attribute("href")
    assert href.startswith("data:text/csv") and loss.find_element("css selector", "a.csv").get_attribute("download") == "loss.csv"
    lines = urllib.parse.unquote(href.split(",", 1)[1]).splitlines()
    assert lines[0] == "step,loss"
    assert [(int(a), float(b)) for a, b in (line.split(",") for line in lines[1:])] == [
        (m["step"], pytest.approx(m["loss"])) for m in metrics if m.get("loss") is not None]
    svg = loss.find_element("css selector", "a.svg")
    svg.click()  # the data URL is made on click (the download itself is the browser's)
    assert svg.get_attribute("href").startswith("data:image/svg+xml") and svg.get_attribute("download") == "loss.svg"
    # a drag from the first step to the second: every panel shows steps 1-2 only
    overlay = loss.find_element("css selector", "rect.overlay")
    width = overlay.rect["width"]
    first, last = metrics[0]["step"], metrics[-1]["step"]
    at = lambda step: int(((step - first) / max(1, last - first) - 0.5) * width * 0.98)  # noqa: E731
    ActionChains(browser).move_to_element_with_offset(overlay, at(first), 0).click_and_hold() \
        .move_to_element_with_offset(overlay, at(first + 1), 0).release().perform()
    wait(lambda: browser.find_element("id", "reset-zoom").is_displayed(), "the reset button")
    for panel in browser.find_elements("css selector", "figure.panel"):
        ticks = [t.text for t in panel.find_elements("css selector", "svg text.tick[text-anchor=middle]")]
        assert ticks and {int(t) for t in ticks} <= {first, first + 1}, (panel.get_attribute("data-metric"), ticks)
    assert browser.execute_script("return document.body.dataset.ready") == "run"  # a drag is not a click
    browser.find_element("id", "reset-zoom").click()
    assert not browser.find_element("id", "reset-zoom").is_displayed()
    # the x axis: elapsed time (minutes) and the episodes run, each point still its step
    choice = browser.find_element("id", "x-axis")
    assert {o.get_attribute("value") for o in choice.find_elements("tag name", "option")} == {"step", "elapsed", "episodes"}
    browser.execute_script("const s = arguments[0]; s.value = 'episodes'; s.dispatchEvent(new Event('change'));", choice)
    loss = browser.find_element("css selector", 'figure.panel[data-metric="loss"]')
    assert "episodes run" in loss.text
    loss.find_element("css selector", "a.csv").click()
    lines = urllib.parse.unquote(loss.find_element("css selector", "a.csv").get_attribute("href").split(",", 1)[1]).splitlines()
    assert lines[0] == "episodes run,step,loss"
    running = 0
    expected = []
    for m in metrics:
        running += m.get("episodes") or 0
        if m.get("loss") is not None:
            expected.append((running, m["step"]))
    assert [(int(a), int(b)) for a, b, _ in (line.split(",") for line in lines[1:])] == expected
    browser.execute_script("const s = document.getElementById('x-axis'); s.value = 'step'; s.dispatchEvent(new Event('change'));")
    # a panel across the page's width, and back
    loss = browser.find_element("css selector", 'figure.panel[data-metric="loss"]')
    small = loss.rect["width"]
    loss.find_element("xpath", ".//button[text()='Expand']").click()
    loss = browser.find_element("css selector", 'figure.panel[data-metric="loss"]')
    assert "expanded" in loss.get_attribute("class") and loss.rect["width"] > 1.5 * small
    full_shot(browser, shots / "run-expanded-panel.png")
    loss.screenshot(str(shots / "section-expanded-panel.png"))
    loss.find_element("xpath", ".//button[text()='Shrink']").click()
    assert severe(browser) == []


def test_run_page_answers_how_reward_was_distributed_at_each_step(ui, browser, runs, shots):
    """"How was reward distributed at step N" (issue 48): a stacked column per step of the
    learner's `reward_distribution` (unmasked episodes by reward), each segment's count and share
    exact, a column one click from that step's episodes."""
    train = run_id(runs / "tiny")
    metrics = [m for m in metric_rows(runs / "tiny") if m.get("reward_distribution")]
    assert metrics, "the tiny run logged reward distributions"
    open_page(browser, ui, f"#/run/{train}", "run")
    section = browser.find_element("css selector", "section.reward-distribution")
    for record in metrics:
        segments = section.find_elements("css selector", f"rect[data-x='{record['step']}']")
        counts = {r.get_attribute("data-value"): int(r.get_attribute("data-count")) for r in segments}
        assert counts == record["reward_distribution"], (record["step"], counts)
        total = sum(counts.values())
        for r in segments:
            assert float(r.get_attribute("data-share")) == pytest.approx(int(r.get_attribute("data-count")) / total, abs=1e-4)
    full_shot(browser, shots / "run-reward-distribution.png")
    section.screenshot(str(shots / "section-reward-distribution.png"))
    step = metrics[-1]["step"]
    browser.execute_script("document.body.dataset.ready = ''")
    browser.execute_script("arguments[0].dispatchEvent(new MouseEvent('click', {bubbles: true}))",
                           section.find_element("css selector", f"rect[data-x='{step}']"))
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "run", "the step's page")
    assert browser.current_url.endswith(f"step={step}")
    assert severe(browser) == []


def test_evaluation_page_answers_which_tasks_failed_and_why(ui, browser, runs, shots):
    report = json.loads((runs / "eval" / "eval.json").read_text())
    evaluated = run_id(runs / "eval")
    open_page(browser, ui, "#/runs", "runs")
    row = browser.find_element("xpath", "//main//tr[td/a[text()='eval']]")
    assert f"pass@1 {100 * report['overall']['pass@1']:.1f}%" in row.text  # not "0 / –"
    open_page(browser, ui, f"#/run/{evaluated}", "run")
    main = browser.find_element("id", "main")
    assert report["model"] in main.text and "No training steps" not in main.text
    tasks = browser.find_element("css selector", "section[aria-labelledby=tasks-h]")
    for task in report["tasks"]:
        line = tasks.find_element("xpath", f".//tr[td/a/code[text()='{task['task_id']}']]")
        assert f"{100 * task['pass_at_1']:.1f}%" in line.text
    _, ended = episodes_of(runs / "eval")
    failed = [e for e in ended if not e["masked"] and e["verdict"].get("verdict") != "complete"]
    if failed:  # how they failed, with the first one a click away
        assert any(f"{failed[0]['verdict'].get('verdict')} ×" in b.text for b in tasks.find_elements("css selector", ".badge"))
        browser.execute_script("document.body.dataset.ready = ''")
        tasks.find_element("link text", "first failure").click()
        wait(lambda: browser.execute_script("return document.body.dataset.ready") == "episode", "the first failure")
        assert browser.find_element("css selector", "section.verdict h2").text.split()[1] != "complete"
    else:
        assert not tasks.find_elements("link text", "first failure")
    open_page(browser, ui, f"#/run/{evaluated}", "run")
    full_shot(browser, shots / "eval-per-task.png")
    # what produced the numbers, and the training run and step it evaluated (issue 48)
    config = browser.find_element("css selector", "section[aria-labelledby=config-h]").text
    settings = report["settings"]
    assert settings["max_turns"] == 2 and "max_turns" in config and settings["date"] in config and "temperature" in config
    origin = browser.find_element("id", "evaluated-run")
    assert origin.text == "the checkpoint of step 3 of tiny"
    browser.execute_script("document.body.dataset.ready = ''")
    origin.find_element("link text", "tiny").click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "run", "the trained run")
    assert browser.current_url.endswith(f"#/run/{run_id(runs / 'tiny')}?step=3")
    # the training run draws pass@1 over its evaluated checkpoints, each a link to its evaluation
    section = browser.find_element("css selector", "section.over-checkpoints")
    assert "1 evaluation of this run's checkpoints" in section.text
    row = section.find_element("xpath", f".//tr[td/a[@href='#/run/{evaluated}']]")
    assert row.text.split()[0] == "3" and f"{100 * report['overall']['pass@1']:.1f}%" in row.text
    full_shot(browser, shots / "run-over-checkpoints.png")
    section.screenshot(str(shots / "section-over-checkpoints.png"))
    assert severe(browser) == []


def test_compare_three_runs_shows_what_changed(ui, browser, runs, shots):
    names = ["tiny", "tiny-seed2", "eval"]
    open_page(browser, ui, "#/runs", "runs")
    for name in names:
        browser.find_element("css selector", f'input[aria-label="compare {name}"]').click()
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element("xpath", "//button[text()='Compare selected']").click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "compare", "the comparison")
    main = browser.find_element("id", "main")
    assert main.find_element("tag name", "h1").text == "Compare 3 runs"
    baseline = browser.find_element("xpath", "//main//thead//th[contains(., '(baseline)')]").text.split(" (")[0]
    order = [baseline] + [n for n in names if n != baseline]
    last = {n: metric_rows(runs / n)[-1]["reward_mean"] for n in ("tiny", "tiny-seed2")}
    row = browser.find_element("xpath", "//main//tr[td[1][text()='Reward, last step']]")
    if baseline in last:  # the other training run's cell says its difference to the baseline
        other = next(n for n in last if n != baseline)
        cells = row.find_elements("tag name", "td")
        cell = cells[1 + order.index(other)].text
        diff = last[other] - last[baseline]
        assert ("±0" in cell) if abs(diff) < 1e-12 else (("+" if diff > 0 else "−") in cell), cell
        if abs(diff) >= 1e-12:  # a higher reward is better, whatever the sign of the difference
            judged = cells[1 + order.index(other)].find_element("css selector", ".delta").get_attribute("class")
            assert judged == f"delta {'better' if diff > 0 else 'worse'}", (judged, diff)
    # the training runs overlaid on shared axes, one line per run
    reward = main.find_element("css selector", 'figure.panel[data-metric="reward_mean"]')
    assert len(reward.find_elements("css selector", "polyline.series")) == 2
    keys = [k.text for k in reward.find_elements("css selector", ".chart-head .key")]
    assert {"tiny", "tiny-seed2"} <= set(keys)
    table = main.find_element("css selector", "section[aria-labelledby=task-diff-h] table")
    assert "green_on" in table.text and "Largest change from the baseline" in table.text
    full_shot(browser, shots / "compare-three.png")
    assert severe(browser) == []


RICH_SCHEMA = {
    "type": "object", "required": ["name", "count", "address"],
    "properties": {
        "name": {"type": "string", "description": "a contact id"},
        "count": {"type": "integer", "minimum": 1},
        "status": {"anyOf": [{"enum": ["open", "closed"], "type": "string"}, {"type": "null"}], "default": None},
        "kind": {"$ref": "#/$defs/Kind"},
        "since": {"anyOf": [{"type": "string"}, {"type": "null"}], "default": None},
        "limit": {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None},
        "tags": {"type": "array", "items": {"type": "string"}},
        "address": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
        "archived": {"anyOf": [{"type": "boolean"}, {"type": "null"}], "default": None},
        "extra": {"description": "anything"},
    },
    "$defs": {"Kind": {"enum": ["a", "b"], "type": "string"}},
}

MOUNT_FORMS = """
const [schemas, done] = [arguments[0], arguments[arguments.length - 1]];
import("/static/schemaform.js").then(({ schemaForm }) => {
  window.__args = schemas.map(() => null);
  const box = document.createElement("div");
  box.id = "sf-test";
  schemas.forEach((schema, i) => {
    const holder = document.createElement("div");
    holder.dataset.form = String(i);
    holder.append(schemaForm(schema, (read) => { window.__args[i] = read(); }));
    box.append(holder);
  });
  document.getElementById("main").append(box);
  done(true);
});
"""


def test_playground_forms_are_typed_from_the_json_schema(ui, browser, shots):
    """The form of a schema with every kind of field: optional fields start empty (not null),
    enums are dropdowns (optional ones too, through anyOf and $ref), numbers are checked, arrays
    are lists of typed items, objects nested fields; errors appear at their field and no call is
    made. Then every tool of the starter catalog: no control starts as "null", every enum has a
    dropdown."""
    from selenium.webdriver.support.ui import Select

    from awm import catalog

    open_page(browser, ui, "#/playground", "playground")
    assert browser.execute_async_script(MOUNT_FORMS, [RICH_SCHEMA])
    form = browser.find_element("css selector", '#sf-test [data-form="0"] form')
    controls = form.find_elements("css selector", "input, select, textarea")
    assert all((c.get_attribute("value") or "") != "null" for c in controls)
    assert Select(form.find_element("name", "status")).first_selected_option.text == "(unset)"
    assert [o.text for o in Select(form.find_element("name", "kind")).options] == ["(unset)", "a", "b"]
    assert form.find_element("name", "count").get_attribute("type") == "number"
    assert [o.text for o in Select(form.find_element("name", "archived")).options] == ["(unset)", "true", "false"]
    form.find_element("xpath", ".//button[text()='Call']").click()
    def error_of(name: str) -> str:
        control = form.find_element("name", name)
        return form.find_element("id", control.get_attribute("aria-describedby").split()[0]).text
    assert error_of("name") == "Required." and error_of("count") == "Required." and error_of("city") == "Required."
    assert form.find_element("name", "name").get_attribute("aria-invalid") == "true"
    first_bad = form.find_elements("css selector", "[aria-invalid='true']")[0]  # in the form's order
    assert browser.switch_to.active_element == first_bad  # the first bad field has the focus
    assert browser.execute_script("return window.__args[0]") is None  # no call was made
    form.find_element("name", "name").send_keys("Q-00006")  # the issue's example: a plain string, no JSON
    form.find_element("name", "count").send_keys("0")
    form.find_element("name", "city").send_keys("Lyon")
    form.find_element("name", "extra").send_keys("{not json")
    form.find_element("xpath", ".//button[text()='Call']").click()
    assert error_of("count") == "At least 1." and error_of("extra").startswith("Not JSON")
    assert error_of("name") == "" and form.find_element("name", "name").get_attribute("aria-invalid") is None
    form.find_element("name", "count").clear()
    form.find_element("name", "count").send_keys("2")
    form.find_element("name", "extra").clear()
    form.find_element("name", "extra").send_keys('{"x": [1]}')
    Select(form.find_element("name", "status")).select_by_visible_text("closed")
    Select(form.find_element("name", "archived")).select_by_visible_text("false")
    add = form.find_element("xpath", ".//button[text()='Add tags item']")
    add.click()
    add.click()
    form.find_element("name", "tags-0").send_keys("vip")
    form.find_element("name", "tags-1").send_keys("new")
    form.find_element("xpath", ".//button[text()='Call']").click()
    args = browser.execute_script("return window.__args[0]")
    assert args == {"name": "Q-00006", "count": 2, "status": "closed", "tags": ["vip", "new"],
                    "address": {"city": "Lyon"}, "archived": False, "extra": {"x": [1]}}
    browser.execute_script("arguments[0].scrollIntoView()", form)
    browser.save_screenshot(str(shots / "playground-typed-form.png"))
    # the starter catalog's 348 parameters, 161 of them optional
    schemas = [t.input_schema for b in catalog.load("starter", None) for t in b.tools]
    browser.execute_script("document.getElementById('sf-test').remove()")
    assert browser.execute_async_script(MOUNT_FORMS, schemas)
    found = browser.execute_script("""
      const out = { nulls: [], enumsWithoutSelect: [], numbersAsText: [] };
      document.querySelectorAll('#sf-test input, #sf-test select, #sf-test textarea').forEach((c) => {
        if (c.value === 'null') out.nulls.push(c.name); });
      return out;""")
    assert found["nulls"] == []
    for i, schema in enumerate(schemas):
        holder = browser.find_element("css selector", f'#sf-test [data-form="{i}"]')
        for name, prop in (schema.get("properties") or {}).items():
            variants = prop.get("anyOf") or [prop]
            kinds = {v.get("type") for v in variants} - {"null"}
            if not (kinds <= {"integer", "number", "string"}):
                continue  # arrays are item lists (no control of their own name), booleans checked above
            control = holder.find_element("name", name)
            if any("enum" in v for v in variants):
                assert control.tag_name == "select", (i, name)
            elif kinds <= {"integer", "number"}:
                assert control.get_attribute("type") == "number", (i, name)
            elif kinds == {"string"}:
                default = prop.get("default")  # a default is shown; no default (or None) leaves it empty
                assert control.tag_name in ("input", "textarea"), (i, name)
                assert control.get_attribute("value") == ("" if default is None else str(default)), (i, name)
    assert severe(browser) == []


def holder_of(ui: str, name: str) -> str | None:
    import httpx

    return next(i["holder"] for i in httpx.get(ui + "api/fleet").json()["instances"] if i["name"] == name)


def test_the_playground_releases_its_instance_when_the_page_is_left(ui, browser):
    from selenium.webdriver.support.ui import Select

    open_page(browser, ui, "#/playground", "playground")
    name = Select(browser.find_element("name", "instance")).first_selected_option.text
    wait(lambda: holder_of(ui, name) == "playground", "the instance held")
    open_page(browser, ui, "#/runs", "runs")  # another page of the UI
    wait(lambda: holder_of(ui, name) is None, "the release on leaving the page")
    open_page(browser, ui, "#/playground", "playground")
    wait(lambda: holder_of(ui, name) == "playground", "the instance held again")
    browser.get("about:blank")  # the tab navigates away: the pagehide beacon
    wait(lambda: holder_of(ui, name) is None, "the release by the pagehide beacon")


def test_no_page_scrolls_sideways(ui, browser, runs):
    """Wide database changes, long paths and tables stay inside the window, at 1400 and 800 px."""
    train = run_id(runs / "tiny")
    _, ended = episodes_of(runs / "tiny")
    try:
        for width in (1400, 800):
            browser.set_window_size(width, 1000)
            for fragment, page in [("#/runs", "runs"), (f"#/run/{train}", "run"), ("#/catalog", "catalog"),
                                   (f"#/episode/{train}/{ended[0]['episode_id']}", "episode"), ("#/playground", "playground"),
                                   (f"#/compare/{train}/{run_id(runs / 'tiny-seed2')}/{run_id(runs / 'eval')}", "compare")]:
                open_page(browser, ui, fragment, page)
                wide = browser.execute_script(
                    "return document.documentElement.scrollWidth - document.documentElement.clientWidth")
                assert wide <= 0, (width, fragment, wide)
    finally:
        browser.set_window_size(1400, 1000)


def test_episode_neighbours_and_its_task_in_the_catalog(ui, browser, runs, shots):
    train = run_id(runs / "tiny")
    _, ended = episodes_of(runs / "tiny")
    open_page(browser, ui, f"#/episode/{train}/{ended[1]['episode_id']}", "episode")
    assert browser.find_element("css selector", "a[rel=prev]").get_attribute("href").endswith(ended[0]["episode_id"])
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element("css selector", "a[rel=next]").click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "episode", "the next episode")
    assert browser.current_url.endswith(ended[2]["episode_id"])
    browser.execute_script("document.body.dataset.ready = ''")
    browser.find_element("link text", "The task in the catalog").click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "catalog", "the task")
    task = browser.find_element("id", f"task-{ended[2]['env']}-{ended[2]['task_id']}")
    assert task.get_attribute("open") is not None and ended[2]["instruction"] in task.text
    # the catalog is one environment at a time, gate records once per environment
    assert len(browser.find_elements("css selector", "section[aria-label^='Gate records']")) == 1
    assert browser.execute_script("return document.documentElement.scrollHeight") < 3000
    full_shot(browser, shots / "catalog-task.png")
    assert severe(browser) == []


def test_runs_list_shows_differing_settings_and_searches_sorts_and_filters(ui, browser, runs, shots):
    """The runs list as W&B's runs table (issue 48): the settings that differ between the runs are
    columns (the two training runs differ in their seed), and the list searches, sorts by any
    column and filters by kind and state."""
    open_page(browser, ui, "#/runs", "runs")
    count = browser.find_element("id", "runs-count").text
    assert count.startswith("3 of 3 runs") and "seed" in count, count
    seed = browser.find_element("css selector", "button.sort[data-sort='hyper:seed']")
    seeds = {json.loads((runs / name / "config.json").read_text())["seed"] for name in ("tiny", "tiny-seed2")}
    seed.click()
    names = [a.text for a in browser.find_elements("css selector", "main tbody tr td:nth-child(2) a")]
    assert names[:2] == ["tiny", "tiny-seed2"] if min(seeds) == json.loads((runs / "tiny" / "config.json").read_text())["seed"] \
        else names[:2] == ["tiny-seed2", "tiny"]
    assert names[-1] == "eval"  # no seed: last, whichever the direction
    browser.find_element("css selector", "button.sort[data-sort='hyper:seed']").click()
    again = [a.text for a in browser.find_elements("css selector", "main tbody tr td:nth-child(2) a")]
    assert again[:2] == names[:2][::-1] and again[-1] == "eval"
    browser.execute_script("const s = document.getElementById('runs-kind'); s.value = 'eval'; s.dispatchEvent(new Event('change'));")
    assert [a.text for a in browser.find_elements("css selector", "main tbody tr td:nth-child(2) a")] == ["eval"]
    browser.execute_script("const s = document.getElementById('runs-kind'); s.value = ''; s.dispatchEvent(new Event('change'));")
    search = browser.find_element("id", "runs-search")
    search.send_keys("seed2")
    assert [a.text for a in browser.find_elements("css selector", "main tbody tr td:nth-child(2) a")] == ["tiny-seed2"]
    search.clear()
    search.send_keys(f"seed={max(seeds)}")
    assert len(browser.find_elements("css selector", "main tbody tr")) == 1
    full_shot(browser, shots / "runs-list.png")
    assert severe(browser) == []


def test_an_episode_shows_its_grpo_group_with_rewards_and_advantages(ui, browser, runs, shots):
    """"What did this group's episodes do and what advantage did each get" (issue 48): the episode
    page lists its GRPO group - every sibling, its verdict, reward and the advantage the learner
    gave it (from the step line the trainer wrote) - and a sibling is one click away."""
    train = run_id(runs / "tiny")
    steps, ended = episodes_of(runs / "tiny")
    events = [json.loads(line) for line in (runs / "tiny" / "trajectories.jsonl").read_text().splitlines()]
    advantages = {k: v for e in events if e["event"] == "step" for k, v in (e.get("advantages") or {}).items()}
    trained = [e for e in ended if e.get("group_id") in steps and not e.get("masked")]
    assert trained and advantages, "the tiny run trained on groups and recorded their advantages"
    first = trained[0]
    siblings = [e for e in ended if e.get("group_id") == first["group_id"]]
    assert len(siblings) == 4  # the run's group_size
    # the step that trained on it lists its groups as units, each episode a link with its advantage
    step = steps[first["group_id"]]
    open_page(browser, ui, f"#/run/{train}?step={step}", "run")
    wait(lambda: browser.find_elements("css selector", "section.step-groups table"), "the step's groups")
    table = browser.find_element("css selector", "section.step-groups table")
    in_step = {e["group_id"] for e in ended if steps.get(e.get("group_id")) == step}
    assert len(table.find_elements("css selector", "tbody tr")) == len(in_step)
    links = table.find_elements("css selector", f"a[href$='{first['episode_id']}']")
    assert len(links) == 1
    assert float(links[0].get_attribute("data-advantage")) == pytest.approx(advantages[first["episode_id"]])
    open_page(browser, ui, f"#/episode/{train}/{first['episode_id']}", "episode")
    section = browser.find_element("css selector", "section.group")
    assert f"GRPO group of 4 · trained at step {steps[first['group_id']]}" in section.text
    rows = section.find_elements("css selector", "tbody tr")
    assert len(rows) == 4 and len(section.find_elements("css selector", "tr[aria-current=true]")) == 1
    shown = [row.find_element("css selector", "td[data-advantage]").get_attribute("data-advantage") for row in rows]
    assert sorted(float(a) for a in shown if a) == sorted(advantages[e["episode_id"]] for e in siblings
                                                          if e["episode_id"] in advantages)
    assert shown.count("") == sum(e["episode_id"] not in advantages for e in siblings)  # masked: none
    full_shot(browser, shots / "episode-group.png")
    section.screenshot(str(shots / "section-episode-group.png"))
    other = next(e for e in siblings if e["episode_id"] != first["episode_id"])
    browser.execute_script("document.body.dataset.ready = ''")
    section.find_element("css selector", f"a[href$='{other['episode_id']}']").click()
    wait(lambda: browser.execute_script("return document.body.dataset.ready") == "episode", "the sibling")
    assert browser.current_url.endswith(other["episode_id"])
    current = browser.find_element("css selector", "section.group tr[aria-current=true]")
    assert "this episode" in current.text
    assert severe(browser) == []


def test_an_episode_draws_each_turns_token_log_probs(ui, browser, runs, shots):
    """Per-token log-probs in the episode view (issue 48): each turn whose tokens' log-probs the
    policy returned (what GRPO's ratio is taken against) shows them by position, with their
    count, mean and lowest value."""
    train = run_id(runs / "tiny")
    _, ended = episodes_of(runs / "tiny")
    episode = next(e for e in ended if any(t.get("logprobs") for t in e["turns"]))
    open_page(browser, ui, f"#/episode/{train}/{episode['episode_id']}", "episode")
    shown = browser.find_elements("css selector", "details.logprobs")
    with_lps = [t for t in episode["turns"] if t.get("logprobs")]
    assert len(shown) == len(with_lps)
    for element, t in zip(shown, with_lps):
        lps = [v for v in t["logprobs"] if v is not None and math.isfinite(v)]
        assert int(element.get_attribute("data-tokens")) == len(lps)
        assert float(element.get_attribute("data-mean")) == pytest.approx(sum(lps) / len(lps), abs=1e-5)
    shown[0].find_element("tag name", "summary").click()
    assert shown[0].find_element("css selector", "svg polyline.series").is_displayed()
    full_shot(browser, shots / "episode-logprobs.png")
    assert severe(browser) == []


def test_fleet_page_answers_what_my_campaign_is_doing_in_the_cluster(browser, runs, tmp_path, monkeypatch, shots):
    """What the chart's UI shows (`awm ui --operator-url URL --namespace NS`): each Campaign of the
    namespace with its phase, step, reward, throughput and its fleet's instances, and each
    EnvFleet with its counts and why it is not ready, from the operator's lists; a campaign whose
    run directory the UI reads links to its run page. The operator's API runs in process here
    over a stand-in for the API server's lists (tests/test_campaign_e2e.py lists real Campaigns and
    fleets through a real operator and API server)."""
    import asyncio
    import threading

    from awm.ui.app import UiState
    from awm.ui.fleet import FleetView
    from awm.ui.runs import Runs
    from awm_operator.api import bound_port, build_api, serve
    from awm_operator.config import OperatorConfig
    from awm_operator.reconcile import Context
    from tests.operator_fakes import operator_fleet

    campaign = {"metadata": {"name": "tiny", "namespace": "ns", "uid": "u1", "creationTimestamp": "2026-11-26T10:00:00Z"},
                "spec": {"mode": "training", "environments": ["crm", "bike_shop"], "training": {"groupSize": 4}},
                "status": {"phase": "Running", "step": 3, "rewardMean": 0.625, "rolloutsPerS": 1.5, "fleet": "f",
                           "instances": 3, "startedAt": "2026-11-26T10:00:05Z", "message": "the run reports progress"}}

    stuck = {"metadata": {"name": "other", "namespace": "ns"}, "spec": {"environments": ["crm"], "binding": "pinned"},
             "status": {"replicas": 2, "ready": 0, "allocated": 0, "conditions": [
                 {"type": "Ready", "status": "False", "reason": "BundleUnavailable",
                  "message": "0 ready, 0 allocated, 2 starting of 2; 2 stuck, e.g. other-crm-0: bundle: ErrImagePull"}]}}

    class ApiServer:  # the two lists the operator reads
        async def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
            items = {"/apis/awm.dev/v1alpha1/namespaces/ns/campaigns": [campaign],
                     "/apis/awm.dev/v1alpha1/namespaces/ns/envfleets": [stuck, {**stuck, "metadata": {
                         "name": "f", "namespace": "ns"}, "status": {}}]}
            assert method == "GET" and path in items, (method, path)
            return {"items": items[path]}

    loop = asyncio.new_event_loop()
    ctx = Context(kube=ApiServer(), allocator=None, metrics=None, config=OperatorConfig())  # type: ignore[arg-type]
    fleets = operator_fleet()
    fleets.get("ns", "f").active = True  # this operator acts on it: its counts are live
    runner = loop.run_until_complete(serve(build_api(ctx, fleets), "127.0.0.1", 0))
    operator_thread = threading.Thread(target=loop.run_forever, daemon=True)
    operator_thread.start()
    monkeypatch.setenv("AWM_HOME", str(tmp_path / "home"))
    view = FleetView(operator_url=f"http://127.0.0.1:{bound_port(runner)}", namespaces=["ns"])
    try:
        with ui_in_thread(UiState(Runs([runs]), fleet=view)) as url:
            open_page(browser, url + "/", "#/fleet", "fleet")
            main = browser.find_element("id", "main")
            tables = wait(lambda: main.find_elements("css selector", "table"), "the namespace's tables")

            def rows(table: Any) -> list[dict[str, str]]:
                header = [th.text for th in table.find_elements("css selector", "thead th")]
                return [dict(zip(header, [td.text for td in tr.find_elements("css selector", "td")]))
                        for tr in table.find_elements("css selector", "tbody tr")]

            assert "Namespace ns" in main.text
            (cells,) = rows(tables[0])
            (row,) = tables[0].find_elements("css selector", "tbody tr")
            fleets = {r["Fleet"]: r for r in rows(tables[1])}
            assert fleets["f"]["Replicas"] == "3" and fleets["f"]["Ready"] == "1"  # live, from the acting operator
            assert (fleets["other"]["State"], fleets["other"]["Starting"]) == ("BundleUnavailable", "2")
            assert "other-crm-0: bundle: ErrImagePull" in fleets["other"]["Why"]
            assert (cells["Campaign"], cells["Mode"], cells["Phase"], cells["Step"]) == (
                "tiny", "training", "Running", "3")
            assert cells["Reward"] == "0.625" and cells["Rollouts/s"] == "1.5" and cells["pass@1"] == "–"
            assert cells["Instances"] == "1 / 1 / 3"  # ready / allocated / of the fleet the operator keeps
            assert cells["Envs"] == "2" and cells["Message"] == "the run reports progress"
            full_shot(browser, shots / "fleet-campaigns.png")
            row.find_element("link text", "tiny").click()  # its run directory is under the UI's roots
            wait(lambda: browser.execute_script("return document.body.dataset.ready") == "run",
                 "the campaign's run page")
            assert browser.current_url.endswith(f"#/run/{run_id(runs / 'tiny')}")
            assert severe(browser) == []
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(30)
        loop.call_soon_threadsafe(loop.stop)
        operator_thread.join(30)


def flat_config(value: Any, prefix: str = "") -> dict[str, str]:
    """config.json flattened as the UI lists it: nested keys joined by dots, lists as JSON."""
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in flat_config(item, f"{prefix}.{key}" if prefix else key).items()}
    return {prefix: json.dumps(value, separators=(",", ":")) if isinstance(value, list) else
            "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)}


def split_log(run: Path) -> list[list[str]]:
    """A finished run's trajectories cut at its `step` lines: what the log held after each step."""
    parts: list[list[str]] = [[]]
    for line in (run / "trajectories.jsonl").read_text().splitlines(keepends=True):
        parts[-1].append(line)
        if line.startswith('{"event": "step"'):
            parts.append([])
    return [p for p in parts if p]


@pytest.fixture(scope="module")
def more_runs(runs: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A second runs root beside the real one: "live", the real `tiny` run replayed step by step
    as its trainer wrote it (the test appends the next step); "crashed", `tiny-seed2` cut after
    its first step and quiet for a day; "eval-b", the real evaluation with its task's outcome turned
    over: never solved
    (as a worse checkpoint's would be), or solved if the real one never solved it."""
    root = tmp_path_factory.mktemp("more-runs")
    live = root / "live"
    live.mkdir()
    shutil.copy(runs / "tiny" / "config.json", live / "config.json")
    (live / "metrics.jsonl").write_text("")
    (live / "trajectories.jsonl").write_text("")
    crashed = root / "crashed"
    crashed.mkdir()
    shutil.copy(runs / "tiny-seed2" / "config.json", crashed / "config.json")
    (crashed / "metrics.jsonl").write_text((runs / "tiny-seed2" / "metrics.jsonl").read_text().splitlines(keepends=True)[0])
    (crashed / "trajectories.jsonl").write_text("".join(split_log(runs / "tiny-seed2")[0]))
    day_ago = time.time() - 86400
    for name in ("config.json", "metrics.jsonl", "trajectories.jsonl"):
        os.utime(crashed / name, (day_ago, day_ago))
    worse = root / "eval-b"
    shutil.copytree(runs / "eval", worse)
    report = json.loads((worse / "eval.json").read_text())
    for task in report["tasks"]:  # each task's outcome the other way round
        solved = 0.0 if task["complete"] else 1.0
        task.update(complete=int(solved) * task["samples"], pass_at_1=solved, pass_at_k=solved)
    mean = sum(t["pass_at_1"] for t in report["tasks"]) / len(report["tasks"])
    report["overall"] = {**report["overall"], "pass@1": mean, f"pass@{report['k']}": mean}
    (worse / "eval.json").write_text(json.dumps(report))
    return root


def write_step(run: Path, source: Path, step: int) -> None:
    """Append what the trainer of `source` wrote for `step`: its trajectories, then its metrics line."""
    with (run / "trajectories.jsonl").open("a") as f:
        f.write("".join(split_log(source)[step - 1]))
    with (run / "metrics.jsonl").open("a") as f:
        f.write(json.dumps(metric_rows(source)[step - 1]) + "\n")


def row_of(driver, name: str) -> str:  # type: ignore[no-untyped-def]
    """A run's row on the runs list, read again each time (the live list redraws it)."""
    try:
        rows = driver.find_elements("xpath", f"//main//tr[td/a[text()='{name}']]")
        return rows[0].text if rows else ""
    except Exception:  # redrawn while read
        return ""


def test_is_my_run_still_going_and_how_far(browser, runs, more_runs, shots):
    """The runs list and a run's page follow a run while it writes: its state (running,
    finished, stopped short) and "step N of M", the curves and numbers of each new step, and the
    episodes it logged, without a reload."""
    from awm.ui.app import UiState
    from awm.ui.runs import Runs

    severe(browser)  # read (and so cleared): what pages of earlier tests logged is not this test's
    live = more_runs / "live"
    total = json.loads((live / "config.json").read_text())["steps"]
    assert total == len(metric_rows(runs / "tiny")) == 3
    write_step(live, runs / "tiny", 1)
    with ui_in_thread(UiState(Runs([runs, more_runs]))) as url:
        open_page(browser, url + "/", "#/runs", "runs")
        assert "running" in row_of(browser, "live") and "step 1 of 3" in row_of(browser, "live")
        stopped = row_of(browser, "crashed")
        assert "stopped" in stopped and "step 1 of 2" in stopped and "crashed or was killed" in stopped
        assert "finished" in row_of(browser, "tiny") and "step 3 of 3" in row_of(browser, "tiny")
        assert "finished" in row_of(browser, "eval")
        browser.find_element("css selector", 'input[aria-label="compare crashed"]').click()
        write_step(live, runs / "tiny", 2)  # the list follows, and keeps what was ticked
        wait(lambda: "step 2 of 3" in row_of(browser, "live"), "the runs list at step 2")
        assert browser.find_element("css selector", 'input[aria-label="compare crashed"]').is_selected()
        full_shot(browser, shots / "runs-live.png")

        open_page(browser, url + "/", f"#/run/{run_id(live)}", "run")
        state = browser.find_element("id", "run-state")
        assert "running" in state.text and "step 2 of 3" in state.text
        reward = 'figure.panel[data-metric="reward_mean"] a.point-link'
        assert len(browser.find_elements("css selector", reward)) == 2
        write_step(live, runs / "tiny", 3)  # the last step: the run is finished
        wait(lambda: "finished" in browser.find_element("id", "run-state").text, "the run page's state")
        assert "step 3 of 3" in browser.find_element("id", "run-state").text
        wait(lambda: len(browser.find_elements("css selector", reward)) == 3, "the third step's point")
        cards = {c.find_element("tag name", "dt").text: c.find_element("tag name", "dd").text
                 for c in browser.find_elements("css selector", "dl.cards .card")}
        assert cards["Steps"] == "3"
        news = wait(lambda: browser.find_element("id", "episodes-news").text, "the new episodes' line")
        ended = len(episodes_of(runs / "tiny")[1])
        browser.find_element("xpath", "//p[@id='episodes-news']//button[text()='Show them']").click()
        wait(lambda: episode_count(browser).startswith(f"{ended} episodes match"), "the whole list")
        assert "more episode" in news
        full_shot(browser, shots / "run-live.png")
        assert severe(browser) == []
        browser.get("about:blank")  # the live page stops polling before its server stops


def test_what_differs_between_runs_configurations_and_outcomes(browser, runs, more_runs, shots):
    """Two training runs compared: exactly the settings that differ, marked; a baseline chosen
    on the page; an evaluation against a worse one: each difference coloured by whether it is
    better or worse for that measure, not by its sign."""
    from selenium.webdriver.support.ui import Select

    from awm.ui.app import UiState
    from awm.ui.runs import Runs

    a, b = (json.loads((runs / n / "config.json").read_text()) for n in ("tiny", "tiny-seed2"))
    fa, fb = flat_config(a), flat_config(b)
    differ = sorted(k for k in fa.keys() | fb.keys() if fa.get(k) != fb.get(k))
    assert {"seed", "steps", "run_dir"} <= set(differ) and "rollout.group_size" not in differ
    train, seed2 = run_id(runs / "tiny"), run_id(runs / "tiny-seed2")
    with ui_in_thread(UiState(Runs([runs, more_runs]))) as url:
        open_page(browser, url + "/", f"#/compare/{train}/{seed2}", "compare")
        section = browser.find_element("css selector", "section[aria-labelledby=config-diff-h]")
        table = section.find_element("tag name", "table")
        assert [c.text for c in table.find_elements("css selector", "tbody tr td:first-child")] == differ
        assert table.find_element("tag name", "caption").text.startswith(f"{len(differ)} of {len(fa.keys() | fb.keys())} settings differ")
        assert "tiny (baseline)" in table.find_element("tag name", "thead").text
        seed_row = table.find_element("xpath", ".//tr[td[1]/code[text()='seed']]")
        marked = seed_row.find_elements("css selector", "td:nth-child(3) .differs")
        assert marked and marked[0].get_attribute("textContent") == f"{fb['seed']} (differs from the baseline)"
        # the baseline is chosen, not the newest run
        browser.execute_script("document.body.dataset.ready = ''")
        Select(browser.find_element("id", "baseline")).select_by_visible_text("tiny-seed2")
        wait(lambda: browser.execute_script("return document.body.dataset.ready") == "compare", "the other baseline")
        assert f"baseline={seed2}" in browser.current_url
        heads = browser.find_elements("css selector", "section[aria-labelledby=config-diff-h] thead th")
        assert [th.text for th in heads][1:] == ["tiny-seed2 (baseline)", "tiny"]
        full_shot(browser, shots / "compare-config.png")

        # an evaluation against its outcome turned over: fewer tasks never solved is better, a
        # higher pass@1 is better, whichever sign each difference has
        open_page(browser, url + "/", f"#/compare/{run_id(runs / 'eval')}/{run_id(more_runs / 'eval-b')}", "compare")
        never_a, never_b = (sum(1 for t in json.loads((d / "eval.json").read_text())["tasks"] if not t["complete"])
                            for d in (runs / "eval", more_runs / "eval-b"))
        never = browser.find_element("xpath", "//main//tr[td[1][starts-with(., 'Tasks never solved')]]")
        delta = never.find_element("css selector", ".delta")
        assert delta.text.startswith(f"{'+' if never_b > never_a else '−'}{abs(never_b - never_a)}")
        assert delta.get_attribute("class") == f"delta {'worse' if never_b > never_a else 'better'}"
        pass1 = browser.find_element("xpath", "//main//tr[td[1][starts-with(., 'pass@1')]]").find_element("css selector", ".delta")
        assert pass1.text.startswith("+" if never_b < never_a else "−")
        assert pass1.get_attribute("class") == f"delta {'better' if never_b < never_a else 'worse'}"
        episodes = browser.find_element("xpath", "//main//tr[td[1][starts-with(., 'Episodes')]]")
        assert not episodes.find_elements("css selector", ".delta.better, .delta.worse")  # a count: no better way
        assert severe(browser) == []


BROKEN_WORDS = r"""
// Words of 2 to 16 characters (between spaces, hyphens and slashes, where a line may break) that
// the layout broke across lines: a narrow cell squeezed to a letter per line. Longer ones may
// break at the edge of their box, paths anywhere by design; text inside <pre> is the trajectory's.
const out = [];
const walker = document.createTreeWalker(document.getElementById("main"), NodeFilter.SHOW_TEXT);
for (let node = walker.nextNode(); node; node = walker.nextNode()) {
  const el = node.parentElement;
  if (!el || el.closest("pre, code.path, svg, .sr") || !el.getClientRects().length) continue;
  const text = node.textContent;
  for (const m of text.matchAll(/[^\s\/\u2010-\u2014-]+/g)) {
    if (m[0].length < 2 || m[0].length > 16) continue;
    const range = document.createRange();
    range.setStart(node, m.index);
    range.setEnd(node, m.index + m[0].length);
    const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0).map((r) => Math.round(r.top)));
    if (tops.size > 1) out.push(`${el.tagName.toLowerCase()}: "${m[0]}" on ${tops.size} lines`);
  }
}
return out.slice(0, 20);
"""


def test_no_word_breaks_letter_by_letter_and_the_breadcrumb_names_the_run(ui, browser, runs, shots):
    """The configuration grid, the catalog's tables and the runs list's headers kept whole at
    1400 and 800 px; an episode's breadcrumb names its run."""
    train = run_id(runs / "tiny")
    _, ended = episodes_of(runs / "tiny")
    pages = [("#/runs", "runs"), (f"#/run/{train}", "run"), (f"#/run/{run_id(runs / 'eval')}", "run"),
             ("#/catalog", "catalog"), (f"#/compare/{train}/{run_id(runs / 'tiny-seed2')}/{run_id(runs / 'eval')}", "compare"),
             (f"#/episode/{train}/{ended[0]['episode_id']}", "episode")]
    try:
        for width in (1400, 800):
            browser.set_window_size(width, 1000)
            for fragment, page in pages:
                open_page(browser, ui, fragment, page)
                for details in browser.find_elements("css selector", "main details:not([open])"):
                    browser.execute_script("arguments[0].open = true", details)
                assert browser.execute_script(BROKEN_WORDS) == [], (width, fragment)
            browser.save_screenshot(str(shots / f"layout-{width}.png"))
    finally:
        browser.set_window_size(1400, 1000)
    open_page(browser, ui, f"#/episode/{train}/{ended[0]['episode_id']}", "episode")
    crumb = browser.find_element("css selector", "main p.breadcrumb")
    assert crumb.find_elements("tag name", "a")[1].text == "tiny"
    assert severe(browser) == []
