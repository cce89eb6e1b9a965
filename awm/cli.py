"""The ``awm`` command line."""

from __future__ import annotations

import asyncio
import importlib
import json
import logging
import signal
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console
from typer.core import TyperGroup
from rich.table import Table

from awm import catalog as catalog_mod
from awm import settings
from awm.bundle import bundle_json_schema
from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, UngatedOpt, serving_options

app = typer.Typer(help="Agent World Model environments: build, serve and verify tool-use environments.",
                  no_args_is_help=True, add_completion=False, pretty_exceptions_show_locals=False)
catalog_app = typer.Typer(help="List, inspect and validate environment catalogs.", no_args_is_help=True)
env_app = typer.Typer(help="Talk to a running environment instance.", no_args_is_help=True)
pg_app = typer.Typer(help="The embedded PostgreSQL server.", no_args_is_help=True)
app.add_typer(catalog_app, name="catalog")
app.add_typer(env_app, name="env")
app.add_typer(pg_app, name="postgres")


# Subcommands of the components above the core are registered lazily: `import awm.cli` loads
# none of them (an image installs only what its component imports; tests/test_imports.py), and
# a subcommand imports its component only when it runs (or when --help lists it).
LAZY_COMMANDS: dict[str, tuple[str, str, bool]] = {
    # name: (module, attribute, whether the attribute is a group whose command of that name runs)
    "gen": ("awm.synth.cli", "gen_app", False),
    "agent": ("awm.trainer.cli", "trainer_app", True),      # torch loads lazily inside
    "train": ("awm.trainer.cli", "trainer_app", True),
    "eval": ("awm.trainer.cli", "trainer_app", True),
    "verify": ("awm.trainer.cli", "trainer_app", True),
    "warmstart": ("awm.trainer.cli", "trainer_app", True),
    "operator": ("awm_operator.cli", "operator_app", False),  # kopf loads lazily inside
    "openenv": ("awm.integrations.cli", "openenv_app", False),  # openenv-core loads lazily inside
    "ui": ("awm.ui.cli", "ui_command", False),               # starlette and uvicorn when it runs
}


class _LazyGroup(TyperGroup):
    """The root command: its own commands, plus :data:`LAZY_COMMANDS` imported on first use."""

    def list_commands(self, ctx: Any) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in LAZY_COMMANDS:
            return super().get_command(ctx, cmd_name)
        module, attribute, merged = LAZY_COMMANDS[cmd_name]
        target = getattr(importlib.import_module(module), attribute)
        holder = typer.Typer(add_completion=False)  # registered as it would be on `app` itself
        if isinstance(target, typer.Typer):
            holder.add_typer(target, name=None if merged else cmd_name)
        else:
            holder.command(cmd_name)(target)
        command = typer.main.get_command(holder)
        # a Typer of one plain command is that command itself in some typer versions
        return command.get_command(ctx, cmd_name) if hasattr(command, "get_command") else command


app.info.cls = _LazyGroup

console = Console()
err = Console(stderr=True, soft_wrap=True)  # an error line stays one line in logs

CatalogOpt = Annotated[str, typer.Option("--catalog", "-c", help="Catalog directory or archive ('starter' = built in).")]
DbUrlOpt = Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                 help="External Postgres admin DSN (default: embedded server).")]


def _load(catalog: str, names: list[str] | None = None):  # type: ignore[no-untyped-def]
    try:
        return catalog_mod.load(catalog, names or None)
    except catalog_mod.CatalogError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc


def _imported(src: Path, database_url: str | None) -> Path:
    """An AgentWorldModel-1K directory's catalog: imported once, then found by content."""
    from awm.fleet import Database
    from awm.importers.awm1k import SourceError, import_cached

    database = Database.open(database_url)
    try:
        with console.status(f"importing {src} (once: cached by content)..."):
            imported = import_cached(src, admin_dsn=database.admin_dsn)
    except SourceError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    finally:
        database.close(keep_running=True)
    totals = imported.report.get("totals", {})
    err.print(f"{src}: {totals.get('imported')}/{totals.get('environments')} environments "
              f"({'imported now' if imported.fresh else 'cached'}: {imported.catalog / 'report.json'})")
    return imported.catalog


