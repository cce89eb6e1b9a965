"""The chart's Grafana dashboard (charts/awm/files/awm-dashboard.json) and the fleet page's own
queries (ui/fleet.py PROMQL), checked against a real Prometheus: every expression must parse
(`promtool check rules`, each one a recording rule) and evaluate on a server that scrapes a real
instance; the env server's series must come back with data. Grafana's variables are given the
values Grafana would (`$namespace`: all, `$__rate_interval`: 1m)."""

import asyncio
import json
import shutil
import subprocess
from pathlib import Path

import httpx
import yaml

from awm.client import ControlClient, McpSession
from tests.conftest import require
from tests.test_prometheus import start_prometheus
from awm.ui.fleet import PROMQL

DASHBOARD = Path(__file__).parent.parent / "charts" / "awm" / "files" / "awm-dashboard.json"
PROMTOOL = shutil.which("promtool")
PROMETHEUS = shutil.which("prometheus")
# fed by the env server (the others come from the operator, which this test does not run)
ENVSERVER = ("awm_tool_calls_total", "awm_tool_call_seconds", "awm_reset_seconds", "awm_episodes_total")


def expressions() -> dict[str, str]:
    dashboard = json.loads(DASHBOARD.read_text())
    found = {f"{p['title']} [{t.get('legendFormat') or t.get('refId') or i}]": t["expr"]
             for p in dashboard["panels"] for i, t in enumerate(p.get("targets", []))}
    found.update({f"ui fleet page {k}": v for k, v in PROMQL.items()})
    return {name: expr.replace("$__rate_interval", "1m").replace("$namespace", ".*") for name, expr in found.items()}


def test_every_query_parses_with_promtool(tmp_path):
    require(PROMTOOL is not None, "promtool is not installed (Debian's prometheus package has it; .ci/run installs it)")
    exprs = expressions()
    assert len(exprs) >= 13
    rules = {"groups": [{"name": "dashboard", "rules": [{"record": f"awm:check_{n}", "expr": e}
                                                      for n, e in enumerate(exprs.values())]}]}
    (tmp_path / "rules.yml").write_text(yaml.safe_dump(rules))
    checked = subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "rules.yml")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(exprs)} rules found" in checked.stdout
    # and promtool does refuse a broken one: the check can fail
    rules["groups"][0]["rules"].append({"record": "awm:broken", "expr": "sum(rate(awm_tool_calls_total[1m])"})
    (tmp_path / "broken.yml").write_text(yaml.safe_dump(rules))
    assert subprocess.run([PROMTOOL, "check", "rules", str(tmp_path / "broken.yml")], capture_output=True).returncode != 0


async def test_every_query_evaluates_on_a_real_prometheus(notes, tmp_path):
    require(PROMETHEUS is not None, "prometheus is not installed (.ci/run installs it from Debian's packages)")
    proc, port = start_prometheus(PROMETHEUS, notes.control_url, tmp_path)
    control = ControlClient(notes.control_url)
    exprs = expressions()
    try:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as api:
            pending = {name for name, e in exprs.items() if any(m in e for m in ENVSERVER)}
            results: dict[str, dict] = {}
            for _ in range(120):  # rates need two scrapes that saw traffic
                await control.reset("add_note")
                async with McpSession(notes.mcp_url) as mcp:
                    await mcp.call_tool("list_notes", {})
                await control.verify(None)
                await asyncio.sleep(0.5)
                try:
                    for name, expr in exprs.items():
                        results[name] = (await api.get("/api/v1/query", params={"query": expr})).json()
                except httpx.HTTPError:
                    continue  # not up yet
                if all(results[n]["status"] == "success" and results[n]["data"]["result"] for n in pending):
                    break
        failed = {n: r.get("error") for n, r in results.items() if r.get("status") != "success"}
        assert len(results) == len(exprs) and not failed, failed
        empty = sorted(n for n in pending if not results[n]["data"]["result"])
        assert not empty, empty
    finally:
        await control.close()
        proc.terminate()
        proc.wait(10)
