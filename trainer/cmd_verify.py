"""``awm verify``: re-verify a saved run offline and compare with its live verdicts (trainer/reverify.py).

Exit codes: 0 every verdict agrees, 1 some verdict differs, 2 bad input (no trajectories, a
catalog that does not load, bad judge flags).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.table import Table

from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, serving_options
from awm.trainer.cmd_options import DatabaseUrlOpt, console, err, load_bundles


def verify_command(
    run_dir: Annotated[Path, typer.Argument(help="A run directory of awm train or awm eval (trajectories.jsonl).")],
    catalog: Annotated[Optional[str], typer.Option("--catalog", "-c", help=(
        "Catalog of the run's environments (default: the one in the run's config.json, else the starter).")
    )] = None,
    replicas: Annotated[int, typer.Option("--replicas", min=1, help="Instances per environment.")] = 2,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON.")] = False,
    database_url: DatabaseUrlOpt = None,
    judge_base_url: JudgeUrlOpt = None,
    judge_model: JudgeModelOpt = None,
    judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
) -> None:
    """Re-verify a saved run offline: replay each episode's tool calls on a fresh instance, verify
    with its final answer (code verifier or LLM judge), and compare with the live verdicts.
    Writes RUN_DIR/verify.jsonl; exits 1 when any verdict differs."""
    from awm.fleet import Database
    from awm.trainer.reverify import reverify, summary

    if not (run_dir / "trajectories.jsonl").is_file():
        err.print(f"[red]error:[/red] {run_dir} has no trajectories.jsonl")
        raise typer.Exit(2)
    config = run_dir / "config.json"
    if catalog is None and config.is_file():
        catalog = json.loads(config.read_text()).get("catalog")
    bundles = load_bundles(catalog or "starter")
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, True)

    async def run() -> list[Any]:
        database = await asyncio.to_thread(Database.open, database_url)
        try:
            return await reverify(run_dir, bundles, replicas, database, serving)
        finally:
            await asyncio.to_thread(database.close)

    results = asyncio.run(run())
    totals = summary(results)
    if as_json:
        print(json.dumps(totals))
    else:
        _show_comparison(run_dir, results, totals)
    raise typer.Exit(1 if totals["different"] else 0)


def _show_comparison(run_dir: Path, results: list[Any], totals: dict[str, Any]) -> None:
    """The counts as a table, then each episode whose offline verdict differs, with the reason."""
    table = Table(title=f"awm verify {run_dir}")
    for col in ("episodes", "replayed", "same verdict", "different", "diverged replays", "skipped"):
        table.add_column(col, justify="right")
    table.add_row(*(str(totals[k]) for k in ("episodes", "replayed", "same", "different", "diverged", "skipped")))
    console.print(table)
    for r in results:
        if not r.same and r.offline != "skipped":
            console.print(f"[red]{r.env}/{r.task_id}[/red] {r.episode_id[:8]}: {r.reason}")
