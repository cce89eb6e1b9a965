"""``awm openenv serve``: an OpenEnv environment server in front of a local fleet."""

from __future__ import annotations

import asyncio
from typing import Annotated, Optional

import typer
from rich.console import Console

from awm.serveopts import JudgeModelOpt, JudgeUrlOpt, JudgeVotesOpt, KindOpt, UngatedOpt, serving_options

openenv_app = typer.Typer(help="Serve awm environments through OpenEnv's environment API.", no_args_is_help=True)
console = Console(stderr=True)


@openenv_app.command("serve")
def serve(
    catalog: Annotated[str, typer.Option("--catalog", "-c", help="Catalog ('starter' = built in).")] = "starter",
    env: Annotated[Optional[list[str]], typer.Option("--env", "-e", help="Environments (default: all).")] = None,
    replicas: Annotated[int, typer.Option("--replicas", "-n", min=1, help="Instances per environment = "
                                          "concurrent OpenEnv sessions per environment.")] = 2,
    host: Annotated[str, typer.Option(help="Bind address of the OpenEnv server.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port of the OpenEnv server.")] = 8000,
    max_steps: Annotated[int, typer.Option(help="Tool calls before an episode ends unanswered.")] = 30,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar="AWM_DATABASE_URL")] = None,
    judge_base_url: JudgeUrlOpt = None, judge_model: JudgeModelOpt = None, judge_votes: JudgeVotesOpt = 1,
    verifier_kind: KindOpt = None, allow_ungated: UngatedOpt = False,
) -> None:
    """Start a local fleet and serve it at ws://HOST:PORT/ws (OpenEnv's reset / step / state;
    actions: list_tools, call_tool, and {"answer": ...} to end an episode)."""
    import uvicorn

    from awm import catalog as catalog_mod
    from awm.fleet import Database, LocalFleet
    from awm.episode.sources import PoolSource
    from awm.integrations.openenv_server import build_app

    bundles = catalog_mod.load(catalog, env or None)
    serving = serving_options(judge_base_url, judge_model, judge_votes, verifier_kind, allow_ungated)

    async def run() -> None:
        database = await asyncio.to_thread(Database.open, database_url)
        try:
            async with LocalFleet(bundles, replicas, database, **serving) as fleet:
                pool = PoolSource.from_fleet(fleet)
                console.print(f"OpenEnv server on ws://{host}:{port}/ws: {len(fleet.instances)} instances of "
                              f"{', '.join(pool.envs())}")
                try:
                    await uvicorn.Server(uvicorn.Config(build_app(pool, max_steps), host=host, port=port,
                                                        log_level="warning")).serve()
                finally:
                    await pool.close()
        finally:
            await asyncio.to_thread(database.close)

    asyncio.run(run())
