"""``python -m awm.envserver``: serve one environment instance.

    AWM_INSTANCE_DSN=... python -m awm.envserver --bundle env.json --name awm_i_shop_0 \
        --mcp-port 0 --control-port 0

The DSN comes from the environment, never argv (visible to every user in ``ps``), or from the
file named by ``AWM_INSTANCE_DSN_FILE`` (a Kubernetes pod's init container writes it there). Port 0 picks a
free port; once both servers listen the process prints one JSON line on stdout:
``{"event": "ready", "mcp_url": ..., "control_url": ...}``.

Both listeners refuse requests whose ``Host`` or ``Origin`` is not this server's (DNS-rebinding
protection, awm.envserver.hostguard): add names with ``--allowed-host`` / ``AWM_ALLOWED_HOSTS`` and
browser origins with ``--allowed-origin`` / ``AWM_ALLOWED_ORIGINS`` (comma-separated).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import logging
import os
import signal
import sys
from pathlib import Path

# The env server never reloads its code, but uvicorn imports its reloader, watchfiles, whenever it
# is installed (a development environment has it; the env image does not): 0.6 MB per instance.
sys.modules.setdefault("watchfiles", None)  # type: ignore[arg-type]

import uvicorn  # noqa: E402

from awm import catalog, settings
from awm.bundle import EnvBundle
from awm.judge import Judge, JudgeSettings
from awm.postgres.provisioner import SOCKET_ENV, ProvisionerClient
from awm.envserver import hostguard, listener
from awm.envserver.binding import DatabaseSource, ProvisionedDatabases
from awm.envserver.control import build_control
from awm.envserver.instance import EnvInstance
from awm.envserver.lifeline import die_with_parent
from awm.envserver.mcp import McpApp


def _port(server: uvicorn.Server) -> int:
    return int(server.servers[0].sockets[0].getsockname()[1])


def _read_secrets() -> dict[str, str]:
    """The secrets a local fleet passes on a pipe (``AWM_SECRETS_FD``, removed from the environment):
    a JSON object read once, the descriptor closed, nothing left in the process's environment block."""
    fd = settings.var.AWM_SECRETS_FD.raw()  # as set, for the message
    try:
        number = settings.var.AWM_SECRETS_FD.pop()  # a ValueError when not a number
        if number is None:
            return {}
        with os.fdopen(number, "r") as pipe:
            data = json.loads(pipe.read())
    except (OSError, ValueError) as exc:
        sys.exit(f"envserver: AWM_SECRETS_FD={fd}: cannot read the secrets: {type(exc).__name__}")
    return {k: v for k, v in data.items() if isinstance(k, str) and isinstance(v, str)} if isinstance(data, dict) else {}


def _databases(args: argparse.Namespace, secrets: dict[str, str]) -> tuple[str | None, DatabaseSource | None]:
    """The instance DSN of a pinned instance, or the provisioner of a late-binding one."""
    socket_path = args.provisioner or settings.AWM_PROVISIONER_SOCKET
    if socket_path:
        return None, ProvisionedDatabases(ProvisionerClient(socket_path, args.name or ""))
    dsn = secrets.get("dsn") or settings.var.AWM_INSTANCE_DSN.pop() or args.dsn
    dsn_file = settings.var.AWM_INSTANCE_DSN_FILE.pop()
    if not dsn and dsn_file:  # Kubernetes: written by the pod's provisioning init container
        dsn = dsn_file.read_text().strip()
    if not dsn:
        sys.exit("envserver: set AWM_INSTANCE_DSN (or AWM_INSTANCE_DSN_FILE) to the instance's database DSN, "
                 f"or {SOCKET_ENV} / --provisioner to bind environments late")
    return dsn, None


def _first_bundle(args: argparse.Namespace, root: Path | None) -> EnvBundle:
    if args.bundle:
        return EnvBundle.model_validate_json(Path(args.bundle).read_text())
    if root is None or not args.env:
        sys.exit("envserver: give --bundle, or --catalog and --env (the environment to serve first)")
    try:
        return catalog.find(root, args.env)
    except KeyError:
        sys.exit(f"envserver: --env {args.env!r} is not in the catalog {root}")


