"""The allocation API's models (awm/claims.py) on both ends: the operator's API reads its requests
into them and answers with them, the client reads the answers back into them. A claim's whole
life goes through a real API (aiohttp, the real allocator and ledger code) and the real client;
the raw answers are checked against the models' wire names, so a field renamed on one side only
fails here."""

from __future__ import annotations

import aiohttp
import pytest
from aiohttp import web

from awm.claims import (OUTCOME_STATUS, Claim, ClaimedInstance, ClaimOutcome, ClaimRefusal, ClaimRequest, FleetInstance,
                        FleetInstances, HolderRelease, Release, Renewal)
from awm.episode.allocation import AllocationClient, AllocationError
from awm_operator.allocator import Allocator
from awm_operator.api import build_api
from awm_operator.config import OperatorConfig
from awm_operator.ledger import Ledger
from awm_operator.metrics import Metrics
from awm_operator.pods import PodInfo
from awm_operator.reconcile import Context
from awm_operator.state import Fleets
from tests.operator_fakes import ConfigMapServer, fleet_spec, serve_app


def wire_names(model: type) -> set[str]:
    return {f.alias or n for n, f in model.model_fields.items()}


@pytest.fixture
async def api():  # type: ignore[no-untyped-def]
    """An operator API over a fleet of 4 crm instances whose control APIs answer resets: its URL,
    the resets asked of the instances, and the fleet (to change under the API)."""
    resets: list[str] = []

    async def reset(request: web.Request) -> web.Response:
        resets.append(request.path)
        return web.json_response({"env": "crm", "pristine": True})

    pods_app = web.Application()
    pods_app.router.add_post("/{pod}/reset", reset)
    pods_runner, pods_url = await serve_app(pods_app)
    fleets = Fleets()
    fleet = fleets.ensure("ns", "f")
    fleet.spec = fleet_spec()
    for i in range(4):
        fleet.update_pod(PodInfo(f"f-crm-{i}", "crm", True, "Running", "10.0.0.1", False, 1,
                                 f"http://10.0.0.{i}:8000/mcp", f"{pods_url}/p{i}"))
    metrics = Metrics()
    fleet.ledger = Ledger(ConfigMapServer(), fleet, metrics)  # type: ignore[arg-type]
    await fleet.ledger.load()
    fleet.active = True
    allocator = Allocator(kube=None, metrics=metrics)  # type: ignore[arg-type]
    ctx = Context(kube=None, allocator=allocator, metrics=metrics, config=OperatorConfig())  # type: ignore[arg-type]
    runner, url = await serve_app(build_api(ctx, fleets))
    try:
        yield url, resets, fleet
    finally:
        await runner.cleanup()
        await allocator.close()
        await pods_runner.cleanup()


async def test_a_claims_life_through_the_client(api) -> None:  # type: ignore[no-untyped-def]
    url, resets, fleet = api
    async with AllocationClient(url, "ns", "f") as alloc:
        got = await alloc.claim(count=4, group_size=2, environment="crm", holder="campaign/c", ttl_seconds=60)
        assert isinstance(got, Claim) and got.outcome == ClaimOutcome.ALLOCATED and got.holder == "campaign/c"
        assert sorted(i.group for i in got.instances) == [0, 0, 1, 1]
        assert all(isinstance(i, ClaimedInstance) and i.mcp_url and i.control_url and i.switched for i in got.instances)
        shown = await alloc.get(got.id)
        assert [i.pod for i in shown.instances] == [i.pod for i in got.instances] and shown.lost == 0
        assert all(i.switched is None and i.lost is False for i in shown.instances)  # GET does not know the switch
        # A pod of the claim deleted (evicted, its node gone): its instance shows as lost, the
        # environment it served unknown with its pod (the operator's API once answered 500 here).
        lost = got.instances[0].pod
        fleet.remove_pod(lost)
        shown = await alloc.get(got.id)
        assert shown.lost == 1 and [(i.pod, i.environment) for i in shown.instances if i.lost] == [(lost, None)]
        renewed = await alloc.renew(got.id, ttl_seconds=600)
        assert isinstance(renewed, Renewal) and renewed.expires_at and got.expires_at
        assert renewed.expires_at > got.expires_at
        with pytest.raises(AllocationError) as taken:
            await alloc.claim(count=1, wait_seconds=0)
        assert taken.value.status == 409 and taken.value.refusal is not None
        assert taken.value.refusal.outcome == ClaimOutcome.UNALLOCATED
        released = await alloc.release(got.id)
        assert isinstance(released, Release) and (released.returned, released.replaced) == (3, 0)
        assert len(resets) == 3  # the lost one is neither returned nor replaced
        gone = await alloc.release_holder("campaign/c")
        assert isinstance(gone, HolderRelease) and gone.released == []


