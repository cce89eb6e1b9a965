"""MCP-Universe through the ``mcpuniverse`` package: its ``BenchmarkRunner`` with its own agent,
MCP servers and evaluators (``harness/mcpu_run.py``), the model swapped for the endpoint. The
metric is MCP-Universe's success rate: a task succeeds when every one of its evaluators passes.

The package on PyPI (1.1.3, and every earlier release) ships the framework but not the
benchmark's task files; they come from the MCP-Universe repository, given as its benchmark YAML
files (``--benchmark-config``). Every domain of the benchmark needs an internet service, so a
domain named here is skipped unless asked for with ``--category`` (the paper also leaves out
3D designing and repository management).
"""

from __future__ import annotations

import json
from pathlib import Path

from awm.trainer.suites.proc import HarnessError, run
from awm.trainer.suites.table import Endpoint, Row, SuiteReport

HARNESS = "mcpuniverse 1.1.3"
NEEDS_SERVICE = {
    "location_navigation": "Google Maps API (a key and the internet)",
    "financial_analysis": "Yahoo Finance over the internet (yfinance)",
    "browser_automation": "Playwright browsing live websites",
    "web_search": "Google search through SerpAPI (a key) and fetching live pages",
    "repository_management": "the GitHub API and a token (the paper leaves it out too)",
    "3d_design": "a running Blender with the blender-mcp add-on (the paper leaves it out too)",
    "multi_server": "several of the services above",
}


def run_mcpuniverse(endpoint: Endpoint, python: Path, out: Path, configs: list[Path],
                    categories: list[str] | None = None) -> SuiteReport:
    """Run each benchmark YAML in ``configs`` (a category is the file's stem)."""
    if not configs:
        raise ValueError("MCP-Universe's tasks are not in its PyPI package: give its benchmark YAML files "
                         "with --benchmark-config (docs/integrations.md)")
    wanted = set(categories or [])
    chosen = [c for c in configs if c.stem not in NEEDS_SERVICE or c.stem in wanted]
    skipped = {c.stem: f"needs {NEEDS_SERVICE[c.stem]}" for c in configs if c not in chosen}
    rows: list[Row] = []
    details: dict = {}
    if chosen:
        result = out / "mcp-universe-results.json"
        cmd = [str(python), str(Path(__file__).with_name("harness") / "mcpu_run.py"), "--out", str(result),
               "--model", endpoint.model, "--base-url", endpoint.base_url, *map(str, chosen)]
        run(cmd, out / "mcp-universe.log", env={"OPENAI_API_KEY": endpoint.api_key or "EMPTY"})
        if not result.is_file():
            raise HarnessError(f"MCP-Universe wrote no results; see {out / 'mcp-universe.log'}")
        details = json.loads(result.read_text())
        for domain, tasks in details.items():
            n = len(tasks)
            rows.append(Row(domain, n, {"success rate": sum(t["passed"] for t in tasks.values()) / n if n else None}))
    total = sum(r.cases for r in rows)
    summary = [Row("Overall", total, {"success rate": sum(r.metrics["success rate"] * r.cases for r in rows) / total})] \
        if total else []
    return SuiteReport("mcp-universe", HARNESS, endpoint.model, ["success rate"], rows, summary, skipped, details)