async def serve(args: argparse.Namespace) -> None:
    root = catalog.resolve(args.catalog) if args.catalog else None
    bundle = _first_bundle(args, root)
    secrets = _read_secrets()
    dsn, databases = _databases(args, secrets)
    if databases is not None and root is None:
        sys.exit("envserver: a late-binding instance (with a provisioner) needs --catalog")
    judge = None
    judge_config = judge_settings(args)
    if judge_config is not None:
        key = os.environ.pop(judge_config.api_key_env, "")  # read once; workers get an empty environment anyway
        key = secrets.get("judge_api_key") or key
        judge = Judge(judge_config, api_key=key)
    instance = EnvInstance(bundle, dsn, args.name or bundle.name, verifier_workers=args.verifier_workers,
                           allow_weak_isolation=args.allow_weak_isolation, judge=judge,
                           verifier_kind=args.verifier_kind, allow_ungated=args.allow_ungated,
                           databases=databases, catalog=(lambda env: catalog.find(root, env)) if root else None,
                           cache_envs=args.cache_envs, spare_workers=args.spare_workers)
    await instance.start()
    control_host = args.control_host or args.host
    hosts = hostguard.allowed_hosts([args.host, control_host], args.allowed_host)
    origins = hostguard.allowed_origins(args.allowed_origin)
    http_protocol = listener.protocol(args.http)  # uvicorn's, with a deadline on every request head
    mcp_app = hostguard.HostOriginGuard(McpApp(instance, json_response=args.json_response, after_call=instance.tend_workers), hosts, origins)
    control_app = build_control(instance, middleware=[hostguard.guard(hosts, origins)])
    # ws="none": neither listener speaks WebSocket, and uvicorn's default ("auto") imports a
    # WebSocket library into every env server (~0.6 MB of memory each).
    common = {"log_level": "warning", "http": http_protocol, "ws": "none", "access_log": False,
              "lifespan": "off", "timeout_graceful_shutdown": 2}
    servers = [
        uvicorn.Server(uvicorn.Config(mcp_app, host=args.host, port=args.mcp_port, **common)),
        uvicorn.Server(uvicorn.Config(control_app, host=control_host, port=args.control_port,
                                      timeout_keep_alive=listener.CONTROL_KEEP_ALIVE_S, **common)),
    ]
    for server in servers:
        server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    tasks = [asyncio.create_task(server.serve()) for server in servers]
    while not all(s.started for s in servers):
        if any(t.done() for t in tasks):
            for t in tasks:
                if t.done() and t.exception():
                    raise t.exception()  # type: ignore[misc]
            sys.exit("envserver: a listener failed to start")
        await asyncio.sleep(0.01)
    # What start-up made (~70k objects: the modules, the bundle, the tool runtime) stays for the
    # process's life: out of the cyclic collector's sight, a full collection walks only what
    # requests made since, instead of stalling a call (and every request queued behind the GIL)
    # for the ~10-20 ms of a walk over everything.
    gc.freeze()
    host = args.host if args.host not in ("0.0.0.0", "::") else "127.0.0.1"
    print(json.dumps({
        "event": "ready", "env": bundle.name, "instance": instance.name, "pid": os.getpid(),
        "mcp_url": f"http://{host}:{_port(servers[0])}/mcp",
        "control_url": f"http://{host}:{_port(servers[1])}",
        "verifier_isolation": instance.pool.isolation,
        "late_binding": instance.databases.late,
    }), flush=True)

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await asyncio.wait([asyncio.create_task(stop.wait()), *tasks], return_when=asyncio.FIRST_COMPLETED)
    signal.alarm(15)  # a shutdown that hangs (a wedged worker or database) still ends: SIGALRM kills
    for server in servers:
        server.should_exit = True
    await asyncio.gather(*tasks, return_exceptions=True)
    await instance.close()


def judge_settings(args: argparse.Namespace) -> JudgeSettings | None:
    """Flags over ``AWM_JUDGE_*`` variables; ``None`` when no judge is configured."""
    env = dict(os.environ)
    if args.judge_base_url:
        env[settings.names.AWM_JUDGE_BASE_URL] = args.judge_base_url
    if args.judge_model:
        env[settings.names.AWM_JUDGE_MODEL] = args.judge_model
    if args.judge_votes:
        env[settings.names.AWM_JUDGE_VOTES] = str(args.judge_votes)
    return JudgeSettings.from_env(env)


def _as_set(declared: settings.Var[str]) -> str | None:
    """A choice's variable as set, else its default, not checked against the choices: argparse
    checks a flag's value but never its default, and the server has always taken the variable's
    text as it was (an unknown ``AWM_SERVER_HTTP`` meant h11, an unknown ``AWM_VERIFIER_KIND`` the
    primary verifier)."""
    text = declared.raw()
    return declared.default if text is None else text


