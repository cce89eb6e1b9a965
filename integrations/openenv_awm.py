"""OpenEnv's AWM environment protocol, served by awm (``awm openenv serve``).

People train on AgentWorldModel-1K through OpenEnv's AWM environment (meta-pytorch/OpenEnv,
``envs/agent_world_model_env``): its ``AWMEnv`` client over a WebSocket at ``/ws``, pointed at a
server that starts one Python subprocess per session. This module answers that client exactly, so
an AWM user switches by changing a URL, and each session runs on an awm instance of a late-binding
pool instead (an episode starts in a reset of milliseconds, memory follows the sessions holding an
instance, never the number of scenarios).

The protocol, from OpenEnv's README and models (facts only; none of its code is used):

* WebSocket messages ``{"type": "reset" | "step" | "state" | "close", "data": {...}}``; answers
  ``{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}``,
  ``{"type": "state", ...}`` or ``{"type": "error", "data": {"message", "code"}}``.
* ``reset(scenario=, task_idx=, task=, reward_config=, llm_*=)`` -> ``reset_ok`` with ``scenario``,
  ``task``, ``task_idx``, ``has_verifier`` ({sql, code}) and ``num_tools``; ``reset_error`` (with
  ``error``) for a missing or unknown scenario or a task index out of range.
* Steps: ``{"type": "list_tools"}`` -> ``tools``; ``{"type": "call_tool", "tool_name", "arguments"}``
  -> ``tool_call_ok`` with ``tool_result`` (text), or ``tool_not_found`` / ``invalid_args`` /
  ``server_error`` with ``error`` (a string). Special tools: ``verify`` (``verifier_mode`` code |
  sql, ``final_answer``; repeatable, the episode goes on), ``done`` (``keep_session``; ends the
  episode: ``episode_done``, then ``episode_already_done``), ``__list_scenarios__`` (before any
  reset too).
* The client's observation models forbid extra keys: every reply here is one of
  :class:`AwmObservation` or :class:`AwmToolsObservation`, which have exactly its fields.

awm's own knowledge travels inside those fields: the error class starts the ``error`` text
(``unknown_tool: ...``, :mod:`awm.errorclass`), ``verify_result["awm"]`` holds awm's verdict, its
reward and parts, and whether the episode is masked (the environment's failure: never train on it),
and ``warning`` says when a task has not passed awm's quality gates. Where OpenEnv's behaviour is a
flaw awm keeps its own (docs/integrations.md lists them): a crashing tool's writes are rolled back;
an incomplete verdict pays ``incomplete`` in code mode too (``reward_config["incomplete_code"]``
gives OpenEnv's code-mode answer, ``others``, at that reward); an episode whose tools failed for the environment's reasons verifies as
``server_error`` whatever the verifier says.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import tempfile
import time
import uuid
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from awm import errorclass
from awm.client import ControlApiError
from awm.episode.session import ENV_ERRORS, EpisodeSession
from awm.episode.sources import EnvironmentRefused, InstancesUnavailable, InstanceSource, Lease
from awm.errorclass import CLASSES
from awm.gates import negative_failure
from awm.importers.awm1k import Release, SourceScenario, normalize_scenario_name

__all__ = ["AwmObservation", "AwmToolsObservation", "OnDemand", "ProtocolServer", "Scenario", "ScenarioTask",
           "build_app", "pending_scenarios", "scenarios_from"]

log = logging.getLogger(__name__)

# OpenEnv's default rewards: any reward type not named is 0.0, a format error -1.0.
DEFAULT_REWARDS: dict[str, float] = {"complete": 1.0, "incomplete": 0.1, "format_error": -1.0}
FORMAT_ERRORS = frozenset({"tool_not_found", "invalid_args", "invalid_action"})
SPECIAL_TOOLS = ("verify", "done", "__list_scenarios__")


# -- the wire: exactly the client's models' fields ----------------------------------------------


class AwmObservation(BaseModel):
    """Every reply but a tool list: OpenEnv's ``AWMObservation`` fields, no others (its client
    refuses extra keys); fields left None are not sent."""

    model_config = ConfigDict(extra="forbid")

    done: bool = False
    reward: float | None = None
    reward_type: str | None = None
    scenario: str | None = None
    task: str | None = None
    task_idx: int | None = None
    has_verifier: dict[str, bool] | None = None
    num_tools: int | None = None
    tool_name: str | None = None
    tool_result: Any = None
    error: str | None = None
    warning: str | None = None
    verify_result: dict[str, Any] | None = None
    steps_taken: int | None = None
    scenarios: list[dict[str, Any]] | None = None
    total: int | None = None
    trajectory_path: str | None = None
    session_dir: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"observation": self.model_dump(exclude={"done", "reward"}, exclude_none=True),
                "reward": self.reward, "done": self.done}


class AwmToolsObservation(BaseModel):
    """A tool list (the client routes a reply with ``tools`` to its list-tools model)."""

    model_config = ConfigDict(extra="forbid")

    tools: list[dict[str, Any]] = Field(default_factory=list)
    error: str | None = None

    def wire(self) -> dict[str, Any]:
        return {"observation": self.model_dump(exclude_none=True), "reward": None, "done": False}


class _ListTools(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["list_tools"]
    metadata: dict[str, Any] = Field(default_factory=dict)


class _CallTool(BaseModel):
    model_config = ConfigDict(extra="forbid")
    type: Literal["call_tool"]
    tool_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)
    metadata: dict[str, Any] = Field(default_factory=dict)


class _Reset(BaseModel):
    """What a reset may say (others, e.g. ``seed``, are accepted and ignored, as OpenEnv does)."""

    model_config = ConfigDict(extra="allow")
    scenario: str | None = None
    task_idx: int | None = None
    task: str | None = None
    reward_config: dict[str, float] | None = None
    episode_id: str | None = None
    llm_base_url: str | None = None
    llm_api_key: str | None = None
    llm_model: str | None = None


# -- what is served: scenarios by the names their users know --------------------------------------


@dataclass(frozen=True)
class ScenarioTask:
    """One task of a scenario: its text, and the served task (``task_id``) with its verifiers
    when awm serves it (a task without a verifier in the release is served untasked)."""

    text: str
    task_id: str | None = None
    code: bool = False
    sql: bool = False
    # verifier mode -> why its verdicts carry no signal (its negative gate failed: it says complete
    # on the untouched database); such verdicts are masked, never paid
    flawed: tuple[tuple[str, str], ...] = ()

    @property
    def has_verifier(self) -> dict[str, bool] | None:
        return {"sql": self.sql, "code": self.code} if (self.sql or self.code) else None


@dataclass(frozen=True)
class Scenario:
    name: str  # OpenEnv's key: the normalised scenario name
    env: str | None  # the bundle serving it; None: the import refused it (``reason``), or ``pending``
    description: str
    tasks: tuple[ScenarioTask, ...]
    reason: str = ""
    pending: bool = False  # a release's scenario not imported yet: its first reset imports it

    def listing(self) -> dict[str, Any]:
        entry: dict[str, Any] = {"name": self.name, "description": self.description, "num_tasks": len(self.tasks),
                                 "tasks": [t.text for t in self.tasks]}
        if self.env is None:
            entry["served"], entry["reason"] = False, self.reason
        return entry


def _task_of(bundle: Any, task_id: str, text: str) -> ScenarioTask:
    try:
        task = bundle.task(task_id)
    except KeyError:
        return ScenarioTask(text)
    kinds = {v.kind for v in task.verifiers()}
    flawed = tuple((mode, why) for mode, kind in (("code", "code"), ("sql", "judge")) if kind in kinds
                   for why in [negative_failure(bundle, task, kind)] if why)
    return ScenarioTask(text, task.id, "code" in kinds, "judge" in kinds, flawed)


def scenarios_from(bundles: list[Any], source: list[SourceScenario] | None = None,
                   report: dict[str, Any] | None = None) -> dict[str, Scenario]:
    """The scenarios a server answers to, by normalised name. From a release (``source``): every
    scenario it has, each task at its release index, the refused ones with the import's reason.
    From a catalog alone: a scenario per bundle, its tasks in the bundle's order."""
    by_env = {b.name: b for b in bundles}
    out: dict[str, Scenario] = {}
    if source is not None:
        reasons = {e["name"]: e.get("reason", "") for e in (report or {}).get("environments", [])}
        for s in source:
            bundle = by_env.get(s.env)
            out[s.name] = _scenario(bundle, s) if bundle is not None else \
                Scenario(s.name, None, s.description, tuple(ScenarioTask(t) for t in s.tasks),
                         reasons.get(s.env) or "not imported")
        return out
    for bundle in bundles:
        name = normalize_scenario_name(bundle.name)
        tasks = tuple(_task_of(bundle, t.id, t.instruction) for t in bundle.tasks)
        out[name] = Scenario(name, bundle.name, bundle.scenario.description, tasks)
    return out