@app.command()
def demo(
    catalog: CatalogOpt = "starter",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Only these environments.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object instead of a table.")] = False,
    database_url: DbUrlOpt = None,
    judge_base_url: JudgeUrlOpt = None,
    judge_model: JudgeModelOpt = None,
    judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
    allow_ungated: UngatedOpt = False,
) -> None:
    """Serve the catalog locally and run every gated task's reference solution through MCP (no LLM)."""
    from awm.demo import run_catalog

    bundles = _load(catalog, env)
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, allow_ungated)
    results, totals = asyncio.run(run_catalog(bundles, database_url, show_progress=not as_json, **serving))
    envs = [r.summary() for r in results]
    if as_json:
        print(json.dumps({"environments": envs, "totals": totals}, indent=2))
    else:
        table = Table(title="awm demo: reference solutions replayed through MCP")
        for col in ("environment", "tools", "tasks", "passed", "reset p50 ms", "tool-call p50 ms", "episodes/s"):
            table.add_column(col, justify="left" if col == "environment" else "right")
        for e in envs:
            style = "green" if e["passed"] == e["tasks"] else "red"
            table.add_row(e["name"], str(e["tools"]), str(e["tasks"]), f"[{style}]{e['passed']}[/{style}]",
                          _fmt(e["reset_p50_ms"]), _fmt(e["tool_call_p50_ms"]), _fmt(e["episodes_per_s"]))
        table.add_section()
        table.add_row("total", str(totals["tools"]), str(totals["tasks"]), str(totals["passed"]),
                      _fmt(totals["reset_p50_ms"]), _fmt(totals["tool_call_p50_ms"]), _fmt(totals["episodes_per_s"]))
        console.print(table)
        if totals.get("ungated_skipped"):
            console.print(f"[yellow]{totals['ungated_skipped']} task(s) skipped: they have not passed both gates "
                          "(awm catalog validate --record, or --allow-ungated)[/yellow]")
        for e in envs:
            for f in e["failures"]:
                console.print(f"[red]FAILED[/red] {e['name']}/{f['task']}: {f['verdict']}: {f['reason']}")
    if totals["passed"] != totals["tasks"]:
        raise typer.Exit(1)


def _fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _gate_summary(bundles: list, verifier_kind: str | None, allow_ungated: bool) -> None:  # type: ignore[type-arg]
    """Say, before serving, how many tasks pass their gates and what happens to the others."""
    from awm.gates import gate_status

    for bundle in bundles:
        ungated = [t.id for t in bundle.tasks if not gate_status(bundle, t, verifier_kind)[0]]
        if ungated:
            what = "served, marked ungated" if allow_ungated else "refused (--allow-ungated serves them)"
            err.print(f"[yellow]{bundle.name}[/yellow]: {len(ungated)}/{len(bundle.tasks)} task(s) have not passed "
                      f"both gates: {what}")


