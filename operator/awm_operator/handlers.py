"""kopf handlers: EnvFleet, EnvClaim and env pods (imported by ``kopf run -m awm_operator.handlers``
or by ``awm_operator.main.run``).

* EnvFleet: ``on.event`` keeps the fleet's cached spec current and wakes its reconciler; a
  ``daemon`` per fleet *is* the reconciler (kopf stops it when the fleet goes away or when this
  replica is paused by peering, which is what makes a standby replica passive); ``on.delete``
  (the finalizer) deletes the pods and drops the fleet's databases.
* Pods of env servers are not watched through kopf but by ``watch.PodWatcher`` (started here on
  start-up), which feeds each fleet's in-memory pool; see watch.py for why.
* EnvClaim: ``on.event``, not ``on.create``: binding needs one status patch, and kopf's
  progress annotations would add a second write (and a second watch event) to every claim.
  A claim that cannot be bound at once waits in a task; its demand drives the autoscaler.
  Deleting a claim releases its instances (reset through the control API, back to the pool).

What the handlers share (the fleets, the claims' tasks, the servers, the reconcilers' context) is
one :class:`~awm_operator.operator_state.OperatorState` in kopf's memo, read through
``operator_state(memo)``.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import logging
import time
from typing import Any

import kopf

from awm.claims import BadRequest, ClaimRequest
from awm_operator import campaigns  # noqa: F401  (registers the Campaign and Job handlers)
from awm_operator import conditions, databases
from awm_operator.allocator import Allocator, ClaimError, NotActive, Unavailable
from awm_operator.api import bound_port, build_api, build_metrics, serve
from awm_operator.auth import Authenticator
from awm_operator.config import OperatorConfig
from awm_operator.crds import GROUP, VERSION, Condition, EnvClaimSpec, EnvClaimStatus
from awm_operator.fleet_shards import read_shards
from awm_operator.kube import ApiError, Kube, load_configuration
from awm_operator.metrics import Metrics
from awm_operator.operator_state import OperatorState, operator_state, stored_state
from awm_operator.peering import wait_for_peering
from awm_operator.phases import CLAIM_SETTLED, ClaimPhase
from awm_operator.pods import selector
from awm_operator.reconcile import Context, Reconciler
from awm_operator.state import Fleets
from awm_operator.watch import PodWatcher, owner_fleet

log = logging.getLogger("awm.operator")

FINALIZER = "awm.dev/finalizer"


def claim_id(name: str, uid: str) -> str:
    """The claim's key in the fleet's ledger: name and uid, so a claim deleted and re-created
    under the same name never releases its successor's instances."""
    return f"{name}.{uid[:8]}"


def _now() -> str:
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="milliseconds").replace("+00:00", "Z")


# --------------------------------------------------------------------------- operator lifecycle


@kopf.on.login()
async def login(memo: kopf.Memo, **kwargs: Any) -> kopf.ConnectionInfo | None:
    """The operator's own kubeconfig when it was given one (tests), else kopf's usual ways."""
    kubeconfig = operator_state(memo).kubeconfig  # (kopf logs in after the start-up handlers)
    if not kubeconfig:
        return await kopf.login_via_async_client(**kwargs)
    c = await load_configuration(kubeconfig)
    # a token user (a ServiceAccount's, a cloud login's) as well as a client certificate
    auth = (c.api_key or {}).get("authorization") or (c.api_key or {}).get("BearerToken")
    scheme, _, token = auth.partition(" ") if auth else ("", "", "")
    return kopf.ConnectionInfo(server=c.host, ca_path=c.ssl_ca_cert, insecure=not c.verify_ssl,
                               certificate_path=c.cert_file, private_key_path=c.key_file,
                               scheme=scheme or None, token=token or None)


