"""BFCL (Berkeley Function Calling Leaderboard) through the ``bfcl-eval`` package: its own
generation code (its ``OpenAICompletionsHandler`` pointed at the endpoint, native tool calls, or
its prompting mode) and its own AST / state-based evaluator (``harness/bfcl_run.py`` runs both
in the BFCL virtualenv). awm only picks the categories and reads BFCL's score files.

Default categories: BFCL v3's - non-live, live and multi-turn - which need no API key. Skipped:
v4's agentic section (web_search needs a SerpAPI key and the internet; memory needs an embedding
model from a model hub) and format_sensitivity (prompting models only).
"""

from __future__ import annotations

import json
from pathlib import Path

from awm.trainer.suites.proc import HarnessError, run
from awm.trainer.suites.table import Endpoint, Row, SuiteReport

HARNESS = "bfcl-eval 2026.3.23"
NON_LIVE = ["simple_python", "simple_java", "simple_javascript", "multiple", "parallel", "parallel_multiple",
            "irrelevance"]
LIVE = ["live_simple", "live_multiple", "live_parallel", "live_parallel_multiple", "live_irrelevance",
        "live_relevance"]
MULTI_TURN = ["multi_turn_base", "multi_turn_miss_func", "multi_turn_miss_param", "multi_turn_long_context"]
DEFAULT = NON_LIVE + LIVE + MULTI_TURN
SKIPPED = {
    "web_search": "needs a SerpAPI key and the internet (BFCL v4 agentic)",
    "memory": "its vector backend loads an embedding model from a model hub (BFCL v4 agentic)",
    "format_sensitivity": "defined for prompting models only",
}
# BFCL's section summaries (its data_*.csv) -> the paper's rows.
_SECTIONS = [("non_live", "Non-Live Overall Acc", "Non-Live"), ("live", "Live Overall Acc", "Live"),
             ("multi_turn", "Multi Turn Overall Acc", "Multi-Turn")]


def _pct(text: str | None) -> float | None:
    """BFCL writes '85.50%' or 'N/A'."""
    if not text or not text.strip().endswith("%"):
        return None
    return float(text.strip().rstrip("%")) / 100


def run_bfcl(endpoint: Endpoint, python: Path, out: Path, categories: list[str] | None = None,
             ids: dict[str, list[str]] | None = None, prompting: bool = False, threads: int = 1) -> SuiteReport:
    """Generate and evaluate ``categories`` (or only ``ids``, a {category: [entry ids]} subset)."""
    cats = list(ids) if ids else (categories or DEFAULT)
    root = out / "bfcl"
    cmd = [str(python), str(Path(__file__).with_name("harness") / "bfcl_run.py"), "--root", str(root),
           "--model", endpoint.model, "--base-url", endpoint.base_url, "--categories", ",".join(cats),
           "--temperature", str(endpoint.temperature or 0.001), "--threads", str(threads)]
    if ids:
        cmd += ["--ids", json.dumps(ids)]
    if prompting:
        cmd.append("--prompting")
    run(cmd, out / "bfcl.log", env={"OPENAI_API_KEY": endpoint.api_key or "EMPTY"})
    try:
        data = json.loads((root / "awm-bfcl.json").read_text())
    except FileNotFoundError as exc:
        raise HarnessError(f"BFCL wrote no scores ({exc}); see {out / 'bfcl.log'}") from exc
    rows = []
    for cat in cats:
        s = data["categories"].get(cat)
        if s is None:
            raise HarnessError(f"BFCL's evaluator scored no {cat!r}; see {out / 'bfcl.log'}")
        rows.append(Row(cat, int(s["total_count"]), {"accuracy": float(s["accuracy"])}))
    summary = []
    whole = {"non_live": NON_LIVE, "live": LIVE, "multi_turn": MULTI_TURN}
    for key, column, label in _SECTIONS:
        # BFCL averages a section over all its categories, counting one not run as 0: only a
        # section run whole (no --case subset) has a meaningful summary.
        value = _pct(data["sections"].get(key, {}).get(column)) if not ids and set(whole[key]) <= set(cats) else None
        if value is not None:
            summary.append(Row(label, sum(r.cases for r in rows if _section(r.category) == key), {"accuracy": value}))
    hall = [r.metrics["accuracy"] for r in rows if r.category.endswith("relevance")]
    if hall:  # the paper's "Hallucination": BFCL's relevance and irrelevance detection
        summary.append(Row("Hallucination", sum(r.cases for r in rows if r.category.endswith("relevance")),
                           {"accuracy": sum(hall) / len(hall)}))
    overall = [r.metrics["accuracy"] for r in summary if r.category in ("Non-Live", "Live", "Multi-Turn")]
    if overall:  # the paper's BFCLv3 Overall: the mean of v3's three sections, as BFCL scored them
        summary.append(Row("Overall (v3 sections)", sum(r.cases for r in rows), {"accuracy": sum(overall) / len(overall)}))
    skipped = {k: v for k, v in SKIPPED.items() if not any(c.startswith(k) for c in cats)}
    return SuiteReport("bfcl", HARNESS, endpoint.model, ["accuracy"], rows, summary, skipped,
                       {"registry_key": data["registry_key"],
                        "failed": {c: s["failed"] for c, s in data["categories"].items()},
                        "sections": data["sections"]})


def _section(category: str) -> str:
    if category.startswith("live_"):
        return "live"
    if category.startswith("multi_turn"):
        return "multi_turn"
    return "non_live"
