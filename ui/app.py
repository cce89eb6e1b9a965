"""The UI's HTTP server (Starlette): a JSON API over runs, catalogs, the fleet and the playground,
and the static front end (plain ES modules, no build step) from ``ui/static``.

The API is the front end's only data source, and plain enough to script against:

    GET  /api/catalog                          environments, tables, tools, tasks, gates
    GET  /api/runs                             run directories found under the roots
    GET  /api/runs/{id}                        metrics per step, eval report, per-env rates, facets
    GET  /api/runs/{id}/status                 state (running | finished | stopped | idle), step of
                                               steps, the logs' sizes: what a live page polls
    GET  /api/runs/{id}/episodes?env=&task_id=&verdict=&error_kind=&step=&masked=&min_reward=
                                 &max_reward=&q=&version=&offset=&limit=        one page of the episode list
    GET  /api/runs/{id}/episodes/{episode_id}  one whole episode (its neighbours in the log, its GRPO group)
    GET  /api/runs/{id}/steps/{step}/groups     the GRPO groups a step trained on, each with its episodes
    GET  /api/fleet                            instances, states, holders, rates, latency; the
                                               operator's fleets, and per namespace its Campaigns (each
                                               with its run's id when its run directory is under the
                                               roots) and EnvFleets
    POST /api/playground/claim                 {namespace, fleet, environment?} with the caller's
                                               bearer token: an instance from the operator for the
                                               playground (awm ui --playground-claims), -> {instance}
    POST /api/playground/{instance}/open|reset|call|verify|release   (a claimed instance: with the
                                               claimer's token)
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, AsyncIterator, Awaitable, Callable

import httpx
from pydantic import BaseModel, ValidationError
from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import FileResponse, Response
from starlette.responses import JSONResponse as StarletteJSON
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from awm.client import ControlApiError, McpError
from awm.errorclass import CLASSES
from awm.episode.allocation import AllocationError
from awm.ui import catalog as catalog_view
from awm.ui.fleet import FleetView
from awm.ui.index import EpisodeFilter
from awm.ui.playground import (TTL_S, CallRequest, PlaygroundClaim, Forbidden, Playground, ResetRequest, Unauthorized,
                               VerifyRequest)
from awm.ui.runs import Runs

STATIC = Path(__file__).with_name("static")
MAX_PAGE = 500


def campaign_run(runs: dict[str, Path], roots: list[Path], namespace: str, name: str) -> str | None:
    """The run of a Campaign whose Job writes under a volume the UI reads too (docs/ui.md:
    ``run_dir: /runs/NAMESPACE/NAME``, or ``/runs/NAME`` directly under a root): its id, else None."""
    exact = [rid for rid, path in runs.items() if path.parts[-2:] == (namespace, name)]
    named = [rid for rid, path in runs.items() if path.name == name and path.parent in roots]
    return (exact or named or [None])[0]


@dataclass
class UiState:
    """What one UI server shows: run roots, a catalog, and a fleet view."""

    runs: Runs
    catalog: str = "starter"
    fleet: FleetView = field(default_factory=FleetView)
    playground_ttl_s: float = TTL_S
    playground_claims: bool = False  # claim instances from the operator with the user's token

    def __post_init__(self) -> None:
        self.playground = Playground(self.fleet, self.playground_ttl_s, self.playground_claims)
        self._catalog: dict[str, Any] | None = None

    def catalog_data(self) -> dict[str, Any]:
        if self._catalog is None:  # bundles do not change under a running UI; loading them is slow
            self._catalog = catalog_view.load(self.catalog)
        return self._catalog

    async def close(self) -> None:
        await self.playground.close()
        await self.fleet.close()
        self.runs.close()


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_finite(v) for v in value]
    return value


class JSONResponse(StarletteJSON):
    """JSON for the browser. Run files are written by Python's json, which writes NaN and
    Infinity (a log-prob of -inf, a reward of NaN); JSON.parse refuses them: they become null."""

    def render(self, content: Any) -> bytes:
        try:
            return super().render(content)
        except ValueError:  # allow_nan=False found one: the rare slow path
            return super().render(_finite(content))


class _Revalidated(StaticFiles):
    """Static files the browser revalidates on every load (a 304 when unchanged): modules cached
    by heuristics would outlive an upgrade of awm and mix old pages with a new API."""

    def file_response(self, *args: Any, **kwargs: Any) -> Response:
        response = super().file_response(*args, **kwargs)
        response.headers["Cache-Control"] = "no-cache"
        return response


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def bearer_token(request: Request) -> str | None:
    """The caller's ``Authorization: Bearer`` token (forwarded to the operator, never logged)."""
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    return token.strip() or None if scheme.lower() == "bearer" else None