@app.command()
def serve(
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Environments to serve (default: all).")] = None,
    replicas: Annotated[int, typer.Option("--replicas", "-n", min=1, help="Instances per environment.")] = 1,
    instances: Annotated[Optional[int], typer.Option(
        "--instances", min=1, help="Instances in all, each serving any environment of the catalog "
        "(late binding; they start on the environments in turn). Instead of --replicas.")] = None,
    pinned: Annotated[bool, typer.Option(
        "--pinned", help="Each instance serves only the environment it starts on (no late binding).")] = False,
    cache_envs: Annotated[int, typer.Option(
        min=1, help="Late binding: environments an instance keeps ready (database, bundle) after a switch.")] = 4,
    catalog: CatalogOpt = "starter",
    awm_data: Annotated[Optional[Path], typer.Option(
        "--awm-data", help="An AgentWorldModel-1K directory (gen_*.jsonl) instead of --catalog: imported "
        "once, cached by content (implies --allow-ungated: its tasks have no reference solutions).")] = None,
    host: Annotated[str, typer.Option(help="Bind address of every instance.")] = "127.0.0.1",
    database_url: DbUrlOpt = None,
    verifier_workers: Annotated[int, typer.Option(min=1, help="Warm verifier workers per instance.")] = 1,
    as_json: Annotated[bool, typer.Option("--json", help="Print the instances as JSON lines.")] = False,
    allowed_host: Annotated[Optional[list[str]], typer.Option(
        help="Another Host name the instances answer to, besides loopback names and the bind address "
             "(repeatable; '*' wildcards; also AWM_ALLOWED_HOSTS, comma-separated).")] = None,
    allowed_origin: Annotated[Optional[list[str]], typer.Option(
        help="A browser Origin the instances trust besides their own, e.g. https://ui.example.com "
             "(repeatable; also AWM_ALLOWED_ORIGINS).")] = None,
    judge_base_url: JudgeUrlOpt = None,
    judge_model: JudgeModelOpt = None,
    judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
    allow_ungated: UngatedOpt = False,
) -> None:
    """Start N instances of the chosen environments as local processes on one Postgres.

    Instances bind environments late (unless --pinned): each starts on one environment and
    switches to another when a claim asks for it (POST /bind on its control API, or /reset with
    "env"), with a fresh database of that environment from the fleet's provisioner.

    Every instance refuses requests whose Host or Origin header is not its own (DNS-rebinding
    protection, required by the MCP specification): 421 for a Host, 403 for an Origin."""
    from awm.fleet import Database, LocalFleet

    if awm_data is not None:
        catalog, allow_ungated = str(_imported(awm_data, database_url)), True
    bundles = _load(catalog, env)
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, allow_ungated)
    _gate_summary(bundles, verifier_kind, allow_ungated)

    async def run() -> None:
        database = await asyncio.to_thread(Database.open, database_url)
        if pinned and instances is not None:
            raise typer.BadParameter("--instances needs late binding; leave out --pinned")
        fleet = LocalFleet(bundles, replicas, database, verifier_workers=verifier_workers, host=host,
                           allowed_hosts=allowed_host, allowed_origins=allowed_origin,
                           binding="pinned" if pinned else "late", instances=instances, cache_envs=cache_envs,
                           **serving)
        try:
            with console.status(f"starting {instances or len(bundles) * replicas} instances..."):
                await fleet.start()
            late = fleet.binding == "late"
            if as_json:
                # A late-binding instance also says what it can switch to (PoolSource.from_json_lines).
                names = {"catalog": [b.name for b in bundles]} if late else {}
                for h in fleet.instances:
                    print(json.dumps({"env": h.env, "instance": h.name, "mcp_url": h.mcp_url,
                                      "control_url": h.control_url, "pid": h.pid, "late_binding": late, **names}),
                          flush=True)
            else:
                how = f"any of {len(bundles)} environments (late binding)" if late else "one environment each"
                table = Table(title=f"awm serve: {len(fleet.instances)} instances, {how} (Ctrl-C stops them)")
                for col in ("environment", "instance", "MCP (agent)", "control (trainer)"):
                    table.add_column(col)
                for h in fleet.instances:
                    table.add_row(h.env, h.name, h.mcp_url, h.control_url)
                console.print(table)
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.add_signal_handler(sig, stop.set)
            await stop.wait()
        finally:
            await fleet.stop()
            await asyncio.to_thread(database.close)

    asyncio.run(run())