def _scenario(bundle: Any, source: SourceScenario) -> Scenario:
    """A release's scenario as its bundle serves it: each task at its release index."""
    tasks = tuple(_task_of(bundle, f"task_{i}", text) for i, text in enumerate(source.tasks))
    return Scenario(source.name, bundle.name, source.description or bundle.scenario.description, tasks)


def pending_scenarios(release: Release) -> dict[str, Scenario]:
    """Every scenario of a release served on demand: listed now, imported at its first reset."""
    return {s.name: Scenario(s.name, None, s.description, tuple(ScenarioTask(t) for t in s.tasks), pending=True)
            for s in release.scenarios}


class OnDemand:
    """Imports a release's scenario at its first reset (once: the import is cached by content)
    and adds it to the running late-binding fleet, whose instances switch to it when claimed."""

    def __init__(self, release: Release, fleet: Any, pool: Any) -> None:
        self.release, self.fleet, self.pool = release, fleet, pool
        self.sources = {s.name: s for s in release.scenarios}

    async def __call__(self, scenario: Scenario) -> Scenario:
        bundle, report, fresh = await self.release.load(scenario.name)
        if fresh:  # the flaws, said once: when the import found them
            log.warning("imported %s: %s%s", scenario.name, report.status, f" ({report.reason})" if report.reason else "")
            for task in report.complete_on_untouched:
                log.warning("flawed task %s/%s: its verifier says complete on the untouched database", report.name, task)
        if bundle is None:
            return replace(scenario, pending=False, reason=report.reason or "not imported")
        self.fleet.add(bundle)
        self.pool.add_env(bundle.name, bundle.scenario.description)
        return _scenario(bundle, self.sources[scenario.name])