def _int(value: str | None, default: int | None = None) -> int | None:
    return default if value in (None, "") else int(value)  # type: ignore[arg-type]


def _float(value: str | None) -> float | None:
    return None if value in (None, "") else float(value)  # type: ignore[arg-type]


def episode_filter(params: Any) -> EpisodeFilter:
    masked = params.get("masked")
    return EpisodeFilter(env=params.get("env") or None, task_id=params.get("task_id") or None,
                         verdict=params.get("verdict") or None, error_kind=params.get("error_kind") or None,
                         step=_int(params.get("step")), masked=None if masked in (None, "") else masked == "true",
                         min_reward=_float(params.get("min_reward")), max_reward=_float(params.get("max_reward")),
                         search=params.get("q") or None, version=_int(params.get("version")))


def build_app(state: UiState, middleware: list[Middleware] | None = None) -> Starlette:
    """``middleware``: the Host/Origin guard (awm.envserver.hostguard) when served for real: the
    playground changes databases, so a foreign web page must not reach it through the browser."""
    async def catalog(request: Request) -> Response:
        return JSONResponse(await run_in_threadpool(state.catalog_data))

    async def vocabulary(request: Request) -> Response:
        """The words the pages show, from their one definition (awm.errorclass): a page never
        keeps its own list of which error classes are the agent's."""
        return JSONResponse({"error_classes": {c.value: {"fault": i.fault, "meaning": i.meaning}
                                               for c, i in CLASSES.items()}})

    async def runs(request: Request) -> Response:
        return JSONResponse([r.model_dump() for r in await run_in_threadpool(state.runs.list)])

    # Run pages read files and SQLite (and the first one builds the index: seconds on a big run):
    # in the thread pool, so the event loop keeps serving the fleet page and the playground.
    encoded: dict[str, tuple[list[Any], bytes]] = {}  # run -> (its metrics records, their JSON)

    def run_body(rid: str) -> bytes | None:
        """The summary's JSON with the metrics' JSON spliced in from a cache: a long run's
        metrics are megabytes that take most of a second to encode, and change only per step."""
        summary = state.runs.summary(rid)
        if summary is None:
            return None
        metrics = summary.pop("metrics")
        cached = encoded.get(rid)
        if cached is None or cached[0] is not metrics:  # read_metrics returns the same list until the file changes
            cached = encoded[rid] = (metrics, JSONResponse(metrics).body)
        return b'{"metrics":' + cached[1] + b"," + JSONResponse(summary).body[1:]

    async def run(request: Request) -> Response:
        body = await run_in_threadpool(run_body, request.path_params["run"])
        return Response(body, media_type="application/json") if body is not None else _error(404, "no such run")

    async def run_status(request: Request) -> Response:
        found = await run_in_threadpool(state.runs.status, request.path_params["run"])
        return JSONResponse(found) if found is not None else _error(404, "no such run")

    async def episodes(request: Request) -> Response:
        index, indexing = await run_in_threadpool(state.runs.index_now, request.path_params["run"])
        try:
            where = episode_filter(request.query_params)
            offset = max(0, _int(request.query_params.get("offset"), 0) or 0)
            limit = min(MAX_PAGE, max(1, _int(request.query_params.get("limit"), 50) or 50))
        except ValueError as exc:
            return _error(400, f"bad filter: {exc}")
        if index is None:  # a run without trajectories.jsonl (yet) has no episodes; an unknown run is an error
            if state.runs.path(request.path_params["run"]) is None:
                return _error(404, "no such run")
            return JSONResponse({"total": 0, "offset": offset, "limit": limit, "episodes": []})
        if indexing is not None:  # a big run's first open: the list follows when the index is built
            return JSONResponse({"total": None, "offset": offset, "limit": limit, "episodes": [], "indexing": indexing})
        total, rows = await run_in_threadpool(index.page, where, offset, limit)
        return JSONResponse({"total": total, "offset": offset, "limit": limit, "episodes": rows})

    async def step_groups(request: Request) -> Response:
        try:
            step = _int(request.path_params["step"])
        except ValueError:
            return _error(400, "a step is a whole number")
        index = await run_in_threadpool(state.runs.index, request.path_params["run"])
        if index is None or step is None:
            return _error(404, "no such run or step")
        return JSONResponse({"step": step, "groups": await run_in_threadpool(index.step_groups, step)})

    async def episode(request: Request) -> Response:
        index = await run_in_threadpool(state.runs.index, request.path_params["run"])
        record = await run_in_threadpool(index.episode, request.path_params["episode"]) if index else None
        if record is None:
            return _error(404, "no such episode")
        record["neighbours"] = await run_in_threadpool(index.neighbours, request.path_params["episode"])  # type: ignore[union-attr]
        if record.get("group_id"):  # its GRPO group: the siblings, their rewards and advantages
            record["group"] = await run_in_threadpool(index.group, record["group_id"])  # type: ignore[union-attr]
        return JSONResponse(record)

    async def fleet(request: Request) -> Response:
        snapshot = await state.fleet.snapshot()
        if any(group["campaigns"] for group in snapshot["namespaces"]):
            runs = await run_in_threadpool(state.runs.paths)
            for group in snapshot["namespaces"]:
                for campaign in group["campaigns"]:
                    campaign["run"] = campaign_run(runs, state.runs.roots, group["namespace"], campaign["name"])
        snapshot["playground_claims"] = state.playground.claims
        return JSONResponse(snapshot)

    def playground(action: Callable[[str, Any, str | None], Awaitable[Any]], body_model: type[BaseModel] | None):
        async def handler(request: Request) -> Response:
            name = request.path_params.get("instance", "")
            try:
                raw = await request.body()
                body = body_model.model_validate_json(raw or b"{}") if body_model else None
                result = await action(name, body, bearer_token(request))
            except ValidationError as exc:
                return _error(400, str(exc))
            except KeyError:
                return _error(404, f"no instance {name!r} in this UI's fleet or playground")
            except Unauthorized as exc:
                return JSONResponse({"error": str(exc)}, status_code=401, headers={"WWW-Authenticate": "Bearer"})
            except Forbidden as exc:
                return _error(403, str(exc))
            except AllocationError as exc:  # the operator's answer to the user's own token
                status = exc.status if exc.status in (400, 401, 403, 404, 409) else 502
                return _error(status, f"the operator: {exc}")
            except (McpError, ControlApiError, httpx.HTTPError) as exc:
                return _error(502, f"the instance failed: {exc}")
            except ValueError as exc:  # e.g. a reset of an environment that serves no task
                return _error(400, str(exc))
            return JSONResponse(result, status_code=200)
        return handler

    pg = state.playground

    async def release(name: str, _: Any, token: str | None) -> dict[str, Any]:
        await pg.release(name, token)
        return {"released": name}

    async def index_html(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", headers={"Cache-Control": "no-cache"})

    async def expire_idle_sessions() -> None:
        while True:  # a tenth of the TTL between sweeps: a session lives at most 1.1 TTL idle
            await asyncio.sleep(max(0.05, state.playground.ttl_s / 10))
            await state.playground.expire()

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        sweeper = asyncio.create_task(expire_idle_sessions())
        try:
            yield
        finally:
            sweeper.cancel()
            await state.close()

    return Starlette(routes=[
        Route("/api/catalog", catalog),
        Route("/api/vocabulary", vocabulary),
        Route("/api/runs", runs),
        Route("/api/runs/{run}", run),
        Route("/api/runs/{run}/status", run_status),
        Route("/api/runs/{run}/episodes", episodes),
        Route("/api/runs/{run}/episodes/{episode}", episode),
        Route("/api/runs/{run}/steps/{step}/groups", step_groups),
        Route("/api/fleet", fleet),
        Route("/api/playground/claim", playground(lambda _, body, token: pg.claim(body, token), PlaygroundClaim),
              methods=["POST"]),
        Route("/api/playground/{instance}/open", playground(lambda n, _, token: pg.open(n, token), None),
              methods=["POST"]),
        Route("/api/playground/{instance}/reset", playground(pg.reset, ResetRequest), methods=["POST"]),
        Route("/api/playground/{instance}/call", playground(pg.call, CallRequest), methods=["POST"]),
        Route("/api/playground/{instance}/verify", playground(pg.verify, VerifyRequest), methods=["POST"]),
        Route("/api/playground/{instance}/release", playground(release, None), methods=["POST"]),
        Mount("/static", _Revalidated(directory=STATIC), name="static"),
        Route("/", index_html),
    ], lifespan=lifespan, middleware=middleware)
