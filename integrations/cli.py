"""``awm openenv serve``: an OpenEnv environment server in front of a local late-binding fleet."""

from __future__ import annotations

import asyncio
from enum import StrEnum
from pathlib import Path
from typing import Annotated, Any, Optional

import typer
from rich.console import Console

from awm import settings
from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, UngatedOpt, serving_options

openenv_app = typer.Typer(help="Serve awm environments through OpenEnv's environment API.", no_args_is_help=True)
console = Console(stderr=True)


class Protocol(StrEnum):
    """Which OpenEnv environment the server is: ``agent_world_model`` answers OpenEnv's AWM
    environment (its ``AWMEnv`` client: ``reset(scenario=, task_idx=)``, ``verify``, ``done``...);
    ``awm`` is awm's own MCP environment (``reset(env=, task_id=)``, ``{"answer": ...}``)."""

    AGENT_WORLD_MODEL = "agent_world_model"
    AWM = "awm"


@openenv_app.command("serve")
def serve(
    awm_data: Annotated[Optional[Path], typer.Option(
        "--awm-data", envvar=settings.names.AWM_DATA_DIR,
        help="An AgentWorldModel-1K directory (gen_*.jsonl) served as it is: every scenario on demand, each "
        "imported at its first reset and cached by content (implies --allow-ungated).")] = None,
    catalog: Annotated[str, typer.Option("--catalog", "-c", help="Catalog ('starter' = built in), when no "
                                         "--awm-data.")] = "starter",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Environments (default: all).")] = None,
    protocol: Annotated[Protocol, typer.Option(help="agent_world_model: OpenEnv's AWM environment protocol; "
                                               "awm: awm's own OpenEnv environment.")] = Protocol.AGENT_WORLD_MODEL,
    instances: Annotated[int, typer.Option("--instances", "-n", min=1, help="Instances in all, each switched to "
                                           "any environment on claim: the sessions that hold an episode at once "
                                           "(more wait in reset).")] = 8,
    host: Annotated[str, typer.Option(help="Bind address of the OpenEnv server.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the OpenEnv server.")] = 8000,
    max_sessions: Annotated[int, typer.Option(min=1, help="Open WebSocket sessions at most.")] = 10_000,
    idle_timeout: Annotated[float, typer.Option(help="Seconds without a message after which a session's "
                                                "instance is released.")] = 600.0,
    claim_timeout: Annotated[float, typer.Option(help="Seconds a reset waits for a free instance.")] = 600.0,
    max_steps: Annotated[int, typer.Option(help="protocol awm: tool calls before an episode ends unanswered.")] = 30,
    import_all: Annotated[bool, typer.Option("--import-all", help="--awm-data: import every scenario before "
                                             "serving (the whole report at once) instead of each at its first "
                                             "reset.")] = False,
    jobs: Annotated[Optional[int], typer.Option(min=1, help="--import-all: environments imported at once.")] = None,
    spare_workers: Annotated[int, typer.Option(min=0, max=1, help="Tool workers each instance forks ahead of its "
                                               "next episode: 1, a reset never waits for a fork; 0, one "
                                               "worker (~20 MB for an AWM app) less per instance.")] = 1,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL)] = None,
    judge_base_url: JudgeUrlOpt = None, judge_model: JudgeModelOpt = None, judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None, allow_ungated: UngatedOpt = False,
) -> None:
    """Start a late-binding local fleet and serve it at ws://HOST:PORT/ws."""
    import uvicorn

    from awm import catalog as catalog_mod
    from awm.episode.sources import PoolSource
    from awm.fleet import Database, LocalFleet

    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind,
                              allow_ungated or awm_data is not None)
    serving["spare_workers"] = spare_workers

    async def run() -> None:
        database = await asyncio.to_thread(Database.open, database_url)
        try:
            release = None
            if awm_data is not None and (import_all or protocol is Protocol.AWM):
                bundles, scenarios = await asyncio.to_thread(_release, awm_data, database.admin_dsn, jobs)
            elif awm_data is not None:
                release, bundles, scenarios = await _on_demand(awm_data, database.admin_dsn)
            else:
                from awm.integrations.openenv_awm import scenarios_from

                bundles = catalog_mod.load(catalog, env or None)
                scenarios = scenarios_from(bundles)
            try:
                async with LocalFleet(bundles, 1, database, binding="late", instances=instances, **serving) as fleet:
                    pool = PoolSource.from_fleet(fleet, claim_timeout_s=claim_timeout)
                    app = _app(protocol, pool, scenarios, max_steps, max_sessions, idle_timeout, claim_timeout,
                               fleet, release)
                    served = sum(1 for s in scenarios.values() if s.env or s.pending)
                    console.print(f"OpenEnv server ({protocol.value}) on ws://{host}:{port}/ws: "
                                  f"{len(fleet.instances)} instances serving {served} scenarios"
                                  + (" (each imported at its first reset, then cached)" if release else ""))
                    try:
                        await uvicorn.Server(uvicorn.Config(app, host=host, port=port, log_level="warning",
                                                            ws_ping_interval=20.0, ws_ping_timeout=20.0)).serve()
                    finally:
                        await pool.close()
            finally:
                if release is not None:
                    release.close()
        finally:
            await asyncio.to_thread(database.close)

    asyncio.run(run())


