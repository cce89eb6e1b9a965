"""``awm ui``: the web view of runs, catalogs, the fleet and a playground (docs/ui.md).

Registered by awm/cli.py like the other upper layers' commands; this module imports only typer at
import time, the server's stack (starlette, uvicorn) loads when the command runs.
"""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console

from awm import settings

console = Console(stderr=True)


def _instance(spec: str):  # type: ignore[no-untyped-def]
    from awm.ui.fleet import UNKNOWN, Instance

    mcp, sep, control = spec.partition(",")
    if not sep or not mcp.startswith("http") or not control.startswith("http"):
        raise typer.BadParameter(f"--instance wants MCP_URL,CONTROL_URL, not {spec!r}")
    return Instance(env=UNKNOWN, name=control.rstrip("/").rsplit("/", 1)[-1] or control, mcp_url=mcp, control_url=control)


def ui_command(
    runs: Annotated[Optional[list[Path]], typer.Option("--runs", "-r", help=(
        "Directory holding run directories of awm train / awm eval (searched 4 levels deep; repeatable)."))] = None,
    catalog: Annotated[str, typer.Option("--catalog", "-c", help="Catalog to show ('starter' = built in).")] = "starter",
    serve: Annotated[Optional[list[str]], typer.Option("--serve", "-e", help=(
        "Start a local fleet of this catalog environment for the fleet page and the playground (repeatable)."))] = None,
    replicas: Annotated[int, typer.Option("--replicas", "-n", min=1, help="Instances per --serve environment.")] = 1,
    instance: Annotated[Optional[list[str]], typer.Option("--instance", help=(
        "A running instance as MCP_URL,CONTROL_URL (awm serve prints them; repeatable)."))] = None,
    operator_url: Annotated[Optional[str], typer.Option("--operator-url", envvar=settings.names.AWM_OPERATOR_URL, help=(
        "The operator's allocation API (fleet counts; token from AWM_API_TOKEN)."))] = None,
    fleet: Annotated[Optional[list[str]], typer.Option("--fleet", help="An EnvFleet as NAMESPACE/NAME (repeatable).")] = None,
    namespace: Annotated[Optional[list[str]], typer.Option("--namespace", help=(
        "Show every Campaign and EnvFleet of this namespace, live (repeatable; needs --operator-url)."))] = None,
    prometheus_url: Annotated[Optional[str], typer.Option("--prometheus-url", help=(
        "Prometheus for fleet-wide episodes/s and tool-call latency."))] = None,
    grafana_url: Annotated[Optional[str], typer.Option("--grafana-url", help=(
        "The awm Grafana dashboard (linked from the fleet page)."))] = None,
    host: Annotated[str, typer.Option(help="Bind address (the UI has no authentication: keep it local).")] = "127.0.0.1",
    allowed_host: Annotated[Optional[list[str]], typer.Option("--allowed-host", help=(
        "Another Host name the UI answers to (DNS-rebinding protection, as awm serve; also AWM_ALLOWED_HOSTS)."))] = None,
    port: Annotated[int, typer.Option(help="Port (0: any free one; the URL is printed).")] = 8090,
    database_url: Annotated[Optional[str], typer.Option("--database-url", envvar=settings.names.AWM_DATABASE_URL,
                                                        help="External Postgres admin DSN for --serve.")] = None,
    playground_ttl: Annotated[float, typer.Option("--playground-ttl", min=1.0, help=(
        "Seconds a playground session may stay idle before its instance is released."))] = 900.0,
    playground_claims: Annotated[bool, typer.Option("--playground-claims", help=(
        "Let the playground claim an instance of a --namespace EnvFleet from the operator, with the "
        "bearer token the person at the browser gives (the operator checks their RBAC, not the UI's)."))] = False,
) -> None:
    """Serve the web view: catalog, runs (reward curves, pass@k, episodes with per-call database
    diffs), fleet, and a playground that calls a real instance's tools."""
    import uvicorn

    from awm import catalog as catalog_mod
    from awm.envserver import hostguard
    from awm.ui.app import UiState, build_app
    from awm.ui.fleet import FleetView, Instance
    from awm.ui.runs import Runs

    static = [_instance(s) for s in instance or []]
    roots = [p.resolve() for p in (runs or [Path("runs")])]
    missing = [str(p) for p, given in zip(roots, runs or [None]) if not p.is_dir() and given is not None]
    if missing:  # a typo would otherwise start a UI that silently shows no run
        console.print(f"[red]error:[/red] --runs: no such directory: {', '.join(missing)}")
        raise typer.Exit(2)
    if (fleet or namespace) and not operator_url:
        console.print("[red]error:[/red] --fleet and --namespace read the operator's API: give --operator-url")
        raise typer.Exit(2)
    if playground_claims and not (operator_url and namespace):
        console.print("[red]error:[/red] --playground-claims claims from the EnvFleets of --namespace through "
                      "--operator-url: give both")
        raise typer.Exit(2)
    try:
        bundles = catalog_mod.load(catalog, serve) if serve else []
    except catalog_mod.CatalogError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from exc
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))

    async def run() -> None:
        from contextlib import AsyncExitStack

        from awm.fleet import Database, LocalFleet

        async with AsyncExitStack() as stack:
            found = list(static)
            if bundles:
                database = await asyncio.to_thread(Database.open, database_url)
                stack.push_async_callback(asyncio.to_thread, database.close)
                local = await stack.enter_async_context(LocalFleet(bundles, replicas, database, allow_ungated=True))
                found += [Instance(env=h.env, name=h.name, mcp_url=h.mcp_url, control_url=h.control_url)
                          for h in local.instances]
            view = FleetView(found, operator_url, fleet, prometheus_url, grafana_url, namespace)
            state = UiState(Runs(roots), catalog, view, playground_ttl, playground_claims)
            bound = sock.getsockname()
            url = f"http://{'[' + bound[0] + ']' if ':' in bound[0] else bound[0]}:{bound[1]}/"
            console.print(f"awm ui on {url} · runs under {', '.join(map(str, roots))} · catalog {catalog} · "
                          f"{len(found)} instance(s)")
            guard = hostguard.guard(hostguard.allowed_hosts([host], allowed_host or []), hostguard.allowed_origins())
            server = uvicorn.Server(uvicorn.Config(build_app(state, [guard]), log_level="warning"))
            await server.serve(sockets=[sock])

    asyncio.run(run())
