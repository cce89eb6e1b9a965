"""``awm eval --suite NAME``: picks the suite's interpreter, runs it, prints and writes the table.
Kept apart from trainer/cmd_eval.py so that file only parses options."""

from __future__ import annotations

from pathlib import Path

from rich.console import Console

from awm.trainer.suites.table import Endpoint, SuiteReport, render

SUITES = ("bfcl", "tau2", "mcp-universe")


def _by_category(cases: list[str]) -> dict[str, list[str]]:
    """``--case CATEGORY:ID`` (repeatable) -> {category: [ids]}; an id may itself contain ':'."""
    out: dict[str, list[str]] = {}
    for case in cases:
        category, sep, ident = case.partition(":")
        if not sep or not ident:
            raise ValueError(f"--case {case!r}: expected CATEGORY:ID")
        out.setdefault(category, []).append(ident)
    return out


def run_suite(suite: str, endpoint: Endpoint, out: Path, console: Console, *, python: str | None = None,
              categories: list[str] | None = None, cases: list[str] | None = None, num_tasks: int | None = None,
              trials: int = 1, user: Endpoint | None = None, configs: list[str] | None = None,
              max_steps: int = 100) -> SuiteReport:
    from awm.trainer.suites.envs import python_for

    interpreter = python_for(suite, python)
    ids = _by_category(cases or [])
    if suite == "bfcl":
        from awm.trainer.suites.bfcl import run_bfcl

        report = run_bfcl(endpoint, interpreter, out, categories, ids or None)
    elif suite == "tau2":
        from awm.trainer.suites.tau2 import run_tau2

        report = run_tau2(endpoint, user or endpoint, interpreter, out, categories, trials, ids or None, num_tasks,
                          max_steps)
    elif suite == "mcp-universe":
        from awm.trainer.suites.mcpuniverse import run_mcpuniverse

        report = run_mcpuniverse(endpoint, interpreter, out, [Path(c) for c in configs or []], categories)
    else:
        raise ValueError(f"unknown suite {suite!r} (one of {', '.join(SUITES)})")
    render(report, console)
    console.print(f"wrote {report.write(out)}")
    return report