# -- one WebSocket session ------------------------------------------------------------------------


class SessionError(Exception):
    """A message the protocol answers with ``{"type": "error"}`` (OpenEnv's code with it)."""

    def __init__(self, message: str, code: str = "EXECUTION_ERROR", **extra: Any) -> None:
        super().__init__(message)
        self.code, self.extra = code, extra


@dataclass
class Session:
    """One client: at most one episode at a time, on one claimed instance. Its messages are
    handled one after another (the WebSocket loop awaits each), so no lock is needed here."""

    server: ProtocolServer
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    lease: Lease | None = None
    episode: EpisodeSession | None = None
    scenario: Scenario | None = None
    task: ScenarioTask | None = None
    task_text: str | None = None
    task_idx: int | None = None
    rewards: dict[str, float] = field(default_factory=lambda: dict(DEFAULT_REWARDS))
    episode_id: str | None = None
    steps: int = 0
    ended: bool = False
    expired: str | None = None
    trajectory: list[dict[str, Any]] = field(default_factory=list)
    last_active: float = field(default_factory=time.monotonic)

    # -- rewards as OpenEnv gives them

    def reward(self, reward_type: str) -> float:
        if reward_type in FORMAT_ERRORS:
            return float(self.rewards.get("format_error", -1.0))
        return float(self.rewards.get(reward_type, 0.0))

    def _obs(self, reward_type: str, **fields: Any) -> AwmObservation:
        return AwmObservation(reward=self.reward(reward_type), reward_type=reward_type, **fields)

    def _where(self) -> dict[str, Any]:
        return {"scenario": self.scenario.name if self.scenario else None, "task": self.task_text,
                "task_idx": self.task_idx}

    # -- reset

    async def reset(self, data: dict[str, Any]) -> AwmObservation:
        await self.release()
        self.ended, self.expired, self.steps, self.trajectory = False, None, 0, []
        self.scenario = self.task = self.task_text = self.task_idx = None
        try:
            args = _Reset.model_validate(data)
        except ValidationError as exc:
            return AwmObservation(reward_type="reset_error", error=f"invalid reset arguments: {_first_error(exc)}")
        if not args.scenario:
            return AwmObservation(reward_type="reset_error", error="Parameter 'scenario' is required")
        scenario = self.server.scenarios.get(normalize_scenario_name(args.scenario))
        if scenario is None:
            return AwmObservation(reward_type="reset_error", error=f"Scenario '{args.scenario}' not found")
        if scenario.pending:
            try:
                scenario = await self.server.ready(scenario)
            except Exception as exc:  # noqa: BLE001 - the import's own failure, said to the client
                log.exception("import of %s failed", scenario.name)
                return AwmObservation(reward_type="reset_error", error=f"Scenario '{args.scenario}' could not be "
                                      f"imported: {type(exc).__name__}: {exc}")
        if scenario.env is None:
            return AwmObservation(reward_type="reset_error",
                                  error=f"Scenario '{args.scenario}' is not served: {scenario.reason}")
        task: ScenarioTask | None = None
        if args.task_idx is not None and args.task is None:
            if not 0 <= args.task_idx < len(scenario.tasks):
                return AwmObservation(reward_type="reset_error", error=f"task_idx {args.task_idx} out of range "
                                      f"(0..{len(scenario.tasks) - 1})")
            task = scenario.tasks[args.task_idx]
        elif args.task is not None and args.task_idx is not None and 0 <= args.task_idx < len(scenario.tasks):
            task = scenario.tasks[args.task_idx]  # OpenEnv: the given text, the index's verifiers
        bad = [k for k, v in (args.reward_config or {}).items() if not math.isfinite(v)]
        if bad:
            return AwmObservation(reward_type="reset_error", error=f"reward_config: {', '.join(bad)} must be finite")
        self.rewards = dict(args.reward_config) if args.reward_config else dict(DEFAULT_REWARDS)
        try:
            lease = await self.server.claim(scenario.env)
        except (InstancesUnavailable, EnvironmentRefused, KeyError, TimeoutError) as exc:
            return AwmObservation(reward_type="reset_error", error=f"no instance of {scenario.name}: {exc}")
        self.lease = lease
        assert lease.handle is not None
        self.episode = EpisodeSession(lease.handle, self.server.reward_settings)
        warnings: list[str] = []
        try:
            if task is not None and task.task_id is not None:
                reset = await self.episode.reset(task.task_id)
            else:
                reset = await self.episode.reset(untasked=True)
        except (*ENV_ERRORS, ControlApiError) as exc:
            await self.release(healthy=False)
            return AwmObservation(reward_type="reset_error", error=f"reset failed: {exc}")
        self.scenario, self.task, self.task_idx = scenario, task, args.task_idx
        self.task_text = args.task if args.task is not None else (task.text if task else None)
        self.episode_id = args.episode_id or reset.get("episode_id") or uuid.uuid4().hex
        for mode, why in task.flawed if task else ():
            warnings.append(f"flawed: {why}: awm does not pay its {mode}-mode verdicts (verify answers judge_error)")
        if reset.get("ungated"):
            warnings.append("ungated: this task has not passed awm's quality gates (its verifier's negative and "
                            "positive checks); its reward may not reflect the agent")
        if args.llm_base_url or args.llm_model:
            warnings.append("llm_base_url/llm_model are the server's to set in awm (--judge-base-url, "
                            "--judge-model): the server's judge is used for sql mode")
        self.touch()
        return AwmObservation(reward_type="reset_ok", scenario=scenario.name, task=self.task_text,
                              task_idx=self.task_idx, has_verifier=task.has_verifier if task else None,
                              num_tools=len(self.episode.tools), warning="; ".join(warnings) or None)

    # -- step

    async def step(self, data: dict[str, Any]) -> AwmObservation | AwmToolsObservation:
        action = _action(data)
        if self.ended:
            return AwmObservation(done=True, reward_type="episode_already_done",
                                  error="Episode has ended. Call reset() to start a new episode.")
        self.steps += 1
        self.touch()
        if isinstance(action, _ListTools):
            return self._list_tools()
        if action.tool_name == "__list_scenarios__":
            listing = [s.listing() for s in self.server.scenarios.values()]
            return AwmObservation(reward_type="tool_call_ok", scenarios=listing, total=len(listing))
        if self.expired is not None:
            return self._obs("server_error", tool_name=action.tool_name, error=self.expired)
        if action.tool_name == "done":
            return await self._done(action.arguments)
        if action.tool_name == "verify":
            return await self._verify(action.arguments)
        return await self._call(action)

    def _list_tools(self) -> AwmToolsObservation:
        if self.episode is None:
            self.trajectory.append({"action": "list_tools", "success": False})
            return AwmToolsObservation(error=self.expired or "no episode: call reset() first")
        tools = [{"name": t["name"], "description": t.get("description") or "",
                  "input_schema": t.get("inputSchema") or {}} for t in self.episode.tools]
        self.trajectory.append({"action": "list_tools", "success": True, "num_tools": len(tools)})
        return AwmToolsObservation(tools=tools)

    async def _call(self, action: _CallTool) -> AwmObservation:
        episode = self.episode
        if episode is None:
            return self._obs("server_error", tool_name=action.tool_name,
                             error="unavailable: no episode: call reset() first")
        out = await episode.call_tool(action.tool_name, action.arguments)
        self.trajectory.append({"action": "call_tool", "tool_name": action.tool_name, "arguments": action.arguments,
                                "success": not out.is_error, "error_kind": out.error_kind,
                                "result" if not out.is_error else "error": out.text})
        if not out.is_error:
            return self._obs("tool_call_ok", tool_name=action.tool_name, tool_result=out.text)
        known = errorclass.parse(out.error_kind)
        reward_type = CLASSES[known].openenv if known else "server_error"
        text = out.text if errorclass.parse(out.text) else f"{out.error_kind}: {out.text}"
        return self._obs(reward_type, tool_name=action.tool_name, error=text)

    async def _verify(self, arguments: dict[str, Any]) -> AwmObservation:
        episode = self.episode
        if episode is None:
            return self._obs("server_error", error="Cannot verify: environment not initialized "
                                                   "(reset failed or not called)")
        if self.task is None or self.task_idx is None:
            return self._obs("no_verifier", error="Cannot verify: no task specified at reset")
        mode = arguments.get("verifier_mode", "code")
        answer = arguments.get("final_answer")
        if mode not in ("code", "sql"):
            return self._obs("invalid_args", error=f"invalid_arguments: Invalid verifier_mode {mode!r}. Must be "
                                                   "one of: code, sql")
        if answer is not None and not isinstance(answer, str):
            return self._obs("invalid_args", error="invalid_arguments: final_answer must be a string")
        if not (self.task.has_verifier or {}).get(mode):
            return self._obs("no_verifier", error=f"No {mode} verifier available for this task", **self._where())
        outcome = await episode.verify(answer, kind="judge" if mode == "sql" else "code")
        flawed = dict(self.task.flawed).get(mode)
        if flawed and not outcome.masked:  # the verdict says nothing of the agent: masked, as awm masks
            outcome = replace(outcome, reward=None, masked=True, mask_reason=f"flawed task: {flawed}")
            outcome.verdict = {**outcome.verdict, "error_kind": "flawed_verifier"}
        verdict = outcome.verdict
        if flawed:
            reward_type = "judge_error"
        elif outcome.masked:
            kind = str(verdict.get("error_kind") or "")
            reward_type = "judge_error" if verdict.get("verdict") == "error" and kind not in ("infra", "server_error") \
                else "server_error"
        else:
            reward_type = {"complete": "complete", "agent_error": "agent_error"}.get(str(verdict.get("verdict")),
                                                                                       "incomplete")
        reward = self.reward(reward_type)
        if reward_type == "incomplete" and mode == "code" and "incomplete_code" in self.rewards:
            # OpenEnv's code mode, asked for: its code verifiers answer complete or "others"
            reward_type, reward = "others", float(self.rewards["incomplete_code"])
        result = {**{k: v for k, v in verdict.items() if k not in ("evidence",)}, "verifier_mode": mode,
                  "awm": {"reward": outcome.reward, "masked": outcome.masked, "mask_reason": outcome.mask_reason,
                          "components": outcome.components, "error_kinds": list(episode.error_kinds)}}
        self.trajectory.append({"action": "verify", "arguments": arguments, "reward_type": reward_type,
                                "reward": reward, "verify_result": result})
        return AwmObservation(reward=reward, reward_type=reward_type, verify_result=result,
                              steps_taken=self.steps, **self._where())

    async def _done(self, arguments: dict[str, Any]) -> AwmObservation:
        self.ended = True
        if self.episode is None:
            return AwmObservation(done=True, reward=self.reward("server_error"), reward_type="server_error",
                                  error="Cannot call done: environment not initialized (reset failed or not called)")
        session_dir = trajectory_path = None
        if arguments.get("keep_session"):
            session_dir, trajectory_path = await self._keep()
        where = self._where()
        await self.release()
        return AwmObservation(done=True, reward=0.0, reward_type="episode_done", steps_taken=self.steps,
                              trajectory_path=trajectory_path, session_dir=session_dir, **where)

    async def _keep(self) -> tuple[str | None, str | None]:
        """The episode's record where the client is told: its trajectory, the rows it changed and,
        for AWM-1K environments, the database before and after as SQLite files."""
        assert self.episode is not None
        folder = self.server.sessions_dir / (self.episode_id or self.id)
        folder.mkdir(parents=True, exist_ok=True)
        control = self.episode.control
        record: dict[str, Any] = {"scenario": self.scenario.name if self.scenario else None, "task": self.task_text,
                                  "task_idx": self.task_idx, "steps": self.steps, "trajectory": self.trajectory}
        with contextlib.suppress(*ENV_ERRORS, ControlApiError):
            record["diff"] = await control.diff(rows=50)
        for state in ("initial", "final"):
            with contextlib.suppress(*ENV_ERRORS, ControlApiError):
                (folder / f"{state}.db").write_bytes(await control.sqlite(state))
        path = folder / "trajectory.json"
        path.write_text(json.dumps(record, indent=2, ensure_ascii=False, default=str))
        return str(folder), str(path)

    # -- the instance

    def touch(self) -> None:
        self.last_active = time.monotonic()

    async def release(self, healthy: bool | None = None) -> None:
        lease, episode = self.lease, self.episode
        self.lease = self.episode = None
        if lease is not None:
            ok = healthy if healthy is not None else (episode is None or episode.healthy)
            await self.server.source.release(lease, healthy=ok)

    async def expire(self, idle_s: float) -> None:
        """Idle too long while holding an instance (a client that went away without closing):
        the instance goes back; the next step says why."""
        self.expired = (f"unavailable: the session was idle for more than {idle_s:g} s and its instance was "
                        "released: call reset()")
        await self.release()