@kopf.on.startup()
async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **_: Any) -> None:
    # what main.operate passed in the memo; none under `kopf run -m awm_operator.handlers`
    cfg: OperatorConfig = memo.get("config") or OperatorConfig.from_env()
    kubeconfig: str | None = memo.get("kubeconfig")
    settings.persistence.finalizer = FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix="awm.dev")
    settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
        prefix="awm.dev", key="last-handled-configuration")
    settings.posting.level = logging.WARNING  # no Kubernetes Event per handled claim or pod
    settings.watching.server_timeout = 300
    settings.networking.connect_timeout = 10
    kube = await Kube.connect(kubeconfig)
    metrics = Metrics()
    ctx = Context(kube=kube, allocator=Allocator(kube, metrics, cfg.reset_timeout), metrics=metrics, config=cfg)
    state = OperatorState(config=cfg, kubeconfig=kubeconfig, ctx=ctx, fleets=Fleets())
    state.keep(memo)
    auth = Authenticator(lambda path, body: kube.request("POST", path, body)) if cfg.api_auth else None
    if auth is None:
        log.warning("the allocation API is OPEN (AWM_API_AUTH=off): anyone who reaches it may claim instances")
    state.runners = [await serve(build_api(ctx, state.fleets, auth), cfg.api_host, cfg.api_port),
                     await serve(build_metrics(ctx), cfg.api_host, cfg.metrics_port)]
    cfg.api_port, cfg.metrics_port = (bound_port(r) for r in state.runners)  # port 0: the one picked
    watchers = [PodWatcher(kube, state.fleets, ns) for ns in (cfg.namespaces or [None])]
    state.watch_tasks = [asyncio.create_task(w.run(), name=f"awm pod watch {w.namespace}") for w in watchers]
    # Last, with the API and the pod watch already serving: kopf starts its peering after this
    # handler, and its first announcement must find the peering objects (awm_operator/peering.py).
    await wait_for_peering(kube, cfg)


@kopf.on.cleanup()
async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    state = stored_state(memo)
    if state is None:  # the start-up handler failed before it had anything to clean up
        return
    for task in [*state.claim_tasks.values(), *state.watch_tasks]:
        task.cancel()
    for runner in state.runners:
        await runner.cleanup()
    await state.ctx.allocator.close()
    await state.ctx.kube.close()


# --------------------------------------------------------------------------- fleets


