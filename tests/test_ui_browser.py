"""`awm ui` in a real headless browser: Debian's chromium driven through its chromedriver by
selenium (nothing is downloaded at run time; .ci/run installs both packages).

The data is real: a short `awm train` run of examples/train-tiny.yaml (3 steps instead of 30),
an `awm eval` of its checkpoint, and `awm ui --serve lamps` with its own local fleet on the
session's PostgreSQL, all as subprocesses through the CLI a user would type. Screenshots of every
page go to the session's temporary directory (printed; kept as artifacts by CI).
"""

from __future__ import annotations

import json
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
    path = tmp_path_factory.mktemp("ui-screenshots")
    print(f"screenshots: {path}")
    return path


@pytest.fixture(scope="module")
def browser(tmp_path_factory: pytest.TempPathFactory):  # type: ignore[no-untyped-def]
    require(CHROMIUM and CHROMEDRIVER,
            "chromium and chromedriver are not installed (.ci/run installs Debian's chromium and chromium-driver)")
    from selenium import webdriver

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM  # type: ignore[assignment]
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium')}", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=CHROMEDRIVER))
    yield driver
    driver.quit()


def wait(predicate, what: str) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    pytest.fail(f"timed out waiting for {what}")


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
        driver.execute_script("document.body.dataset.ready = ''; location.hash = arguments[0];", fragment)
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
                           ("#/playground", "playground"), (f"#/run/{train}", "run"),
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
    import socket
    import threading

    import uvicorn

    import awm.ui.runs
    from awm.ui.app import UiState, build_app
    from awm.ui.runs import Runs

    monkeypatch.setattr(awm.ui.runs, "SYNC_BYTES", 0)
    monkeypatch.setenv("AWM_HOME", str(tmp_path / "home"))  # no index yet
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(build_app(UiState(Runs([runs]))), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    wait(lambda: server.started, "the in-process server")
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/"
    try:
        open_page(browser, url, f"#/run/{run_id(runs / 'tiny')}", "run")
        main = browser.find_element("id", "main")
        assert "Indexing the episodes" in main.text and main.find_elements("css selector", "svg a.point-link")
        count = wait(lambda: browser.find_elements("id", "episode-count"), "the episode list")[0]
        assert count.text.startswith(f"{len(episodes_of(runs / 'tiny')[1])} episodes match")
        assert severe(browser) == []
    finally:
        server.should_exit = True
        thread.join(30)