@catalog_app.command("list")
def catalog_list(catalog: CatalogOpt = "starter") -> None:
    """List the environments of a catalog."""
    table = Table()
    for col in ("name", "tools", "tasks", "tables", "seed rows", "source"):
        table.add_column(col)
    for entry in catalog_mod.entries(catalog):
        b = entry.bundle
        if b is None:
            table.add_row(entry.name, "-", "-", "-", "-", f"[red]{(entry.error or '').splitlines()[0]}[/red]")
            continue
        table.add_row(b.name, str(len(b.tools)), str(len(b.tasks)), str(len(b.database.seed)),
                      str(sum(len(t.rows) for t in b.database.seed)), entry.source.name)
    console.print(table)


@catalog_app.command("show")
def catalog_show(
    name: str,
    catalog: CatalogOpt = "starter",
    as_json: Annotated[bool, typer.Option("--json", help="Print the whole bundle as JSON.")] = False,
) -> None:
    """Show one environment: scenario, tools and tasks."""
    bundle = _load(catalog, [name])[0]
    if as_json:
        print(bundle.model_dump_json(indent=2))
        return
    console.print(f"[bold]{bundle.name}[/bold]: {bundle.scenario.description}\n")
    tools = Table(title="tools")
    tools.add_column("name")
    tools.add_column("arguments")
    tools.add_column("description")
    for t in bundle.tools:
        req = set(t.input_schema.get("required", []))
        args = ", ".join(f"{k}{'' if k in req else '?'}" for k in t.input_schema.get("properties", {}))
        tools.add_row(t.name, args, t.description.splitlines()[0])
    console.print(tools)
    tasks = Table(title="tasks")
    tasks.add_column("id")
    tasks.add_column("instruction")
    tasks.add_column("solution steps", justify="right")
    for task in bundle.tasks:
        tasks.add_row(task.id, task.instruction, str(len(task.solution)))
    console.print(tasks)


@catalog_app.command("validate")
def catalog_validate(
    catalog: CatalogOpt = "starter",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Only these environments.")] = None,
    database_url: DbUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    static_only: Annotated[bool, typer.Option("--static", help="Check the bundles without serving them.")] = False,
    record: Annotated[bool, typer.Option("--record", help="Store each task's gate record in the catalog "
                                                          "(what serving checks).")] = False,
    judge_base_url: JudgeUrlOpt = None,
    judge_model: JudgeModelOpt = None,
    judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None,
) -> None:
    """Check bundles, then serve them and run both gates for every task: the verifier must say
    'not complete' on the untouched snapshot and 'complete' after the reference solution. With
    --record, the results become the tasks' gate records."""
    from awm.demo import run_catalog

    entries = [e for e in catalog_mod.entries(catalog) if not env or e.name in env]
    broken = [e for e in entries if e.bundle is None]
    for e in broken:
        err.print(f"[red]invalid[/red] {e.name}: {e.error}")
    bundles = [e.bundle for e in entries if e.bundle is not None]
    if static_only or not bundles:
        console.print(f"{len(bundles)} bundles parse; {len(broken)} invalid")
        raise typer.Exit(1 if broken or not bundles else 0)
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, True)
    results, totals = asyncio.run(run_catalog(bundles, database_url, negative_gate=True, show_progress=not as_json,
                                              **serving))
    if record:
        for entry, result in zip([e for e in entries if e.bundle is not None], results):
            path = _record_gates(entry, result, verifier_kind)
            err.print(f"recorded the gates of {entry.name} in {path}")
    report, failed = [], bool(broken)
    for r, b in zip(results, bundles):
        bad_tools = sorted(set(r.served_tools) ^ {t.name for t in b.tools})
        failures = [{"task": e.task_id, "gate": "untouched", "verdict": e.verdict, "reason": e.reason}
                    for e in r.negatives if not e.ok]
        failures += [{"task": e.task_id, "gate": "solution", "verdict": e.verdict, "reason": e.reason}
                     for e in r.episodes if not e.ok]
        failed |= bool(failures or bad_tools)
        report.append({"env": r.name, "tools": r.tools, "tasks": r.tasks,
                       "untouched_gate_passed": r.negatives_passed, "solution_gate_passed": r.passed,
                       "tool_mismatch": bad_tools, "failures": failures})
    if as_json:
        print(json.dumps({"environments": report, "invalid": [e.name for e in broken]}, indent=2))
    else:
        table = Table(title="awm catalog validate")
        for col in ("environment", "tools", "tasks", "untouched → not complete", "solution → complete"):
            table.add_column(col)
        for item in report:
            table.add_row(item["env"], str(item["tools"]), str(item["tasks"]),
                          f"{item['untouched_gate_passed']}/{item['tasks']}", f"{item['solution_gate_passed']}/{item['tasks']}")
        console.print(table)
        for item in report:
            if item["tool_mismatch"]:
                console.print(f"[red]FAILED[/red] {item['env']}: served tools differ: {item['tool_mismatch']}")
            for f in item["failures"]:
                console.print(f"[red]FAILED[/red] {item['env']}/{f['task']} ({f['gate']} gate): {f['verdict']}: {f['reason']}")
    raise typer.Exit(1 if failed else 0)