def _first_error(exc: ValidationError) -> str:
    first = exc.errors()[0]
    return f"{'.'.join(map(str, first.get('loc', ()))) or 'value'}: {first.get('msg', 'invalid')}"


def _action(data: Any) -> _ListTools | _CallTool:
    if not isinstance(data, dict):
        raise SessionError("an action must be a JSON object", "VALIDATION_ERROR")
    kind = data.get("type")
    try:
        if kind == "list_tools":
            return _ListTools.model_validate(data)
        if kind == "call_tool":
            return _CallTool.model_validate(data)
    except ValidationError as exc:
        raise SessionError(f"Invalid message: {_first_error(exc)}", "VALIDATION_ERROR",
                           errors=json.loads(exc.json())) from None
    raise SessionError(f"unknown action type {kind!r}: use list_tools or call_tool", "VALIDATION_ERROR")


# -- the server -------------------------------------------------------------------------------------


class ProtocolServer:
    """Sessions over one :class:`InstanceSource` (a late-binding pool): sessions cost a few
    kilobytes; an instance is held from a reset to ``done``, the next reset, a close, or
    ``idle_timeout_s`` without a message."""

    def __init__(self, source: InstanceSource, scenarios: dict[str, Scenario], *, reward_settings: Any = None,
                 max_sessions: int = 10_000, idle_timeout_s: float = 600.0, claim_timeout_s: float = 600.0,
                 sessions_dir: Path | None = None,
                 loader: Callable[[Scenario], Awaitable[Scenario]] | None = None) -> None:
        """``loader``: makes a ``pending`` scenario servable (:class:`OnDemand`)."""
        self.source, self.scenarios, self.loader = source, scenarios, loader
        self._loading: dict[str, asyncio.Task[Scenario]] = {}
        self.reward_settings = reward_settings
        self.max_sessions, self.idle_timeout_s, self.claim_timeout_s = max_sessions, idle_timeout_s, claim_timeout_s
        self.sessions: dict[str, Session] = {}
        self.sessions_dir = sessions_dir or Path(tempfile.gettempdir()) / "awm-openenv-sessions"
        self.waiting = 0
        self.started = time.time()
        self.episodes = 0

    async def ready(self, scenario: Scenario) -> Scenario:
        """``scenario`` made servable by the loader, once however many resets ask at the same time."""
        current = self.scenarios.get(scenario.name, scenario)
        if not current.pending:
            return current
        if self.loader is None:
            raise RuntimeError("a pending scenario and no loader")
        task = self._loading.get(scenario.name)
        if task is None:
            task = self._loading[scenario.name] = asyncio.ensure_future(self.loader(current))
        try:
            loaded = await asyncio.shield(task)
        except BaseException:
            if task.done():
                self._loading.pop(scenario.name, None)  # a failed import is tried again by the next reset
            raise
        self.scenarios[scenario.name] = loaded
        self._loading.pop(scenario.name, None)
        return loaded

    async def claim(self, env: str) -> Lease:
        self.waiting += 1
        try:
            async with asyncio.timeout(self.claim_timeout_s):
                return await self.source.claim(env)
        finally:
            self.waiting -= 1

    def open(self) -> Session:
        if len(self.sessions) >= self.max_sessions:
            raise SessionError(f"Server at capacity ({len(self.sessions)}/{self.max_sessions} sessions)",
                               "CAPACITY_REACHED", active_sessions=len(self.sessions), max_sessions=self.max_sessions)
        session = Session(self)
        self.sessions[session.id] = session
        return session

    async def close(self, session: Session) -> None:
        self.sessions.pop(session.id, None)
        await session.release()

    async def reap_idle(self) -> int:
        """Release the instances of sessions idle past the timeout."""
        now, reaped = time.monotonic(), 0
        for session in list(self.sessions.values()):
            if session.lease is not None and now - session.last_active > self.idle_timeout_s:
                await session.expire(self.idle_timeout_s)
                reaped += 1
        return reaped

    def stats(self) -> dict[str, Any]:
        now = time.monotonic()
        by_scenario: dict[str, int] = {}
        for s in self.sessions.values():
            key = s.scenario.name if s.scenario and s.lease else "unknown"
            by_scenario[key] = by_scenario.get(key, 0) + 1
        idle = [now - s.last_active for s in self.sessions.values()]
        holding = sum(1 for s in self.sessions.values() if s.lease is not None)
        size = getattr(self.source, "size", None)
        free = self.source.free() if hasattr(self.source, "free") else None
        return {"total_sessions": len(self.sessions), "max_idle_time_config": self.idle_timeout_s,
                "cleanup_interval_config": max(1.0, self.idle_timeout_s / 10), "allowed_idle_sessions_config": 0,
                "max_idle_s": round(max(idle), 1) if idle else 0, "scenarios": by_scenario,
                "awm": {"instances": size, "free_instances": free, "sessions_holding_an_instance": holding,
                        "resets_waiting": self.waiting,
                        "scenarios_imported": sum(1 for s in self.scenarios.values() if s.env),
                        "scenarios_pending": sum(1 for s in self.scenarios.values() if s.pending),
                        "switches": getattr(self.source, "switches", None), "max_sessions": self.max_sessions}}

    async def handle(self, session: Session, message: Any) -> dict[str, Any] | None:
        """One message's answer (None: the client closed the session)."""
        if not isinstance(message, dict):
            raise SessionError("a message must be a JSON object", "VALIDATION_ERROR")
        kind, data = message.get("type"), message.get("data", {})
        if kind == "close":
            return None
        if kind == "reset":
            if not isinstance(data, dict):
                raise SessionError("reset data must be a JSON object", "VALIDATION_ERROR")
            obs = await session.reset(data)
            return {"type": "observation", "data": obs.wire()}
        if kind == "step":
            result = await session.step(data)
            return {"type": "observation", "data": result.wire()}
        if kind == "state":
            return {"type": "state", "data": {"episode_id": session.episode_id, "step_count": session.steps}}
        raise SessionError(f"Unknown message type: {kind}", "UNKNOWN_TYPE")


