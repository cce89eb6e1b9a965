"""Campaigns: a training or evaluation run on the cluster, from one custom resource.

For a ``Campaign`` the operator creates (each owned by the Campaign, so deleting it deletes them):

* an ``EnvFleet`` with autoscaling on, sized to the run's demand (environments x
  groupsPerEnvironment x group size): its buffer keeps that many instances warm before the
  trainer asks, and maxReplicas caps the fleet there;
* for training, a ``ConfigMap`` holding the rendered ``awm train`` configuration;
* a ``batch/v1`` ``Job`` running ``awm train --config ...`` or ``awm eval ...`` in the trainer
  image. Its environment tells it where the operator's allocation API is, and the namespace,
  fleet and campaign (``AWM_OPERATOR_URL``, ``AWM_NAMESPACE``, ``AWM_FLEET``, ``AWM_CAMPAIGN``):
  the trainer then claims instances through the allocation API (``trainer/k8s_source.py``) and
  posts its progress back here.

The Job decides the campaign's fate: Pending until its pod is ready, Running then (or as soon as
progress arrives), Succeeded or Failed with the Job. When the campaign finishes the operator
deletes the fleet (``spec.cleanup.deleteFleet``, default on); the fleet's finalizer then deletes
the pods and drops their databases.

Writes to the API server are few by design: the children are created once (an operator that
restarts gets 409 for each and checks they are the campaign's own), the status is patched on
phase changes, and progress reports, however often they come, are coalesced into at most one
status patch per ``AWM_CAMPAIGN_STATUS_INTERVAL`` seconds (default 2). Campaigns and Jobs are
followed through kopf *event* handlers, not create/update handlers: those would add kopf's
progress and diff-base annotations, two more writes (and watch events) per change. Jobs are
watched with a server-side label selector, so the operator never lists other Jobs.

What the children look like, and what a Job's status means, are pure functions in
``campaign_manifests.py``; this module holds the campaigns' state, creates and finishes their
children, follows Campaigns and Jobs, and serves the progress route.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import kopf
from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from awm_operator import conditions
from awm_operator.campaign_manifests import (
    APP_NAME, JOB_SELECTOR, L_NAME, PLURAL, CampaignSettings, JobState, Names,
    config_map_manifest, fleet_manifest, job_manifest, job_state, owning_campaign, trainer_access,
    workers_service_manifest)
from awm_operator.crds import GROUP, VERSION, CampaignSpec, CampaignStatus, Condition
from awm_operator.kube import ApiError
from awm_operator.operator_state import operator_state, stored_state
from awm_operator.phases import CAMPAIGN_TERMINAL as TERMINAL
from awm_operator.phases import CampaignPhase, CampaignReason, ConditionType
from awm_operator.phases import campaign_advances as advances
from awm_operator.reconcile import Context
from awm_operator.state import Fleets

log = logging.getLogger("awm.operator.campaigns")

def condition(state: "CampaignState", kind: str, ok: bool, reason: str, message: str) -> Condition:
    """A campaign's condition (conditions.py), its transition time kept from the last status."""
    return conditions.condition(kind, ok, reason, message, generation=state.generation,
                                previous=state.status.get("conditions") or ())




class ProgressReport(BaseModel):
    """The body of ``POST .../campaigns/{name}/progress`` (all optional: a report carries what
    the run knows)."""

    model_config = ConfigDict(populate_by_name=True, extra="forbid")
    step: int | None = Field(None, ge=0)
    reward_mean: float | None = Field(None, alias="rewardMean")
    rollouts_per_s: float | None = Field(None, alias="rolloutsPerS", ge=0)
    pass_rates: dict[str, float] | None = Field(None, alias="passRates")
    pass_at_k: dict[str, float] | None = Field(None, alias="passAtK")

    def status(self) -> dict[str, Any]:
        return self.model_dump(by_alias=True, exclude_none=True)


# --------------------------------------------------------------------------- in-memory state