def main(argv: list[str] | None = None) -> None:
    die_with_parent()  # first: a local fleet's env server must not outlive the fleet
    parser = argparse.ArgumentParser(prog="python -m awm.envserver", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--bundle", help="bundle JSON file (the environment served first)")
    parser.add_argument("--catalog", help="catalog directory: the environments a late-binding instance may serve")
    parser.add_argument("--env", help="with --catalog and no --bundle: the environment served first")
    parser.add_argument("--provisioner", metavar="SOCKET",
                        help=f"Unix socket of the provisioner, a path or @name (also {SOCKET_ENV}): bind environments late, "
                             "a fresh database of each from it")
    parser.add_argument("--cache-envs", type=int, default=settings.AWM_CACHE_ENVS,
                        help="environments kept ready (database, bundle) after a switch (also AWM_CACHE_ENVS)")
    parser.add_argument("--name", help="instance name (metrics label)")
    parser.add_argument("--dsn", help="instance DSN (prefer AWM_INSTANCE_DSN)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--control-host", help="bind address of the control API (default: --host)")
    parser.add_argument("--mcp-port", type=int, default=8000)
    parser.add_argument("--control-port", type=int, default=8001)
    parser.add_argument("--verifier-workers", type=int, default=1,
                        help="confined workers per instance (they run both tools and verifiers)")
    parser.add_argument("--spare-workers", type=int, default=1, choices=(0, 1),
                        help="tool workers forked ahead of the next episode (1: a reset never waits for a "
                             "fork; 0: one worker less per instance, forked after the reset's answer)")
    parser.add_argument("--allow-weak-isolation", action="store_true",
                        default=settings.AWM_ALLOW_WEAK_ISOLATION,
                        help="run untrusted code even where the kernel lacks Landlock or seccomp "
                             "(also AWM_ALLOW_WEAK_ISOLATION=1); /info says what is missing")
    parser.add_argument("--allowed-host", action="append", default=[], metavar="NAME",
                        help="another Host name to answer to (repeatable; '*' wildcards; also "
                             f"{hostguard.HOSTS_ENV}, comma-separated)")
    parser.add_argument("--allowed-origin", action="append", default=[], metavar="ORIGIN",
                        help="a browser Origin to trust, e.g. https://ui.example.com (repeatable; also "
                             f"{hostguard.ORIGINS_ENV})")
    parser.add_argument("--judge-base-url", help="OpenAI-compatible endpoint of the LLM judge (also "
                        "AWM_JUDGE_BASE_URL; the key comes from AWM_JUDGE_API_KEY)")
    parser.add_argument("--judge-model", help="judge model (also AWM_JUDGE_MODEL)")
    parser.add_argument("--judge-votes", type=int, help="k-vote majority (also AWM_JUDGE_VOTES; default 1)")
    parser.add_argument("--verifier-kind", choices=("code", "judge"), default=_as_set(settings.var.AWM_VERIFIER_KIND),
                        help="where a task has both kinds of verifier, serve this one (also AWM_VERIFIER_KIND)")
    parser.add_argument("--allow-ungated", action="store_true", default=settings.AWM_ALLOW_UNGATED,
                        help="serve tasks that have not passed both gates, marked ungated (also AWM_ALLOW_UNGATED=1)")
    parser.add_argument("--sse", dest="json_response", action="store_false",
                        help="answer MCP requests as SSE streams instead of plain JSON")
    # As uvicorn's own options: `auto` takes uvloop and httptools when installed (the image has
    # both); the pure-Python ones stay selectable to measure the difference (bench/runtime.py).
    parser.add_argument("--loop", choices=("auto", "asyncio", "uvloop"), default=_as_set(settings.var.AWM_SERVER_LOOP),
                        help="event loop (also AWM_SERVER_LOOP)")
    parser.add_argument("--http", choices=("auto", "h11", "httptools"), default=_as_set(settings.var.AWM_SERVER_HTTP),
                        help="HTTP/1.1 parser (also AWM_SERVER_HTTP)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    run_loop(serve(args), args.loop)


def run_loop(main_coro, loop: str) -> None:
    """Run on uvloop when asked or (``auto``) when installed, else on asyncio's own loop."""
    if loop != "asyncio":
        try:
            import uvloop
        except ImportError:
            if loop == "uvloop":
                raise SystemExit("envserver: --loop uvloop: uvloop is not installed") from None
        else:
            uvloop.run(main_coro)
            return
    asyncio.run(main_coro)


if __name__ == "__main__":
    main()