def _record_gates(entry, result, verifier_kind: str | None) -> Path:  # type: ignore[no-untyped-def]
    from awm.authoring import is_source_dir, write_gates
    from awm.demo import record_results

    bundle = entry.bundle
    record_results(bundle, result, verifier_kind)
    if is_source_dir(entry.source):
        return write_gates(entry.source, bundle)
    entry.source.write_text(bundle.model_dump_json(indent=1))
    return entry.source


@catalog_app.command("schema")
def catalog_schema(output: Annotated[Optional[Path], typer.Option("--output", "-o")] = None) -> None:
    """Print (or write) the bundle format's JSON Schema."""
    text = json.dumps(bundle_json_schema(), indent=2) + "\n"
    if output:
        output.write_text(text)
    else:
        print(text, end="")


@catalog_app.command("export")
def catalog_export(
    target: Annotated[Optional[str], typer.Argument(
        metavar="[OUTPUT|CATALOG]", help="The directory to write into; with --out, the catalog to export.")] = None,
    catalog: Annotated[Optional[str], typer.Option("--catalog", "-c", help="Catalog directory or archive "
                                                   "('starter' = built in, the default).")] = None,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="The directory to write into (then the "
                                                "argument, if any, names the catalog).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="bundle: <env>.json bundles and index.json (what fleets "
                                     "ship to pods); awm: the AWM-1K release files (gen_*.jsonl).")] = "bundle",
) -> None:
    """Write a catalog as bundle JSON files plus index.json (the list an EnvFleet's
    environmentSelector chooses from), or in the AWM-1K format (environments from an AWM import).
    Either `export OUTPUT [--catalog C]` or `export --out OUTPUT [C]`."""
    from awm.catalog import INDEX, index

    if out is None and target is None:
        err.print("[red]error:[/red] where to? give OUTPUT or --out DIR")
        raise typer.Exit(2)
    if out is not None and target is not None and catalog is not None:
        err.print("[red]error:[/red] with --out, name the catalog once (argument or --catalog)")
        raise typer.Exit(2)
    output = out if out is not None else Path(target)  # type: ignore[arg-type]
    source = (target if out is not None else None) or catalog or "starter"
    bundles = _load(source)
    if fmt == "awm":
        from awm.importers.awm1k_export import export_catalog

        report = export_catalog(bundles, output)
        (output / "export-report.json").write_text(json.dumps(report.to_json(), indent=2))
        console.print(f"wrote {len(report.exported)} environment(s) in the AWM format to {output}")
        for name, why in report.refused.items():
            err.print(f"[yellow]not exported[/yellow] {name}: {why}")
        for name, lost in report.lost.items():
            err.print(f"[yellow]not in the AWM format[/yellow] {name}: {'; '.join(lost)}")
        raise typer.Exit(0 if report.exported else 1)
    if fmt != "bundle":
        err.print(f"[red]error:[/red] --format must be bundle or awm, not {fmt!r}")
        raise typer.Exit(2)
    output.mkdir(parents=True, exist_ok=True)
    for bundle in bundles:
        (output / f"{bundle.name}.json").write_text(bundle.model_dump_json(indent=1))
        console.print(f"wrote {output / (bundle.name + '.json')}")
    (output / INDEX).write_text(json.dumps(index(bundles), indent=1))
    console.print(f"wrote {output / INDEX} ({len(bundles)} environments)")


