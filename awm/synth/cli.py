"""``awm gen ...``: the synthesis stages from the command line (AWM's command names)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from awm import settings
from awm.synth import stages
from awm.llm import LLMBadOutput, LLMClient, LLMSettings, LLMUnavailable
from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, serving_options

gen_app = typer.Typer(help="Synthesise environments with an OpenAI-compatible LLM (stages write JSONL in --dir).",
                      no_args_is_help=True)
err = Console(stderr=True)

DirOpt = Annotated[Path, typer.Option("--dir", "-d", help="Run directory holding the gen_*.jsonl files.")]
BaseUrl = Annotated[Optional[str], typer.Option("--base-url", help="LLM endpoint (AWM_LLM_BASE_URL / OPENAI_BASE_URL).")]
Model = Annotated[Optional[str], typer.Option("--model", help="Model name (AWM_LLM_MODEL).")]
Concurrency = Annotated[Optional[int], typer.Option("--concurrency", min=1, help="Parallel LLM requests.")]
Attempts = Annotated[int, typer.Option("--attempts", min=1, help="Generations per item, including repairs.")]
NumTasks = Annotated[int, typer.Option("--num-tasks", min=1, help="Tasks per scenario.")]
DbUrl = Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                              help="Postgres admin DSN for validation (default: embedded).")]


def _run_stages(which: list[str], directory: Path, base_url: str | None, model: str | None, concurrency: int | None,
                attempts: int, num_tasks: int, database_url: str | None, verifier_mode: str = "code",
                judge: object = None, keep_best: bool = False, **scenario_opts: object) -> None:
    from awm.fleet import Database
    from awm.synth.pipeline import make_embedder, print_summary, run_stages

    async def go() -> dict:
        llm = LLMClient(LLMSettings.from_env(base_url, None, model, concurrency))
        database = await asyncio.to_thread(Database.open, database_url)
        try:
            run = stages.Run(directory, llm, database.admin_dsn, attempts=attempts, num_tasks=num_tasks,
                             verifier_mode=verifier_mode, judge=judge,  # type: ignore[arg-type]
                             keep_best=keep_best)
            embedder = make_embedder(str(scenario_opts.pop("embedder", "hashing")), llm)
            return await run_stages(run, which, embedder=embedder, **scenario_opts)  # type: ignore[arg-type]
        finally:
            await llm.close()
            await asyncio.to_thread(database.close)

    try:
        summary = asyncio.run(go())
    except LLMUnavailable as exc:
        err.print(f"[red]error: the LLM endpoint is unavailable:[/red] {exc}")
        err.print("Set AWM_LLM_BASE_URL, AWM_LLM_API_KEY and AWM_LLM_MODEL (or --base-url/--model). "
                  "Finished items are saved; rerun the same command to resume.")
        raise typer.Exit(3) from exc
    except (LLMBadOutput, FileNotFoundError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    print_summary(summary, Console())
    if summary.get("stopped_after"):
        raise typer.Exit(1)


def _stage_command(stage: str) -> None:
    def command(directory: DirOpt = Path("outputs"), base_url: BaseUrl = None, model: Model = None,
                concurrency: Concurrency = None, attempts: Attempts = 3, num_tasks: NumTasks = 10,
                database_url: DbUrl = None) -> None:
        _run_stages([stage], directory, base_url, model, concurrency, attempts, num_tasks, database_url)

    command.__doc__ = f"Run the {stage} stage (reads the earlier stages' files in --dir)."
    gen_app.command(stage)(command)


@gen_app.command("scenario")
def gen_scenario(
    directory: DirOpt = Path("outputs"),
    input: Annotated[Optional[Path], typer.Option("--input", help="Seed scenarios JSONL (default: awm's own seeds).")] = None,
    target_count: Annotated[int, typer.Option("--target-count", min=1, help="Scenarios in all, seeds included.")] = 30,
    embedder: Annotated[str, typer.Option(help="api (embeddings endpoint) or hashing (offline).")] = "api",
    threshold: Annotated[float, typer.Option(help="Reject a scenario this similar (cosine) to another.")] = 0.85,
    max_per_category: Annotated[int, typer.Option(help="Cap on scenarios per category.")] = 80,
    base_url: BaseUrl = None, model: Model = None, concurrency: Concurrency = None, attempts: Attempts = 3,
    database_url: DbUrl = None,
) -> None:
    """Generate scenarios from seeds, deduplicated by embedding and capped per category."""
    _run_stages(["scenario"], directory, base_url, model, concurrency, attempts, 10, database_url,
                seeds=input, target=target_count, embedder=embedder, threshold=threshold,
                max_per_category=max_per_category)


ModeOpt = Annotated[str, typer.Option("--mode", help=(
    "code: the verifier decides; judge: it gathers evidence and an LLM judge decides (the reference "
    "system's sql mode; the judge is the synthesis endpoint unless --judge-base-url/--judge-model)."))]


def _judge(mode: str, judge_base_url: str | None, judge_model: str | None) -> object:
    if mode not in ("code", "judge"):
        err.print(f"[red]error:[/red] --mode must be code or judge, not {mode!r}")
        raise typer.Exit(2)
    return serving_options(judge_base_url, judge_model, 1, None, True)["judge"]


for _stage in stages.STAGES[1:]:
    if _stage not in ("verifier", "solution"):
        _stage_command(_stage)


@gen_app.command("verifier")
def gen_verifier(
    directory: DirOpt = Path("outputs"), mode: ModeOpt = "code", base_url: BaseUrl = None, model: Model = None,
    concurrency: Concurrency = None, attempts: Attempts = 3, num_tasks: NumTasks = 10, database_url: DbUrl = None,
    judge_base_url: JudgeUrlOpt = None, judge_model: JudgeModelOpt = None,
) -> None:
    """Run the verifier stage (reads the earlier stages' files in --dir): code or judge verifiers,
    each kept once it does not call the untouched snapshot complete."""
    _run_stages(["verifier"], directory, base_url, model, concurrency, attempts, num_tasks, database_url,
                verifier_mode=mode, judge=_judge(mode, judge_base_url, judge_model))


@gen_app.command("solution")
def gen_solution(
    directory: DirOpt = Path("outputs"),
    catalog: Annotated[Optional[Path], typer.Option("--catalog", "-c", help=(
        "Instead of a run directory: solve this catalog's tasks that have no reference solution (an "
        "AWM import), each kept once it passes the positive gate, and write the bundles back."))] = None,
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="With --catalog: only these.")] = None,
    base_url: BaseUrl = None, model: Model = None, concurrency: Concurrency = None, attempts: Attempts = 3,
    num_tasks: NumTasks = 10, database_url: DbUrl = None,
    judge_base_url: JudgeUrlOpt = None, judge_model: JudgeModelOpt = None, judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
) -> None:
    """Run the solution stage (reads the earlier stages' files in --dir), or solve a catalog."""
    if catalog is None:
        _run_stages(["solution"], directory, base_url, model, concurrency, attempts, num_tasks, database_url)
        return
    from awm.fleet import Database
    from awm.synth.solve import solve_catalog

    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, True)

    async def go() -> list:
        llm = LLMClient(LLMSettings.from_env(base_url, None, model, concurrency))
        database = await asyncio.to_thread(Database.open, database_url)
        try:
            return await solve_catalog(catalog, llm, database, attempts, env, serving["judge"], verifier_kind)
        finally:
            await llm.close()
            await asyncio.to_thread(database.close)

    try:
        reports = asyncio.run(go())
    except LLMUnavailable as exc:
        err.print(f"[red]error: the LLM endpoint is unavailable:[/red] {exc}")
        raise typer.Exit(3) from exc
    except ValueError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    console = Console()
    for r in reports:
        console.print(f"{r.env}: {len(r.solved)} solved (both gates passed), {len(r.failed)} not, "
                      f"{len(r.skipped)} had a solution")
        for task_id, reason in r.failed.items():
            console.print(f"  [yellow]{task_id}[/yellow]: {reason[:300]}")


@gen_app.command("all")
def gen_all(
    directory: DirOpt = Path("outputs"),
    input: Annotated[Optional[Path], typer.Option("--input", help="Seed scenarios JSONL (default: awm's own seeds).")] = None,
    target_count: Annotated[int, typer.Option("--target-count", min=1, help="Scenarios in all, seeds included.")] = 30,
    embedder: Annotated[str, typer.Option(help="api (embeddings endpoint) or hashing (offline).")] = "api",
    threshold: Annotated[float, typer.Option(help="Scenario similarity threshold (cosine).")] = 0.85,
    max_per_category: Annotated[int, typer.Option(help="Cap on scenarios per category.")] = 80,
    base_url: BaseUrl = None, model: Model = None, concurrency: Concurrency = None, attempts: Attempts = 3,
    num_tasks: NumTasks = 10, database_url: DbUrl = None,
    verifier_mode: Annotated[str, typer.Option("--verifier-mode", help="code or judge (see `awm gen verifier`).")] = "code",
    judge_base_url: JudgeUrlOpt = None, judge_model: JudgeModelOpt = None,
    keep_best: Annotated[bool, typer.Option("--keep-best", help=(
        "When no attempt of a tolerant stage (task, db, sample, spec, env) passes, carry its best one "
        "on, marked unvalidated: later stages run on it, the catalog never takes it."))] = False,
) -> None:
    """Every stage in order, ending in <dir>/catalog (serve it with `awm serve --catalog`)."""
    _run_stages(stages.STAGES, directory, base_url, model, concurrency, attempts, num_tasks, database_url,
                verifier_mode=verifier_mode, judge=_judge(verifier_mode, judge_base_url, judge_model),
                keep_best=keep_best,
                seeds=input, target=target_count, embedder=embedder, threshold=threshold,
                max_per_category=max_per_category)