@dataclass
class CampaignState:
    """What the operator remembers of one campaign between events: the phase it last wrote or
    read (so it writes only on changes), and progress waiting for its rate-limited patch."""

    namespace: str
    name: str
    uid: str
    phase: str = ""
    status: dict[str, Any] = field(default_factory=dict)
    spec: dict[str, Any] = field(default_factory=dict)
    ensured: bool = False
    busy: bool = False                        # a task is creating or finishing it
    settled: bool = False                     # finished and cleaned up: nothing more to do
    pending: dict[str, Any] = field(default_factory=dict)
    last_flush: float = float("-inf")  # never: the first report goes out at once (monotonic may be small)
    flush_scheduled: bool = False
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    generation: int = 0                       # metadata.generation of the last event (observedGeneration)


class Campaigns:
    """Every campaign this operator knows, with the background tasks and timers working on them."""

    def __init__(self, ctx: Context, settings: CampaignSettings) -> None:
        self.ctx, self.settings = ctx, settings
        self.known: dict[tuple[str, str], CampaignState] = {}
        self.tasks: set[asyncio.Task[Any]] = set()
        self.timers: set[asyncio.TimerHandle] = set()

    def get(self, namespace: str, name: str) -> CampaignState | None:
        return self.known.get((namespace, name))

    def observe(self, obj: dict[str, Any]) -> CampaignState:
        """Track a campaign body from the watch (or a read): a new uid is a new campaign."""
        meta = obj["metadata"]
        key = (meta["namespace"], meta["name"])
        state = self.known.get(key)
        if state is None or state.uid != meta["uid"]:
            state = self.known[key] = CampaignState(meta["namespace"], meta["name"], meta["uid"])
        status = obj.get("status") or {}
        if advances(state.phase, status.get("phase", "")):
            state.phase = status["phase"]
        state.status = {**state.status, **status, "phase": state.phase}
        state.spec = obj.get("spec") or {}
        state.generation = int(meta.get("generation") or 0)
        return state

    def forget(self, namespace: str, name: str, uid: str) -> None:
        state = self.known.get((namespace, name))
        if state is not None and state.uid == uid:
            del self.known[(namespace, name)]
            self.ctx.metrics.forget_campaign(namespace, name)

    def spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)

    def close(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        for timer in list(self.timers):
            timer.cancel()

    # ---- status writes
    async def patch(self, state: CampaignState, status: CampaignStatus) -> bool:
        """One status patch; False if the campaign is gone (then it is forgotten)."""
        if status.model_fields_set & {"phase", "conditions"}:  # acting on the spec, not a progress report
            status = status.model_copy(update={"observed_generation": state.generation})
        try:
            await self.ctx.kube.patch_status(PLURAL, state.namespace, state.name, status)
        except ApiError as exc:
            if exc.status == 404:
                self.forget(state.namespace, state.name, state.uid)
                return False
            raise
        state.status.update(status.patch())
        if "phase" in status.model_fields_set:
            state.phase = status.phase
        self.ctx.metrics.observe_campaign(state.namespace, state.name, state.status)
        return True

    def report(self, state: CampaignState, progress: dict[str, Any]) -> None:
        """Take a progress report; it reaches the status with the next patch, at most one every
        ``status_interval`` seconds (newer values replace older ones while they wait)."""
        state.pending.update(progress)
        if state.flush_scheduled:
            return
        state.flush_scheduled = True
        delay = max(0.0, state.last_flush + self.settings.status_interval - time.monotonic())
        loop = asyncio.get_running_loop()
        handle: asyncio.TimerHandle | None = None

        def fire() -> None:
            if handle is not None:
                self.timers.discard(handle)
            self.spawn(self.flush(state))

        handle = loop.call_later(delay, fire)
        self.timers.add(handle)

    async def flush(self, state: CampaignState) -> None:
        async with state.lock:
            state.flush_scheduled = False
            body, state.pending = state.pending, {}
            if not body:
                return
            if state.phase in ("", CampaignPhase.PENDING):  # a run that reports progress is running
                body = {**body, "phase": CampaignPhase.RUNNING, "startedAt": state.status.get("startedAt") or conditions.now(),
                        "message": "the run reports progress"}
            state.last_flush = time.monotonic()
            try:
                await self.patch(state, CampaignStatus.model_validate(body))
            except (ApiError, OSError, asyncio.TimeoutError) as exc:
                log.warning("campaign %s/%s: progress not written: %s", state.namespace, state.name, exc)
                state.pending = {**body, **state.pending}
                state.pending.pop("phase", None)
                state.pending.pop("startedAt", None)
                state.pending.pop("message", None)
                self.report(state, {})


def campaigns_of(ctx: Context) -> Campaigns:
    """The campaign registry of one operator. It hangs off the operator's shared Context (built
    once by the startup handler and reached by both the kopf handlers and the HTTP API) because
    more than one operator may run in a process (tests, benchmarks): a module global would mix
    them up."""
    if ctx.campaigns is None:
        ctx.campaigns = Campaigns(ctx, CampaignSettings.from_env())
    registry: Campaigns = ctx.campaigns
    return registry


# --------------------------------------------------------------------------- creating and finishing


class NotOurs(RuntimeError):
    """An object of the campaign's child name exists but belongs to something else."""


async def _create_owned(ctx: Context, collection: str, body: dict[str, Any], uid: str) -> None:
    """Create a child; an existing one (an operator restart, a second replica) is fine if the
    campaign owns it, and an error if not: the campaign must never adopt nor later delete an
    object it did not make."""
    try:
        await ctx.kube.request("POST", collection, body)
        return
    except ApiError as exc:
        if exc.status != 409:
            raise
    existing = await ctx.kube.request("GET", f"{collection}/{body['metadata']['name']}")
    owners = {r.get("uid") for r in (existing.get("metadata") or {}).get("ownerReferences") or []}
    if uid not in owners:
        raise NotOurs(f"{body['kind']} {body['metadata']['name']} exists and does not belong to this campaign")


def _api_base(namespace: str) -> dict[str, str]:
    return {"fleets": f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/envfleets",
            "configmaps": f"/api/v1/namespaces/{namespace}/configmaps",
            "services": f"/api/v1/namespaces/{namespace}/services",
            "jobs": f"/apis/batch/v1/namespaces/{namespace}/jobs"}


async def ensure(registry: Campaigns, state: CampaignState) -> None:
    """Create what a campaign needs (idempotent), then record the children in its status once."""
    ctx = registry.ctx
    async with state.lock:
        if state.ensured or state.phase in TERMINAL:
            return
        try:
            spec = CampaignSpec.model_validate(state.spec)
        except ValidationError as exc:
            message = "; ".join(f"{'.'.join(str(p) for p in e['loc']) or 'spec'}: {e['msg']}" for e in exc.errors())
            await registry.patch(state, CampaignStatus(
                phase=CampaignPhase.FAILED, message=f"invalid spec: {message}", finished_at=conditions.now(),
                conditions=[condition(state, ConditionType.FAILED, True, CampaignReason.INVALID_SPEC, message),
                            condition(state, ConditionType.FLEET_DELETED, False, CampaignReason.NOT_CREATED,
                                      "no fleet was created")]))
            state.settled = True
            return
        names, base = Names.of(state.name), _api_base(state.namespace)
        operator_url = registry.settings.operator_url or f"http://127.0.0.1:{ctx.config.api_port}"
        try:
            await _create_owned(ctx, base["fleets"], fleet_manifest(state.name, state.namespace, state.uid, spec),
                                state.uid)
            if spec.mode == "training":
                await _create_owned(ctx, base["configmaps"],
                                    config_map_manifest(state.name, state.namespace, state.uid, spec), state.uid)
                if spec.training is not None and spec.training.learner.nodes > 1:
                    await _create_owned(ctx, base["services"],
                                        workers_service_manifest(state.name, state.namespace, state.uid, spec), state.uid)
            for collection, manifest in trainer_access(state.name, state.namespace, state.uid):
                await _create_owned(ctx, collection, manifest, state.uid)
            await _create_owned(ctx, base["jobs"], job_manifest(state.name, state.namespace, state.uid, spec,
                                                                ctx.config, registry.settings, operator_url), state.uid)
        except (NotOurs, ApiError) as exc:
            if isinstance(exc, ApiError) and (exc.status >= 500 or exc.status == 429):
                raise  # transient: the caller retries
            # The fleet may exist already (the Job failed): the finish path deletes it.
            await registry.patch(state, CampaignStatus(
                phase=CampaignPhase.FAILED, message=str(exc), finished_at=conditions.now(),
                conditions=[condition(state, ConditionType.FAILED, True, CampaignReason.CREATE_FAILED, str(exc))]))
            return
        state.ensured = True
        if state.status.get("fleet") == names.fleet and state.status.get("job") == names.job:
            return  # resumed: the status already says so
        await registry.patch(state, CampaignStatus(
            phase=state.phase or CampaignPhase.PENDING, fleet=names.fleet, job=names.job, instances=spec.instances,
            message=f"fleet of {spec.instances} instances and Job {names.job} created",
            conditions=[condition(state, ConditionType.CREATED, True, CampaignReason.CREATED, "EnvFleet and Job created")]))


async def ensure_with_retries(registry: Campaigns, state: CampaignState) -> None:
    """The API server may be briefly unavailable: retry with backoff instead of dropping the
    campaign until its next watch event."""
    try:
        for attempt in range(8):
            try:
                await ensure(registry, state)
                return
            except (ApiError, OSError, asyncio.TimeoutError) as exc:
                log.warning("campaign %s/%s: creating its fleet and Job: %s (retrying)", state.namespace,
                            state.name, exc)
                await asyncio.sleep(min(30.0, 0.5 * 2 ** attempt))
        log.error("campaign %s/%s: gave up creating its fleet and Job", state.namespace, state.name)
    finally:
        state.busy = False


async def finish(registry: Campaigns, state: CampaignState, outcome: JobState) -> None:
    """The Job is done: delete the fleet (its finalizer drops pods and databases) unless the
    spec keeps it, then write the final phase in one patch, pending progress included."""
    ctx = registry.ctx
    async with state.lock:
        if not advances(state.phase, outcome.phase) and state.settled:
            return
        delete = bool((state.spec.get("cleanup") or {}).get("deleteFleet", True))
        fleet = state.status.get("fleet") or Names.of(state.name).fleet
        # (not named `conditions`: that is the module, whose now() stamps finishedAt below)
        ended = ConditionType.FAILED if outcome.phase == CampaignPhase.FAILED else ConditionType.COMPLETE
        conds = [condition(state, ended, True, outcome.reason, outcome.message)]
        if delete:
            path = f"{_api_base(state.namespace)['fleets']}/{fleet}"
            try:
                existing = await ctx.kube.request("GET", path)
            except ApiError as exc:
                if exc.status != 404:
                    raise
                existing = None
            owners = {r.get("uid") for r in ((existing or {}).get("metadata") or {}).get("ownerReferences") or []}
            if existing is not None and state.uid in owners:
                try:
                    await ctx.kube.request("DELETE", path, {"propagationPolicy": "Background"})
                except ApiError as exc:
                    if exc.status != 404:
                        raise
            conds.append(condition(state, ConditionType.FLEET_DELETED, True, CampaignReason.CLEANUP,
                                   f"EnvFleet {fleet} deleted"))
        else:
            conds.append(condition(state, ConditionType.FLEET_DELETED, False, CampaignReason.KEPT,
                                   "spec.cleanup.deleteFleet is false"))
        body: dict[str, Any] = {**state.pending, "message": outcome.message, "conditions": conds}
        state.pending = {}
        if advances(state.phase, outcome.phase):
            body |= {"phase": outcome.phase, "finishedAt": outcome.finished_at or conditions.now()}
            if not state.status.get("startedAt"):
                body["startedAt"] = outcome.started_at or body["finishedAt"]
        if await registry.patch(state, CampaignStatus.model_validate(body)):
            state.settled = True
        log.info("campaign %s/%s: %s (%s)", state.namespace, state.name, outcome.phase, outcome.message)


async def _retrying(what: str, state: CampaignState, step: Any) -> None:
    """Run ``step()`` until it gets through: a finished Job sends no more events, so a transient
    API error must not leave its campaign Running."""
    for attempt in range(8):
        try:
            await step()
            return
        except (ApiError, OSError, asyncio.TimeoutError) as exc:
            if isinstance(exc, ApiError) and exc.status < 500 and exc.status != 429:
                raise
            log.warning("campaign %s/%s: %s: %s (retrying)", state.namespace, state.name, what, exc)
            await asyncio.sleep(min(30.0, 0.5 * 2 ** attempt))
    log.error("campaign %s/%s: gave up: %s", state.namespace, state.name, what)


async def follow(registry: Campaigns, state: CampaignState, outcome: JobState) -> None:
    """A Job event: move the campaign's phase forward if the Job says so."""
    if outcome.phase in TERMINAL:
        await _retrying("finishing", state, lambda: finish(registry, state, outcome))
        return
    async with state.lock:
        if not advances(state.phase, outcome.phase):
            return
        status = CampaignStatus(phase=outcome.phase, message=outcome.message)
        if outcome.phase == CampaignPhase.RUNNING:
            status.started_at = state.status.get("startedAt") or outcome.started_at or conditions.now()
        await registry.patch(state, status)


def _finished_and_cleaned(status: dict[str, Any], spec: dict[str, Any]) -> bool:
    read = CampaignStatus.read(status)
    if read.phase not in TERMINAL:
        return False
    if not (spec.get("cleanup") or {}).get("deleteFleet", True):
        return True
    return any(c.type == ConditionType.FLEET_DELETED for c in read.conditions)


# --------------------------------------------------------------------------- kopf handlers


@kopf.on.startup()
async def campaign_startup(settings: kopf.OperatorSettings, **_: Any) -> None:
    """Watch only the Jobs campaigns made (server-side label selector)."""
    settings.watching.label_selectors["batch", "v1", "jobs"] = JOB_SELECTOR


@kopf.on.cleanup()
async def campaign_cleanup(memo: kopf.Memo, **_: Any) -> None:
    state = stored_state(memo)
    if state is not None:
        campaigns_of(state.ctx).close()


@kopf.on.event(GROUP, VERSION, PLURAL)
async def campaign_event(event: kopf.RawEvent, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    registry = campaigns_of(operator_state(memo).ctx)
    obj = event["object"]
    if event["type"] == "DELETED":  # its fleet, ConfigMap and Job go by garbage collection
        registry.forget(namespace, name, obj["metadata"]["uid"])
        return
    state = registry.observe(obj)
    if state.settled or state.ensured or state.busy:
        return
    status = obj.get("status") or {}
    if _finished_and_cleaned(status, state.spec):
        state.settled = True
        return
    state.busy = True
    if state.phase in TERMINAL:
        # Finished while nobody cleaned up (an operator restart in between): do it now.
        outcome = JobState(CampaignPhase(state.phase), CampaignReason.FINISHED,
                           status.get("message") or f"campaign {state.phase.lower()}",
                           status.get("startedAt"), status.get("finishedAt"))
        registry.spawn(_finish_then_idle(registry, state, outcome))
        return
    registry.spawn(ensure_with_retries(registry, state))


async def _finish_then_idle(registry: Campaigns, state: CampaignState, outcome: JobState) -> None:
    try:
        await _retrying("cleaning up", state, lambda: finish(registry, state, outcome))
    finally:
        state.busy = False


@kopf.on.event("batch", "v1", "jobs", labels={L_NAME: APP_NAME})
async def campaign_job_event(event: kopf.RawEvent, namespace: str, memo: kopf.Memo, **_: Any) -> None:
    registry = campaigns_of(operator_state(memo).ctx)
    job = event["object"]
    campaign = owning_campaign(job)
    if campaign is None:
        return
    state = registry.get(namespace, campaign)
    if state is None:  # the Job's event came before its campaign's (start-up): read the campaign
        obj = await registry.ctx.kube.get_object(PLURAL, namespace, campaign)
        if obj is None:
            return
        state = registry.observe(obj)
    if state.settled:
        return
    if event["type"] == "DELETED":
        if state.phase not in TERMINAL:
            registry.spawn(finish(registry, state, JobState(CampaignPhase.FAILED, CampaignReason.JOB_DELETED,
                                                            f"Job {job['metadata']['name']} was deleted before it finished")))
        return
    await follow(registry, state, job_state(job))


# --------------------------------------------------------------------------- progress API


async def _not_followed(ctx: Context, namespace: str, name: str) -> web.Response:
    """The answer for a campaign this replica does not follow. A standby replica knows no
    campaign at all (kopf pauses its handlers) yet may have no fleet either, so it cannot tell
    itself a standby: the API server says whether the campaign exists. (A 404 from a standby once
    made a campaign's Job give its reports up while the active replica waited for them.)"""
    if await ctx.kube.get_object(PLURAL, namespace, name) is None:
        return web.json_response({"error": "no such campaign"}, status=404)
    return web.json_response({"error": "this operator replica does not follow the campaign (a standby)"}, status=503)


def add_campaign_routes(routes: web.RouteTableDef, ctx: Context, fleets: Fleets) -> None:
    """The campaigns' routes on the allocation API's port.

    ``GET /v1/namespaces/{ns}/campaigns`` (RBAC ``list campaigns``): every campaign this replica
    follows in the namespace, as ``awm ui`` shows them in a cluster: the status, progress that is
    still waiting for its rate-limited status write, and the counts of the campaign's fleet.

    ``POST /v1/namespaces/{ns}/campaigns/{name}/progress`` on the allocation API's port, where
    the campaign's Job already talks to the operator: ``{"step", "rewardMean", "rolloutsPerS",
    "passRates"}`` -> 202. The report lands in the Campaign's status within
    ``AWM_CAMPAIGN_STATUS_INTERVAL`` seconds; 404 for a campaign the API server does not know,
    503 from a replica that does not follow it (a standby: its kopf handlers are paused; or one
    starting), so that the client asks again, on a new connection, until the active one answers."""

    @routes.post("/v1/namespaces/{ns}/campaigns/{name}/progress")
    async def progress(request: web.Request) -> web.Response:
        if not fleets.acting():
            return web.json_response({"error": "standby replica"}, status=503)
        try:
            body = await request.json() if request.can_read_body else {}
            report = ProgressReport.model_validate(body)
        except (ValueError, ValidationError) as exc:
            return web.json_response({"error": f"bad request: {exc}"}, status=400)
        registry = campaigns_of(ctx)
        namespace, name = request.match_info["ns"], request.match_info["name"]
        state = registry.get(namespace, name)
        if state is None:
            return await _not_followed(ctx, namespace, name)
        registry.report(state, report.status())
        return web.json_response({"accepted": True, "phase": state.phase or CampaignPhase.PENDING}, status=202)

    @routes.get("/v1/namespaces/{ns}/campaigns")
    async def listing(request: web.Request) -> web.Response:
        namespace = request.match_info["ns"]
        try:
            listed = await ctx.kube.request("GET", f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/{PLURAL}")
        except (ApiError, OSError, asyncio.TimeoutError) as exc:
            return web.json_response({"error": f"cannot list campaigns: {exc}"}, status=502)
        registry = campaigns_of(ctx)
        rows = [campaign_summary(obj, registry.get(namespace, obj["metadata"]["name"]), fleets)
                for obj in sorted(listed.get("items") or [], key=lambda o: o["metadata"]["name"])]
        return web.json_response({"namespace": namespace, "campaigns": rows})


def campaign_summary(obj: dict[str, Any], state: CampaignState | None, fleets: Fleets) -> dict[str, Any]:
    """One campaign as ``GET .../campaigns`` lists it: what its spec asks (mode, environments,
    group size, model), its status, and, where this replica follows it (the active one), the
    progress still waiting for its rate-limited status write and its fleet's counts. The list
    itself comes from the API server, so a standby replica (which follows nothing) or one just
    started answers with every campaign too."""
    meta, spec = obj["metadata"], obj.get("spec") or {}
    status = dict(obj.get("status") or {})
    if state is not None and state.uid == meta.get("uid"):
        status |= {**state.status, **state.pending}
    training, evaluation = spec.get("training") or {}, spec.get("evaluation") or {}
    fleet_name = status.get("fleet") or Names.of(meta["name"]).fleet
    fleet = fleets.get(meta["namespace"], fleet_name)
    counts = None
    if fleet is not None and fleet.spec is not None and fleet.active and not fleet.deleted:
        counts = fleet.counts().as_dict()
    return {"namespace": meta["namespace"], "name": meta["name"], "mode": spec.get("mode"),
            "environments": len(spec.get("environments") or []),
            "groupSize": training.get("groupSize") or (spec.get("external") or {}).get("groupSize"),
            "model": evaluation.get("model"), "created": meta.get("creationTimestamp"),
            "status": {k: status[k] for k in CAMPAIGN_STATUS_FIELDS if k in status},
            "fleet": fleet_name, "fleetCounts": counts}


# what GET .../campaigns shows of a status (its API names: CampaignStatus)
CAMPAIGN_STATUS_FIELDS = tuple((f.alias or n) for n, f in CampaignStatus.model_fields.items())