async def test_the_wire_is_the_models(api) -> None:  # type: ignore[no-untyped-def]
    """The raw answers carry exactly the models' camelCase names, and the API reads requests by
    the same names: a field renamed on one side only fails here."""
    url, _, _ = api
    base = f"{url}/v1/namespaces/ns/envfleets/f/claims"
    async with aiohttp.ClientSession() as http:
        async with http.post(base, json={"count": 2, "groupSize": 2, "waitSeconds": 0, "ttlSeconds": 30,
                                         "holder": "h", "switch": "operator"}) as r:
            assert r.status == 201
            body = await r.json()
        assert set(body) == wire_names(Claim)
        assert all(set(i) == wire_names(ClaimedInstance) for i in body["instances"])
        async with http.get(f"{base}/{body['id']}") as r:
            assert set(await r.json()) == wire_names(Claim)
        async with http.post(f"{base}/{body['id']}/renew", json={"ttlSeconds": 30}) as r:
            assert set(await r.json()) == wire_names(Renewal)
        async with http.delete(f"{base}/{body['id']}") as r:
            assert set(await r.json()) == wire_names(Release)
        async with http.delete(base, params={"holder": "h"}) as r:
            assert set(await r.json()) == wire_names(HolderRelease)
        async with http.get(f"{url}/v1/namespaces/ns/envfleets/f/instances") as r:
            listing = await r.json()
        assert set(listing) == wire_names(FleetInstances) and len(listing["instances"]) == 4
        assert all(set(i) == wire_names(FleetInstance) for i in listing["instances"])
        assert set(ClaimRequest(count=1).wire()) == wire_names(ClaimRequest)


@pytest.mark.parametrize(("body", "status", "outcome", "says"), [
    ({"count": 3, "groupSize": 2}, 400, ClaimOutcome.REFUSED, "multiple of groupSize"),
    ({"count": 1, "groupsize": 2}, 400, ClaimOutcome.REFUSED, "groupsize: Extra inputs are not permitted"),
    ({"count": 0}, 400, ClaimOutcome.REFUSED, "count: Input should be greater than or equal to 1"),
    ({"count": "many"}, 400, ClaimOutcome.REFUSED, "count: Input should be a valid integer"),
    ({"switch": "nobody"}, 400, ClaimOutcome.REFUSED, "switch: Input should be 'operator' or 'client'"),
    ({"id": "mine"}, 400, ClaimOutcome.REFUSED, "id: String should match pattern"),
    ({"environment": "hotel"}, 400, ClaimOutcome.REFUSED, "environment 'hotel' is not in the fleet"),
    ([1, 2], 400, ClaimOutcome.REFUSED, "Input should be a valid dictionary"),
    ({"count": 5, "waitSeconds": 0}, 409, ClaimOutcome.UNALLOCATED, "fewer than 5 ready instances"),
])
async def test_a_refusal_says_why_and_its_outcome(api, body, status, outcome, says) -> None:  # type: ignore[no-untyped-def]
    url, _, _ = api
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{url}/v1/namespaces/ns/envfleets/f/claims", json=body) as r:
            refusal = ClaimRefusal.model_validate(await r.json())
            assert (r.status, refusal.outcome) == (status, outcome) and says in refusal.error, refusal
        async with http.post(f"{url}/v1/namespaces/ns/envfleets/f/claims", data=b"{not json") as r:
            assert r.status == 400 and "bad request" in (await r.json())["error"]


def test_every_outcome_has_its_status() -> None:
    assert set(OUTCOME_STATUS) == set(ClaimOutcome)
    assert OUTCOME_STATUS[ClaimOutcome.ALLOCATED] == 201


async def test_the_client_refuses_what_the_api_would_before_sending() -> None:
    """Nothing listens at the URL: a request the API would refuse never gets that far."""
    async with AllocationClient("http://127.0.0.1:9", "ns", "f", standby_retries=0) as alloc:
        with pytest.raises(AllocationError) as bad:
            await alloc.claim(count=3, group_size=2)
        assert bad.value.status == 400 and bad.value.refusal is not None
        assert bad.value.refusal.outcome == ClaimOutcome.REFUSED and "multiple of groupSize" in str(bad.value)