def _release(src: Path, admin_dsn: str, jobs: int | None) -> tuple[list[Any], dict[str, Any]]:
    """An AgentWorldModel-1K directory's bundles (imported once per content) and its scenarios."""
    from awm import catalog as catalog_mod
    from awm.importers.awm1k import SourceError, import_cached, source_scenarios
    from awm.integrations.openenv_awm import scenarios_from

    try:
        with console.status(f"importing {src} (once: cached by content)...") as status:
            imported = import_cached(src, admin_dsn=admin_dsn, jobs=jobs,
                                     progress=lambda s: status.update(f"importing {s}..."))
    except SourceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    totals = imported.report.get("totals", {})
    skipped = [e for e in imported.report.get("environments", []) if e.get("status") != "imported"]
    if imported.fresh:  # the flaws are said once, when they are found; report.json keeps them all
        console.print(f"imported {totals.get('imported')}/{totals.get('environments')} environments into "
                      f"{imported.catalog} ({totals.get('rows_rejected', 0)} rows rejected, "
                      f"{totals.get('complete_on_untouched', 0)} tasks complete on the untouched database)")
        for e in skipped:
            console.print(f"[red]not served[/red] {e['name']}: {e.get('reason')}")
    else:
        console.print(f"{src}: cached import {imported.catalog.name} ({totals.get('imported')}/"
                      f"{totals.get('environments')} environments; {len(skipped)} not served: see "
                      f"{imported.catalog / 'report.json'})")
    bundles = catalog_mod.load(imported.catalog)
    return bundles, scenarios_from(bundles, source_scenarios(src), imported.report)


async def _on_demand(src: Path, admin_dsn: str) -> tuple[Any, list[Any], dict[str, Any]]:
    """A release served on demand: its scenarios listed, the first one that imports made ready
    (the fleet's instances start on it), every other imported at its first reset."""
    from awm.importers.awm1k import Release, SourceError
    from awm.integrations.openenv_awm import pending_scenarios, scenarios_from

    try:
        release = await asyncio.to_thread(Release, src, admin_dsn)
    except SourceError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    scenarios = pending_scenarios(release)
    try:
        for source in release.scenarios:
            with console.status(f"importing {source.name} (the instances start on it)..."):
                bundle, report, _ = await release.load(source.name)
            if bundle is not None:
                scenarios.update(scenarios_from([bundle], [source]))
                return release, [bundle], scenarios
            console.print(f"[red]not served[/red] {source.name}: {report.reason}")
    except BaseException:
        release.close()
        raise
    release.close()
    console.print(f"[red]error:[/red] {src}: no scenario could be imported")
    raise typer.Exit(2)


def _app(protocol: Protocol, pool: Any, scenarios: dict[str, Any], max_steps: int, max_sessions: int,
         idle_timeout: float, claim_timeout: float, fleet: Any, release: Any) -> Any:
    if protocol is Protocol.AWM:
        from awm.integrations.openenv_server import build_app as build_awm_app

        return build_awm_app(pool, max_steps, max_sessions=max_sessions)
    from awm.integrations.openenv_awm import OnDemand, ProtocolServer, build_app

    return build_app(ProtocolServer(pool, scenarios, max_sessions=max_sessions, idle_timeout_s=idle_timeout,
                                    claim_timeout_s=claim_timeout,
                                    loader=OnDemand(release, fleet, pool) if release is not None else None))
