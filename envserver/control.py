"""The control API: what the trainer and the fleet see, and the agent never does.

Served on its own port (a pod exposes only the MCP port to agents' network policy):

    POST /reset   {"task_id": str | null, "verify": bool, "env": str?}
                                                            -> episode id, instruction, reset time
                                                               (env: of that environment, bound first)
    POST /bind    {"env": str}                              -> serve that environment from now on (late
                                                               binding; 409 on a pinned instance)
    POST /prepare {"env": str}                              -> make that environment ready without serving
                                                               it (a later claim of it costs a reset)
    POST /verify  {"final_answer": str | null,
                   "verifier_kind": "code" | "judge" | null}  -> verdict, reward, reason (again: allowed)
    GET  /sqlite?state=initial|final                       -> the database as a SQLite file (AWM-1K imports)
    GET  /diff[?rows=N]                                     -> rows inserted/updated/deleted per table
                                                               (N > 0: and up to N of those rows each)
    GET  /checksum                                          -> is the state the snapshot? (on demand)
    GET  /info, /healthz, /readyz, /metrics
"""

from __future__ import annotations

from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.background import BackgroundTask
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from awm import jsonlimits
from awm.postgres.snapshot import MAX_DIFF_ROWS
from awm.envserver.instance import ControlError, EnvInstance


MAX_BODY = 1024 * 1024  # a reset or a verification (a final answer) is small


async def _body(request: Request) -> dict[str, Any]:
    """The JSON object of a request, read up to MAX_BODY (413 past it, however the client
    announces or streams it), nested at most jsonlimits.MAX_DEPTH deep (400)."""
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY:
        raise ControlError(413, f"request body over {MAX_BODY} bytes")
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > MAX_BODY:
            raise ControlError(413, f"request body over {MAX_BODY} bytes")
        chunks.append(chunk)
    raw = b"".join(chunks)
    if not raw.strip():
        return {}
    try:
        data = jsonlimits.loads(raw)
    except jsonlimits.JsonLimitError as exc:
        raise ControlError(400, f"request body refused: {exc}") from exc
    except ValueError as exc:
        raise ControlError(400, f"request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ControlError(400, "request body must be a JSON object")
    return data


def _env(body: dict[str, Any], required: bool) -> str | None:
    env = body.get("env")
    if env is None and not required:
        return None
    if not isinstance(env, str) or not env or len(env) > 200:
        raise ControlError(400, "env must be an environment name (a string of 1-200 characters)")
    if jsonlimits.lone_surrogate(env) is not None:
        raise ControlError(400, "env holds a lone UTF-16 surrogate (not valid Unicode)")
    return env


def build_control(instance: EnvInstance, middleware: list[Middleware] | None = None) -> Starlette:
    """The control app; ``middleware`` is the Host/Origin guard (awm.envserver.hostguard)."""
    async def handle(call, after: BackgroundTask | None = None):  # type: ignore[no-untyped-def]
        try:
            return JSONResponse(await call(), background=after)
        except ControlError as exc:
            return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status, background=after)

    async def tend() -> None:
        instance.tend_workers()

    def tend_workers() -> BackgroundTask:  # after the answer to a reset, bind or verification is sent
        return BackgroundTask(tend)

    async def reset(request: Request) -> Response:
        async def call() -> dict[str, Any]:
            body = await _body(request)
            task_id = body.get("task_id")
            if task_id is not None and not isinstance(task_id, str):
                raise ControlError(400, "task_id must be a string or null")
            if jsonlimits.lone_surrogate(task_id) is not None:
                raise ControlError(400, "task_id holds a lone UTF-16 surrogate (not valid Unicode)")
            return await instance.reset(task_id, verify=bool(body.get("verify", False)), env=_env(body, False))
        return await handle(call, tend_workers())

    async def bind(request: Request) -> Response:
        async def call() -> dict[str, Any]:
            return await instance.bind(_env(await _body(request), True))  # type: ignore[arg-type]
        return await handle(call, tend_workers())

    async def prepare(request: Request) -> Response:
        async def call() -> dict[str, Any]:
            return await instance.prepare(_env(await _body(request), True))  # type: ignore[arg-type]
        return await handle(call)

    async def verify(request: Request) -> Response:
        async def call() -> dict[str, Any]:
            body = await _body(request)
            answer = body.get("final_answer")
            if answer is not None and not isinstance(answer, str):
                raise ControlError(400, "final_answer must be a string or null")
            if jsonlimits.lone_surrogate(answer) is not None:
                raise ControlError(400, "final_answer holds a lone UTF-16 surrogate (not valid Unicode)")
            kind = body.get("verifier_kind")
            if kind not in (None, "code", "judge"):
                raise ControlError(400, "verifier_kind must be code, judge or null")
            return await instance.verify(answer, kind)
        return await handle(call, tend_workers())

    async def sqlite(request: Request) -> Response:
        state = request.query_params.get("state", "final")
        if state not in ("initial", "final"):
            return JSONResponse({"error": "state must be initial or final"}, status_code=400)
        try:
            image = await instance.sqlite_image(state)
        except ControlError as exc:
            return JSONResponse({"error": str(exc), **exc.extra}, status_code=exc.status)
        return Response(image, media_type="application/vnd.sqlite3")

    async def diff(request: Request) -> Response:
        async def call() -> dict[str, Any]:
            raw = request.query_params.get("rows", "0")
            if not raw.isdigit() or int(raw) > MAX_DIFF_ROWS:
                raise ControlError(400, f"rows must be an integer from 0 to {MAX_DIFF_ROWS}")
            return await instance.diff(int(raw))
        return await handle(call)

    async def checksum(request: Request) -> Response:
        return await handle(instance.checksum)

    async def info(request: Request) -> Response:
        return JSONResponse(instance.info())

    async def healthz(request: Request) -> Response:
        return JSONResponse({"status": "ok"})

    async def readyz(request: Request) -> Response:
        ready = instance.ready
        return JSONResponse({"ready": ready, "wedged": instance.wedged, "db": instance.db.connected},
                            status_code=200 if ready else 503)

    async def metrics(request: Request) -> Response:
        return Response(generate_latest(instance.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    return Starlette(routes=[
        Route("/reset", reset, methods=["POST"]),
        Route("/bind", bind, methods=["POST"]),
        Route("/prepare", prepare, methods=["POST"]),
        Route("/verify", verify, methods=["POST"]),
        Route("/diff", diff, methods=["GET"]),
        Route("/sqlite", sqlite, methods=["GET"]),
        Route("/checksum", checksum, methods=["GET"]),
        Route("/info", info, methods=["GET"]),
        Route("/healthz", healthz, methods=["GET"]),
        Route("/readyz", readyz, methods=["GET"]),
        Route("/metrics", metrics, methods=["GET"]),
    ], middleware=middleware)
