"""The operator's custom resources (awm_operator/crds.py): a fleet's binding, environment
selectors over a catalog's index (catalog_index.py), the kinds' typed status and its conditions
(conditions.py), and the CRDs in the chart."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from awm.cli import app
from awm.claims import ClaimRequest
from awm_operator.config import OperatorConfig
from awm_operator.crds import EnvFleetSpec
from awm_operator.pods import pod_manifest
from awm_operator.state import unsatisfiable
from tests.operator_fakes import fleet_spec, serve_app

ROOT = Path(__file__).resolve().parent.parent


def test_environment_selector_chooses_from_the_index() -> None:
    from awm_operator.catalog_index import index_names
    from awm_operator.crds import EnvironmentSelector

    names = index_names({"environments": [{"name": n} for n in ("crm", "bike_shop", "crm_lite", "hotel", "car_shop")]})
    assert EnvironmentSelector().select(names) == ["bike_shop", "car_shop", "crm", "crm_lite", "hotel"]
    sel = EnvironmentSelector.model_validate({"matchNames": ["crm*", "*_shop"], "excludeNames": ["car_*"], "limit": 3})
    assert sel.select(names) == ["bike_shop", "crm", "crm_lite"]
    for bad in ({"environments": "crm"}, {"environments": [{"tasks": 3}]}, ["crm"]):
        with pytest.raises(ValueError, match="not a catalog index"):
            index_names(bad)
    # one way to choose, and a selector needs an index to choose from
    with pytest.raises(ValueError, match="either environments or environmentSelector"):
        fleet_spec(environmentSelector={"matchNames": ["crm*"]}, catalog={"url": "http://c"})
    with pytest.raises(ValueError, match="either environments or environmentSelector"):
        fleet_spec(environments=[])
    with pytest.raises(ValueError, match="needs catalog.url or catalog.indexConfigMap"):
        fleet_spec(environments=[], environmentSelector={})
    with pytest.raises(ValueError, match="minReplicas must not exceed maxReplicas"):
        fleet_spec(minReplicas=5, maxReplicas=4)
    spec = fleet_spec(environments=[], environmentSelector={"matchNames": ["crm*"]}, catalog={"indexConfigMap": "idx"})
    assert unsatisfiable(ClaimRequest(count=2, environment="crm"), spec, None) is None  # not resolved yet: no verdict
    assert unsatisfiable(ClaimRequest(count=2, environment="hotel"), spec, ["crm", "crm_lite"]) == "environment 'hotel' is not in the fleet"


async def test_an_oversized_or_broken_index_is_refused() -> None:
    """The operator reads a catalog's index.json over HTTP: an answer larger than the cap or not
    an index is an error on the fleet, not a memory blow-up or a crash."""
    import aiohttp
    from aiohttp import web

    from awm_operator import catalog_index
    from awm_operator.crds import CatalogSource

    bodies = {"/big/index.json": b" " * (catalog_index.MAX_INDEX_BYTES + 1),
              "/bad/index.json": b'{"environments": 3}',
              "/ok/index.json": b'{"environments": [{"name": "crm"}]}'}
    app = web.Application()
    async def serve(request: web.Request) -> web.Response:
        return web.Response(body=bodies[request.path]) if request.path in bodies else web.Response(status=404)

    app.router.add_get("/{kind}/index.json", serve)
    runner, url = await serve_app(app)
    try:
        async with aiohttp.ClientSession() as http:
            async def read(kind: str) -> list[str]:
                return await catalog_index.read_index(None, http, "ns", CatalogSource(url=f"{url}/{kind}"))  # type: ignore[arg-type]
            assert await read("ok") == ["crm"]
            with pytest.raises(ValueError, match="larger than 8 MiB"):
                await read("big")
            with pytest.raises(ValueError, match="not a catalog index"):
                await read("bad")
            with pytest.raises(ValueError, match="HTTP 404"):
                await read("none")
    finally:
        await runner.cleanup()


def test_conditions_keep_their_transition_time_while_their_status_stays() -> None:
    from awm_operator.conditions import claim_conditions, condition

    first = condition("Ready", False, "Reconciling", "0 of 2", generation=3, at="2026-01-01T00:00:00Z")
    assert first.model_dump(by_alias=True) == {
        "type": "Ready", "status": "False", "reason": "Reconciling", "message": "0 of 2",
        "lastTransitionTime": "2026-01-01T00:00:00Z", "observedGeneration": 3}
    same = condition("Ready", False, "PodsFailing", "1 of 2", previous=[first], at="2026-01-02T00:00:00Z")
    assert same.last_transition_time == "2026-01-01T00:00:00Z"  # a new reason or message is no transition
    flipped = condition("Ready", True, "AllReady", "2 of 2", previous=[same], at="2026-01-03T00:00:00Z")
    assert flipped.last_transition_time == "2026-01-03T00:00:00Z"
    assert condition("X", None, "Probing", "").status == "Unknown"
    # previous conditions as read from an object count the same; one that is not a condition is ignored
    read = condition("Ready", True, "AllReady", "2 of 2", at="2026-01-04T00:00:00Z", previous=[
        {"type": "Ready", "bogus": 1},
        {"type": "Ready", "status": "True", "lastTransitionTime": "2026-01-03T00:00:00Z"}])
    assert read.last_transition_time == "2026-01-03T00:00:00Z"
    # an EnvClaim: Bound while Bound or Degraded (its time kept from Bound), Degraded when instances were lost
    bound = claim_conditions("Bound", "2 instances bound", generation=1)
    assert [(c.type, c.status, c.reason) for c in bound] == [("Bound", "True", "Bound"),
                                                             ("Degraded", "False", "AllInstances")]
    degraded = claim_conditions("Degraded", "1 of 2 instances lost: p", bound)
    assert [(c.type, c.status, c.reason) for c in degraded] == [("Bound", "True", "Bound"),
                                                                ("Degraded", "True", "InstancesLost")]
    assert degraded[0].last_transition_time == bound[0].last_transition_time
    for phase, reason in (("Pending", "Waiting"), ("Failed", "Failed"), ("Expired", "Expired")):
        assert claim_conditions(phase, "")[0].reason == reason and claim_conditions(phase, "")[0].status == "False"


def test_status_is_written_as_the_kinds_typed_status() -> None:
    """Every status write is one of the kinds' status models: only the fields given go into the
    merge patch (a progress report does not reset the phase), by their API names, a None set on
    purpose is written as null (it removes the field), and a value the kind does not have is an
    error in the operator rather than a field the API server silently prunes."""
    from pydantic import ValidationError

    from awm_operator.conditions import condition
    from awm_operator.crds import CampaignStatus, EnvClaimStatus, EnvFleetStatus, ShardStatus

    assert CampaignStatus.model_validate({"step": 3, "rewardMean": 0.5}).patch() == {"step": 3, "rewardMean": 0.5}
    cond = condition("Ready", True, "AllReady", "2 of 2", at="2026-01-01T00:00:00Z")
    fleet = EnvFleetStatus(ready=2, environments=None, conditions=[cond],
                           shards=[ShardStatus(name="default", state="Down", message="refused")])
    assert fleet.patch() == {
        "ready": 2, "environments": None,
        "shards": [{"name": "default", "state": "Down", "instances": 0, "message": "refused"}],
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady", "message": "2 of 2",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}
    claim = EnvClaimStatus(phase="Bound", instances=[{"pod": "p", "environment": "crm", "mcpUrl": "http://p/mcp",
                                                      "controlUrl": "http://p:8001"}], latency_ms=1.5)
    assert claim.patch()["instances"][0]["mcpUrl"] == "http://p/mcp" and claim.patch()["latencyMs"] == 1.5
    for bad in ({"phase": "Bond"}, {"boundAt": 3, "phase": "Bound", "lost": "p"}, {"instances": [{"pod": "p"}]},
                {"readyy": 1}):
        with pytest.raises(ValidationError):
            EnvClaimStatus.model_validate(bad)


def test_fleets_bind_late_by_default_except_over_a_catalog_url() -> None:
    """Late binding is the default path: a fleet that does not say `binding` binds late with a
    catalog image, and is pinned over catalog.url (which late binding does not support yet)."""
    from awm_operator.api import fleet_summary
    from awm_operator.crds import binding_of
    from awm_operator.state import Fleets

    def spec(**extra) -> EnvFleetSpec:
        return EnvFleetSpec.model_validate({"environments": ["crm"], "database": {"secretName": "db"}, **extra})

    assert spec(catalog={}).late and spec(catalog={"image": "reg/cat:1"}).late
    assert not spec(catalog={"url": "http://catalog.example/"}).late
    assert not spec(catalog={}, binding="pinned").late and spec(catalog={}, binding="late").late
    assert [binding_of(b, u) for b, u in ((None, None), (None, "http://c/"), ("pinned", None), ("late", None))] == [
        "late", "pinned", "pinned", "late"]
    cfg = OperatorConfig(release="rel", envserver_image="reg/awm-envserver:1", catalog_image="reg/awm-catalog:1")
    pod = pod_manifest("f", "ns", "uid-1", spec(catalog={}), "crm", cfg)
    assert [c["name"] for c in pod["spec"]["initContainers"]] == ["bundle", "provisioner"]  # a late pod
    # `GET .../envfleets` reports the binding the fleet has, given or not.
    meta = {"namespace": "ns", "name": "f"}
    rows = [fleet_summary({"metadata": meta, "spec": s}, Fleets()) for s in
            ({"catalog": {}}, {"catalog": {"url": "http://c/"}}, {"catalog": {}, "binding": "pinned"})]
    assert [r["binding"] for r in rows] == ["late", "pinned", "pinned"]


def test_crds_in_chart_match_the_models(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["operator", "crds", "-o", str(tmp_path)])
    assert result.exit_code == 0, result.output
    written = sorted(p.name for p in tmp_path.iterdir())
    assert written == ["campaigns.awm.dev.yaml", "envclaims.awm.dev.yaml", "envfleets.awm.dev.yaml"]
    for name in written:
        chart = ROOT / "charts" / "awm" / "crds" / name
        assert chart.read_text() == (tmp_path / name).read_text(), (
            f"{chart} is out of date: run `awm operator crds -o charts/awm/crds`")
    stream = CliRunner().invoke(app, ["operator", "crds"])
    assert [d["kind"] for d in yaml.safe_load_all(stream.stdout)] == ["CustomResourceDefinition"] * 3


def test_a_status_is_read_back_through_its_model() -> None:
    """What the operator reads of a status it (or another replica, or an older operator) wrote:
    the kind's model, never raising on what is stored - a field it does not know is dropped, a
    value that is not the model's reads as the field's default."""
    from awm_operator.crds import CampaignStatus, EnvClaimStatus, EnvFleetStatus
    from awm_operator.phases import CampaignPhase, ClaimPhase, ConditionType, ShardState

    claim = EnvClaimStatus.read({"phase": "Bound", "someoneElses": 1, "instances": [
        {"pod": "p", "environment": "crm", "mcpUrl": "u", "controlUrl": "c", "newer": True}]})
    assert claim.phase == ClaimPhase.BOUND and claim.instances[0].pod == "p"
    assert EnvClaimStatus.read({"phase": "Vanished", "message": "m"}).phase == ClaimPhase.PENDING
    assert EnvClaimStatus.read({"phase": "Vanished", "message": "m"}).message == "m"  # the rest is kept
    assert EnvClaimStatus.read(None).phase == ClaimPhase.PENDING
    fleet = EnvFleetStatus.read({"replicas": 3, "ready": "x", "conditions": [
        {"type": "Ready", "status": "True", "reason": "AllReady", "extra": 1}],
        "shards": [{"name": "default", "state": "Up", "backends": 3}]})
    assert (fleet.replicas, fleet.ready) == (3, 0) and fleet.conditions[0].type == ConditionType.READY
    assert fleet.shards[0].state == ShardState.UP
    campaign = CampaignStatus.read({"phase": "Succeeded", "conditions": [{"type": "FleetDeleted", "status": "True"}]})
    assert campaign.phase == CampaignPhase.SUCCEEDED and campaign.conditions[0].type == ConditionType.FLEET_DELETED
