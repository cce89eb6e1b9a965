"""``awm gen``: run stages with progress bars, then a summary and a report.

``gen all`` runs every stage in order, assembles the surviving environments into
``<dir>/catalog/`` (which ``awm serve``/``awm demo --catalog`` load as is) and writes
``<dir>/report.json``: per stage kept and rejected items with reasons, tokens, wall time.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from awm.bundle import EnvBundle
from awm.gates import gate_status
from awm.synth import stages
from awm.synth.embed import ApiEmbedder, Embedder, HashingEmbedder
from awm.llm import LLMClient
from awm.synth.store import read_jsonl

SEEDS = Path(__file__).with_name("seeds.jsonl")


def make_embedder(kind: str, llm: LLMClient) -> Embedder:
    if kind == "hashing":
        return HashingEmbedder()
    if kind == "api":
        return ApiEmbedder(llm)
    raise ValueError(f"unknown embedder {kind!r} (api or hashing)")


async def run_stages(run: stages.Run, which: list[str], *, seeds: Path | None = None, target: int = 10,
                     embedder: Embedder | None = None, threshold: float = 0.85, max_per_category: int = 80,
                     console: Console | None = None) -> dict[str, Any]:
    console = console or Console(stderr=True)
    started = time.perf_counter()
    run.dir.mkdir(parents=True, exist_ok=True)
    with Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=console, transient=False) as progress:
        bars: dict[str, Any] = {}

        def on_progress(stage: str, done: int, total: int) -> None:
            if stage not in bars:
                bars[stage] = progress.add_task(stage, total=max(total, 1))
            progress.update(bars[stage], completed=done, total=max(total, 1))

        run.on_progress = on_progress
        stopped = None
        for index, stage in enumerate(which):
            if stage == "scenario":
                seed_path = seeds or SEEDS
                if seed_path.resolve() == run.path("scenario").resolve():
                    raise ValueError("the seed file cannot be the stage's output file")
                await stages.stage_scenario(run, read_jsonl(seed_path), target, embedder or HashingEmbedder(),
                                            threshold, max_per_category)
            else:
                await getattr(stages, f"stage_{stage}")(run)
            if index + 1 < len(which) and not _kept(run, stage):
                stopped = stage  # the next stages would have nothing to work on
                break
    summary = summarize(run, time.perf_counter() - started)
    if stopped is not None:
        summary["stopped_after"] = stopped
        rejected = run.dir / stages.FILES[stopped].replace(".jsonl", ".rejected.jsonl")
        summary["stopped_because"] = [  # what the stage's rejections say, also when this run only resumed
            f"{r.get('scenario') or r.get('name')}: {'; '.join(map(str, r.get('errors') or []))[:300]}"
            for r in (read_jsonl(rejected) if rejected.exists() else [])[:5]]
    if "solution" in which and stopped is None:
        bundles = stages.assemble(run, run.dir / "catalog")
        summary["gates"] = await record_gates(run, bundles, run.dir / "catalog")
        summary["catalog"] = str(run.dir / "catalog")
        summary["environments"] = [{"name": b.name, "tools": len(b.tools), "tasks": len(b.tasks),
                                    "tables": len(b.database.seed)} for b in bundles]
    (run.dir / "report.json").write_text(json.dumps(summary, indent=2))
    return summary


def _kept(run: stages.Run, stage: str) -> bool:
    """Whether ``stage`` has anything for the next stage (its rejections are in their own file)."""
    path = run.path(stage)
    return path.exists() and bool(read_jsonl(path))


async def record_gates(run: stages.Run, bundles: list[EnvBundle], catalog_dir: Path) -> dict[str, int]:
    """Both gates once more on the assembled bundles, as served, stored as the tasks' gate records
    (env servers serve only tasks whose record holds)."""
    from awm.demo import record_results, run_catalog
    from awm.fleet import Database

    if not bundles:
        return {"tasks": 0, "passed": 0}
    results, _ = await run_catalog(bundles, negative_gate=True, show_progress=False, allow_ungated=True,
                                   database=Database(run.admin_dsn), judge=run.judge)
    for bundle, result in zip(bundles, results):
        record_results(bundle, result)
        (catalog_dir / f"{bundle.name}.json").write_text(bundle.model_dump_json(indent=1))
    return {"tasks": sum(len(b.tasks) for b in bundles),
            "passed": sum(gate_status(b, t)[0] for b in bundles for t in b.tasks)}


def summarize(run: stages.Run, wall_s: float) -> dict[str, Any]:
    return {
        "wall_s": round(wall_s, 1),
        "stages": run.report,
        "tokens": {stage: asdict(u) for stage, u in run.llm.usage.items()},
        "total_tokens": sum(u.prompt_tokens + u.completion_tokens for u in run.llm.usage.values()),
    }


def print_summary(summary: dict[str, Any], console: Console) -> None:
    table = Table(title="awm gen: summary")
    for col in ("stage", "kept", "rejected", "LLM calls", "retries", "repairs", "tokens"):
        table.add_column(col, justify="left" if col == "stage" else "right")
    for stage in stages.STAGES:
        r = summary["stages"].get(stage)
        u = summary["tokens"].get(stage, {})
        if not r and not u:
            continue
        r = r or {"kept": 0, "rejected": 0}
        table.add_row(stage, str(r["kept"]), str(r["rejected"]), str(u.get("calls", 0)), str(u.get("retries", 0)),
                      str(u.get("repairs", 0)), str(u.get("prompt_tokens", 0) + u.get("completion_tokens", 0)))
    console.print(table)
    for stage, r in summary["stages"].items():
        for rej in r.get("rejections", [])[:10]:
            console.print(f"[yellow]rejected[/yellow] {stage} {rej['item']}: {'; '.join(rej['reasons'])[:300]}")
    if summary.get("environments") is not None:
        envs = Table(title=f"catalog: {summary.get('catalog')}")
        for col in ("environment", "tools", "tasks kept", "tables"):
            envs.add_column(col)
        for e in summary["environments"]:
            envs.add_row(e["name"], str(e["tools"]), str(e["tasks"]), str(e["tables"]))
        console.print(envs)
    if summary.get("stopped_after"):
        console.print(f"[red]stopped:[/red] nothing survived the {summary['stopped_after']} stage, so the later stages "
                      "had nothing to work on; no catalog was made")
        for reason in summary.get("stopped_because", []):
            console.print(f"  [yellow]rejected[/yellow] {reason}")
    console.print(f"tokens: {summary['total_tokens']}, wall time: {summary['wall_s']} s")