def build_app(server: ProtocolServer) -> Any:
    """The ASGI app: ``/ws`` (sessions), ``/stats``, ``/health``, ``/metadata``, ``/schema``,
    FastAPI's ``/docs``; HTTP ``/reset`` and ``/step`` answer 400 as OpenEnv's AWM server does
    (an episode lives in a session)."""
    @contextlib.asynccontextmanager
    async def lifespan(app: Any):  # type: ignore[no-untyped-def]
        async def reap() -> None:
            while True:
                await asyncio.sleep(max(0.05, min(5.0, server.idle_timeout_s / 10)))
                try:
                    await server.reap_idle()
                except Exception:  # noqa: BLE001 - the sweep goes on; the failure is logged
                    log.exception("idle session sweep failed")

        sweeper = asyncio.create_task(reap())
        try:
            yield
        finally:
            sweeper.cancel()
            for session in list(server.sessions.values()):
                await server.close(session)

    app = FastAPI(title="awm: OpenEnv's AWM environment protocol", lifespan=lifespan)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/stats")
    async def stats() -> dict[str, Any]:
        return server.stats()

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {"name": "agent_world_model_env", "description": "AWM environments served by awm "
                f"({sum(1 for s in server.scenarios.values() if s.env)} scenarios, late binding)", "version": "awm"}

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {"action": {"oneOf": [_ListTools.model_json_schema(), _CallTool.model_json_schema()]},
                "observation": AwmObservation.model_json_schema(), "state": {
                    "type": "object", "properties": {"episode_id": {"type": ["string", "null"]},
                                                     "step_count": {"type": "integer"}}}}

    def stateless() -> JSONResponse:
        return JSONResponse(status_code=400, content={
            "error": "HTTP mode not supported for AWM environment",
            "reason": "an episode holds an instance across steps: use the WebSocket endpoint /ws",
            "solution": "Use WebSocket endpoint instead"})

    @app.post("/reset")
    async def http_reset() -> JSONResponse:
        return stateless()

    @app.post("/step")
    async def http_step() -> JSONResponse:
        return stateless()

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        await websocket.accept()
        try:
            session = server.open()
        except SessionError as exc:
            await websocket.send_text(json.dumps({"type": "error", "data": {"message": str(exc), "code": exc.code,
                                                                            **exc.extra}}))
            await websocket.close()
            return
        try:
            while True:
                raw = await websocket.receive_text()
                try:
                    reply = await server.handle(session, json.loads(raw))
                except json.JSONDecodeError as exc:
                    reply = {"type": "error", "data": {"message": f"Invalid JSON: {exc}", "code": "INVALID_JSON"}}
                except SessionError as exc:
                    reply = {"type": "error", "data": {"message": str(exc), "code": exc.code, **exc.extra}}
                except Exception as exc:  # noqa: BLE001 - the session goes on; the client hears why
                    log.exception("session %s: message failed", session.id)
                    reply = {"type": "error", "data": {"message": f"{type(exc).__name__}: {exc}",
                                                       "code": "EXECUTION_ERROR"}}
                if reply is None:
                    break
                await websocket.send_text(json.dumps(reply, ensure_ascii=False, default=str))
        except WebSocketDisconnect:
            pass
        except Exception as exc:  # noqa: BLE001 - e.g. a send to a client gone mid-step: its session ends
            log.info("session %s ended: %s: %s", session.id, type(exc).__name__, exc)
        finally:
            await server.close(session)
            with contextlib.suppress(Exception):
                await websocket.close()

    return app