@kopf.on.event(GROUP, VERSION, "envfleets")
async def fleet_event(event: kopf.RawEvent, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    state = operator_state(memo)
    if event["type"] == "DELETED":
        state.fleets.drop(namespace, name)
        state.ctx.metrics.forget_fleet(namespace, name)
        return
    state.fleets.ensure(namespace, name).set_body(event["object"])


@kopf.daemon(GROUP, VERSION, "envfleets", cancellation_timeout=10.0)
async def fleet_daemon(stopped: kopf.DaemonStopped, namespace: str, name: str, body: kopf.Body,
                       memo: kopf.Memo, **_: Any) -> None:
    state = operator_state(memo)
    fleet = state.fleets.ensure(namespace, name)
    if fleet.spec is None:
        fleet.set_body(_plain(body))
    await Reconciler(fleet, state.ctx).run(stopped)


@kopf.on.delete(GROUP, VERSION, "envfleets", retries=12, backoff=5)
async def fleet_deleted(namespace: str, name: str, body: kopf.Body, memo: kopf.Memo,
                        logger: kopf.Logger, retry: int, **_: Any) -> None:
    """Delete the pods, wait until they are gone (an init container could still create a
    database), then drop every database of the fleet."""
    state = operator_state(memo)
    ctx = state.ctx
    fleet = state.fleets.ensure(namespace, name)
    if fleet.spec is None:
        fleet.set_body(_plain(body))
    fleet.deleted = True
    fleet.poke()
    deadline = time.monotonic() + 30
    while True:
        pods = await ctx.kube.list_pod_metadata(namespace, selector(name))
        pods = [p for p in pods if _owned_by(p, name)]
        if not pods:
            break
        if time.monotonic() > deadline:
            raise kopf.TemporaryError(f"{len(pods)} pods still terminating", delay=5)
        await asyncio.gather(*(ctx.kube.delete_pod(namespace, p["metadata"]["name"])
                               for p in pods if not p["metadata"].get("deletionTimestamp")))
        await asyncio.sleep(0.5)
    dropped = 0
    try:
        shards = await read_shards(ctx.kube, fleet)
    except Exception as exc:
        if retry < 3:
            raise kopf.TemporaryError(f"cannot read the fleet's database Secret yet: {exc}", delay=5) from exc
        logger.error(f"giving up on dropping the databases of {namespace}/{name}: {exc}")
        return
    failed: list[str] = []
    for shard in shards.values():  # every shard: a shard down now keeps the fleet's databases, said below
        try:
            found = await asyncio.to_thread(databases.fleet_databases, shard.dsn, namespace, name)
            await asyncio.to_thread(databases.drop, shard.dsn, list(found))
            dropped += len(found)
        except Exception as exc:
            failed.append(f"{shard.name}: {exc}")
    if failed:
        if retry < 3:
            raise kopf.TemporaryError(f"cannot drop the fleet's databases yet ({'; '.join(failed)})", delay=5)
        logger.error(f"giving up on dropping the databases of {namespace}/{name} on {'; '.join(failed)}")
    logger.info(f"deleted fleet {namespace}/{name}: pods gone, {dropped} databases dropped")


def _plain(body: Any) -> dict[str, Any]:
    return {"metadata": dict(body.get("metadata", {})), "spec": dict(body.get("spec", {}))}


def _owned_by(pod: dict[str, Any], fleet: str) -> bool:
    return owner_fleet(pod) == fleet


# --------------------------------------------------------------------------- claims


@kopf.on.event(GROUP, VERSION, "envclaims")
async def claim_event(event: kopf.RawEvent, namespace: str, name: str, memo: kopf.Memo, **_: Any) -> None:
    obj = event["object"]
    uid = obj["metadata"]["uid"]
    cid = claim_id(name, uid)
    state = operator_state(memo)
    ctx, tasks = state.ctx, state.claim_tasks
    if event["type"] == "DELETED":
        ctx.known_claims.discard((namespace, cid))
        state.claims_done.discard(uid)
        task = tasks.pop(uid, None)
        if task is not None:
            task.cancel()
        fleet_name = (obj.get("spec") or {}).get("fleet")
        fleet = state.fleets.get(namespace, fleet_name) if fleet_name else None
        if fleet is not None and cid in fleet.claims:
            returned, replaced = await ctx.allocator.release(fleet, cid)
            log.info("claim %s/%s released: %d returned, %d replaced", namespace, name, returned, replaced)
        return
    ctx.known_claims.add((namespace, cid))
    if EnvClaimStatus.read(obj.get("status")).phase in CLAIM_SETTLED or uid in tasks or uid in state.claims_done:
        return
    generation = int(obj["metadata"].get("generation") or 0)
    tasks[uid] = asyncio.create_task(_bind(state, namespace, name, uid, obj.get("spec") or {}, generation))


async def _bind(state: OperatorState, namespace: str, name: str, uid: str, raw_spec: dict[str, Any],
                generation: int) -> None:
    """Bind at once if the pool allows, else mark the claim Pending and wait for capacity."""
    ctx = state.ctx
    written: list[Condition] = []  # the conditions last written (their transition times)

    async def report(phase: ClaimPhase, message: str, **fields: Any) -> None:
        """A phase of this claim, with its conditions and the generation acted on."""
        written[:] = conditions.claim_conditions(phase, message, written, generation)
        await ctx.kube.patch_status("envclaims", namespace, name, EnvClaimStatus(
            phase=phase, message=message, conditions=written, observed_generation=generation, **fields))

    t0 = time.monotonic()
    cancelled = False
    try:
        try:
            spec = EnvClaimSpec.model_validate(raw_spec)
            req = ClaimRequest.read(dict(count=spec.count, environment=spec.environment, group_size=spec.group_size))
        except (ValueError, BadRequest) as exc:
            await report(ClaimPhase.FAILED, f"invalid spec: {exc}")
            return
        fleet = state.fleets.ensure(namespace, spec.fleet)
        cid = claim_id(name, uid)
        try:
            try:
                bound = await ctx.allocator.claim(fleet, cid, req, wait=0, source="envclaim", ttl=spec.ttl_seconds)
            except (Unavailable, NotActive) as exc:
                message = str(exc)
                if fleet.spec is None and not fleet.uid:  # a typo, or a fleet applied after its claim
                    message = f"EnvFleet {spec.fleet!r} not found in namespace {namespace}: waiting for it"
                await report(ClaimPhase.PENDING, message)
                bound = await ctx.allocator.claim(fleet, cid, req, wait=None, source="envclaim",
                                                  ttl=spec.ttl_seconds)
        except ClaimError as exc:
            await report(ClaimPhase.FAILED, str(exc))
            return
        latency = round((time.monotonic() - t0) * 1000, 3)
        try:
            await report(ClaimPhase.BOUND, f"{len(bound)} instances bound", instances=[b.instance() for b in bound],
                         bound_at=_now(), latency_ms=latency)
        except ApiError as exc:
            if exc.status == 404:  # deleted while binding: give the instances back
                await ctx.allocator.release(fleet, cid)
                return
            raise
    except asyncio.CancelledError:  # the claim was deleted while it waited
        cancelled = True
        raise
    finally:
        state.claim_tasks.pop(uid, None)
        if not cancelled:
            state.claims_done.add(uid)