@catalog_app.command("split")
def catalog_split(
    catalog: Annotated[str, typer.Argument(help="Catalog directory or archive ('starter' = built in).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write train/, test/ and split.json into.")],
    test: Annotated[float, typer.Option("--test", help="Fraction of environments held out for test.")] = 0.1,
    test_count: Annotated[Optional[int], typer.Option("--test-count", help="Hold out exactly this many "
                                                      "environments (instead of --test).")] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the shuffle: the same seed, the same split.")] = 0,
) -> None:
    """Split a catalog by environment into train/ and test/ catalogs (each <env>.json bundles and
    index.json), seeded, for the paper's protocol: train on some environments, evaluate on
    environments never seen. split.json records the seed and both lists."""
    bundles = {b.name: b for b in _load(catalog)}
    try:
        train, held_out = catalog_mod.split(list(bundles), test, seed, test_count)
    except catalog_mod.CatalogError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    for part, names in (("train", train), ("test", held_out)):
        directory = out / part
        directory.mkdir(parents=True, exist_ok=True)
        for name in names:
            (directory / f"{name}.json").write_text(bundles[name].model_dump_json(indent=1))
        (directory / catalog_mod.INDEX).write_text(json.dumps(catalog_mod.index([bundles[n] for n in names]), indent=1))
    record = {"catalog": str(catalog), "seed": seed, "test_fraction": None if test_count is not None else test,
              "train": train, "test": held_out,
              "tasks": {"train": sum(len(bundles[n].tasks) for n in train),
                        "test": sum(len(bundles[n].tasks) for n in held_out)}}
    (out / "split.json").write_text(json.dumps(record, indent=1))
    console.print(f"{len(train)} environments ({record['tasks']['train']} tasks) in {out / 'train'}, "
                  f"{len(held_out)} ({record['tasks']['test']} tasks) in {out / 'test'}; seed {seed}")


@catalog_app.command("select")
def catalog_select(
    catalog: Annotated[str, typer.Argument(help="Catalog directory or archive (e.g. a split's train/).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write the selected catalog and selection.json into.")],
    envs: Annotated[Optional[int], typer.Option("--envs", min=1, help="At most this many environments (a seeded "
                                                "choice of those the filters keep; the paper: 526).")] = None,
    min_tasks: Annotated[int, typer.Option("--min-tasks", min=1, help="Leave out an environment with fewer "
                                           "tasks left.")] = 1,
    max_tasks: Annotated[Optional[int], typer.Option("--max-tasks", min=1, help="At most this many tasks of an "
                                                     "environment (a seeded choice).")] = None,
    gates: Annotated[bool, typer.Option("--gates/--no-gates", help="Keep only tasks whose gates passed for the "
                                        "verifier served.")] = True,
    verifier_kind: KindOpt = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the choices: the same seed, the same subset.")] = 0,
) -> None:
    """The training subset (the paper trained on 526 environments, 3,315 tasks): tasks whose
    verifier can be believed (not complete on the untouched snapshot; gates passed), environments
    with enough of them, then a seeded choice. Writes a catalog of the chosen environments with
    the chosen tasks, and selection.json with the filters, the counts left out by reason and every
    choice."""
    from awm.selection import Filters, select

    filters = Filters(gates=gates, verifier_kind=verifier_kind, min_tasks=min_tasks, max_tasks=max_tasks,
                      envs=envs, seed=seed)
    chosen = select(_load(catalog), filters)
    if not chosen.bundles:
        err.print(f"[red]error:[/red] no environment left: tasks left out {dict(chosen.dropped_tasks)}, "
                  f"environments {dict(chosen.dropped_envs)}")
        raise typer.Exit(2)
    out.mkdir(parents=True, exist_ok=True)
    for bundle in chosen.bundles:
        (out / f"{bundle.name}.json").write_text(bundle.model_dump_json(indent=1))
    (out / catalog_mod.INDEX).write_text(json.dumps(catalog_mod.index(chosen.bundles), indent=1))
    record = chosen.record(filters, str(catalog))
    (out / catalog_mod.SELECTION).write_text(json.dumps(record, indent=1))
    console.print(f"{record['environments']} environments, {record['tasks']} tasks in {out}; left out: "
                  f"tasks {record['dropped_tasks'] or 'none'}, environments {record['dropped_environments'] or 'none'}")


@catalog_app.command("import")
def catalog_import(
    src: Annotated[Path, typer.Argument(help="Directory in the AWM-1K release format (gen_*.jsonl).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory to write <env>.json bundles and report.json into.")],
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Only these scenarios.")] = None,
    now: Annotated[Optional[str], typer.Option(help="Reference instant for datetime('now') in seed rows "
                                                    "(ISO; default: today 00:00 UTC).")] = None,
    no_check: Annotated[bool, typer.Option("--no-check", help="Skip running verifiers on the untouched snapshot.")] = False,
    prefer: Annotated[str, typer.Option("--prefer", help="Primary verifier of a task that has both: code (the "
                                        "pure-code file) or judge (sql mode, for the LLM judge).")] = "code",
    jobs: Annotated[Optional[int], typer.Option("--jobs", "-j", min=1, help="Environments imported at once "
                                                "(default: the number of CPUs).")] = None,
    database_url: DbUrlOpt = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Import AWM-1K environments (FastAPI apps, SQLite data, code and sql-mode verifiers) into a catalog."""
    import datetime as dt

    from awm.importers.awm1k import SourceError, import_awm_dir, print_report

    if prefer not in ("code", "judge"):
        err.print(f"[red]error:[/red] --prefer must be code or judge, not {prefer!r}")
        raise typer.Exit(2)

    try:
        reference = dt.datetime.fromisoformat(now) if now else None
        with console.status("importing...") as status:
            report = import_awm_dir(src, out, admin_dsn=database_url, now=reference, envs=env or None,
                                    check=not no_check, prefer=prefer, jobs=jobs,
                                    progress=lambda s: status.update(f"importing {s}..."))
    except (SourceError, ValueError) as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    if as_json:
        print(json.dumps(report.to_json(), indent=2, default=str))
    else:
        print_report(report, console)
        console.print(f"wrote {report.totals['imported']} bundles and {out / 'report.json'}")
    raise typer.Exit(0 if report.totals["imported"] else 1)


@env_app.command("check")
def env_check(
    url: Annotated[str, typer.Argument(help="MCP URL of an instance, e.g. http://127.0.0.1:8000/mcp")],
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the server.")] = 10.0,
) -> None:
    """Connect over MCP and list the instance's tools."""
    from awm.client import McpError, McpSession

    async def run() -> list[dict]:
        async with McpSession(url, timeout=timeout) as session:
            return await session.list_tools()

    try:
        tools = asyncio.run(run())
    except McpError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    table = Table(title=f"{len(tools)} tools at {url}")
    table.add_column("tool")
    table.add_column("required arguments")
    table.add_column("description")
    for t in tools:
        table.add_row(t["name"], ", ".join(t.get("inputSchema", {}).get("required", [])),
                      (t.get("description") or "").splitlines()[0] if t.get("description") else "")
    console.print(table)


@env_app.command("call")
def env_call(
    url: Annotated[str, typer.Argument(help="MCP URL of an instance, e.g. http://10.85.0.7:8000/mcp")],
    tool: Annotated[str, typer.Argument(help="Tool name (see `awm env check`).")],
    arguments: Annotated[str, typer.Argument(help="Arguments as a JSON object.")] = "{}",
    timeout: Annotated[float, typer.Option(help="Seconds to wait for the server.")] = 30.0,
) -> None:
    """Call one tool over MCP and print its result (exit 1 if the tool reports an error)."""
    from awm.client import McpError, McpSession

    try:
        args = json.loads(arguments)
    except json.JSONDecodeError as exc:
        err.print(f"[red]error:[/red] arguments are not JSON: {exc}")
        raise typer.Exit(2) from exc
    if not isinstance(args, dict):
        err.print("[red]error:[/red] arguments must be a JSON object")
        raise typer.Exit(2)

    async def run():
        async with McpSession(url, timeout=timeout) as session:
            return await session.call_tool(tool, args)

    try:
        outcome = asyncio.run(run())
    except McpError as exc:
        err.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from exc
    print(outcome.text)
    raise typer.Exit(1 if outcome.is_error else 0)


@pg_app.command("start")
def pg_start() -> None:
    """Start the embedded server (it keeps running until `awm postgres stop`)."""
    from awm.postgres.server import EmbeddedPostgres

    pg = EmbeddedPostgres.default()
    started = pg.start()
    console.print(f"{'started' if started else 'already running'}: PostgreSQL {pg.version()} in {pg.root}")


@pg_app.command("stop")
def pg_stop() -> None:
    """Stop the embedded server."""
    from awm.postgres.server import EmbeddedPostgres

    EmbeddedPostgres.default().stop()
    console.print("stopped")


@pg_app.command("status")
def pg_status() -> None:
    """Say whether the embedded server runs, and where it keeps its data."""
    from awm.postgres.server import EmbeddedPostgres

    pg = EmbeddedPostgres.default()
    console.print(f"{'running' if pg.is_running() else 'stopped'}: {pg.root}")


@pg_app.command("gc")
def pg_gc(database_url: DbUrlOpt = None) -> None:
    """Drop the instance databases of local fleets on this host whose process is gone (a fleet
    that was killed could not drop its own). Databases of live fleets and of pods are kept."""
    from awm.fleet import Database, reap_abandoned

    db = Database.open(database_url)
    try:
        dropped = reap_abandoned(db.admin_dsn)
    finally:
        db.close(keep_running=True)
    console.print(f"dropped {len(dropped)} abandoned instance databases")


@pg_app.command("provision-instance")
def pg_provision_instance(
    bundle: Annotated[Path, typer.Option("--bundle", help="The environment's bundle (JSON).")],
    name: Annotated[str, typer.Option("--name", help="Pod name: the database is awm_i_<name>.")],
    dsn_file: Annotated[Path, typer.Option("--dsn-file", help="Where to write the instance DSN (mode 0600).")],
    admin_dsn: Annotated[str, typer.Option("--admin-dsn", envvar=settings.names.AWM_ADMIN_DSN, show_envvar=True,
                                           help="Admin DSN (CREATEDB, CREATEROLE); set it via the environment.")],
    fleet: Annotated[str, typer.Option("--fleet", envvar=settings.names.AWM_FLEET, help="Recorded with the database.")] = "",
    namespace: Annotated[str, typer.Option("--namespace", envvar="POD_NAMESPACE", help="Recorded with the database.")] = "",
) -> None:
    """A pod's init container: ensure the environment's template, clone the instance database
    and its role from it, and write the instance DSN to a file only the env server reads (pods
    run the same thing as ``python -m awm.postgres.provision``, which starts faster)."""
    from awm.postgres import provision

    dbname = provision.provision_pod(str(bundle), name, str(dsn_file), admin_dsn, fleet, namespace)
    err.print(f"provisioned {dbname}")


def main() -> None:  # pragma: no cover
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    app()


if __name__ == "__main__":  # pragma: no cover
    main()
