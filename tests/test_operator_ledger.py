"""The claims ledger (awm_operator/ledger.py) and its shards (shards.py), against the in-memory
ConfigMap server of tests/operator_fakes.py; test_operator_e2e.py runs the same ledger against the
real API server."""

from __future__ import annotations

import asyncio
import json

import pytest

from awm_operator.ledger import Ledger, LostRace, ledger_name
from awm_operator.shards import CONFIGMAP_LIMIT, SHARD_BYTES, entry_size, place, shard_index, shard_name
from awm_operator.metrics import Metrics
from awm_operator.pods import PodInfo
from awm_operator.state import ClaimRecord, Fleet
from tests.operator_fakes import ConfigMapServer, ledger_fleet, pod


def test_claim_record_round_trip() -> None:
    record = ClaimRecord([["p1", "p2"], ["p3", "p4"]], created=100.0, expires=160.5)
    again = ClaimRecord.parse(record.dump())
    assert again == record and again.pods == ["p1", "p2", "p3", "p4"] and again.group_of("p3") == 1
    assert ClaimRecord.parse(ClaimRecord([["x"]]).dump()).expires is None
    held = ClaimRecord([["x"]], created=1.0, holder="campaign/grpo-1")
    assert ClaimRecord.parse(held.dump()) == held and "holder" not in ClaimRecord([["x"]]).dump()
    assert ledger_name("train") == "train-claims" and len(ledger_name("f" * 253)) <= 253


async def test_ledger_group_commit_and_conflicts() -> None:
    server = ConfigMapServer()
    fleet = Fleet("ns", "f", uid="u1")
    for name in ("a", "b", "c", "d"):
        fleet.update_pod(PodInfo.from_pod(pod(name)))
    ledger = Ledger(server, fleet, Metrics())  # type: ignore[arg-type]
    await ledger.load()
    assert server.obj["metadata"]["ownerReferences"][0]["uid"] == "u1" and fleet.claims == {}
    # Claims arriving while a write is in flight go together in the next one.
    server.gate = asyncio.Event()
    first = asyncio.ensure_future(ledger.commit({"c1": ClaimRecord([["a"]])}))
    await asyncio.sleep(0.01)
    rest = [asyncio.ensure_future(ledger.commit({f"c{i}": ClaimRecord([[n]])})) for i, n in ((2, "b"), (3, "c"))]
    await asyncio.sleep(0.01)
    server.gate.set()
    await asyncio.gather(first, *rest)
    assert server.writes == 2 and set(fleet.claims) == {"c1", "c2", "c3"} and fleet.owner["c"] == "c3"
    assert fleet.available_lists() == {"crm": ["d"]}
    # Another replica writes behind our back: our next write gets 409, rereads, and a claim of a
    # pod the other one took loses the race while the rest still commits.
    server.gate = None
    server.obj["data"]["other"] = ClaimRecord([["d"]]).dump()
    server.bump("f-claims")
    with pytest.raises(LostRace):
        await ledger.commit({"c4": ClaimRecord([["d"]])})
    await ledger.commit({"c1": None})
    assert "other" in fleet.claims and "c1" not in fleet.claims and fleet.available_lists() == {"crm": ["a"]}
    # A restarted operator (or a standby taking over) reads the same allocation back.
    fresh = Fleet("ns", "f", uid="u1")
    for name in ("a", "b", "c", "d"):
        fresh.update_pod(PodInfo.from_pod(pod(name)))
    await Ledger(server, fresh, Metrics()).load()  # type: ignore[arg-type]
    assert fresh.owner == {"b": "c2", "c": "c3", "d": "other"} and fresh.available_lists() == {"crm": ["a"]}


def test_shard_names_and_placement() -> None:
    assert [shard_name("train", i) for i in range(3)] == ["train-claims", "train-claims-1", "train-claims-2"]
    for fleet in ("train", "a-claims", "f" * 253, "x-claims-1"):
        for i in (0, 1, 12):
            assert shard_index(fleet, shard_name(fleet, i)) == i and len(shard_name(fleet, i)) <= 253
    assert shard_index("train", "train-claims-01") is None and shard_index("train", "other-claims") is None
    assert shard_index("a", "a-claims-claims") is None  # fleet "a-claims"'s first shard, not "a"'s
    assert place([], 10, 100) == 0                       # the first shard
    assert place([95, 50], 10, 100) == 1                 # first fit
    assert place([95, 95], 10, 100) == 2                 # a new shard
    assert place([95, 0], 500, 100) == 1                 # an empty shard takes any one claim


def test_4096_one_instance_claims_need_shards() -> None:
    """The worst case the API allows: 4,096 instances (maxReplicas), each in its own claim, with
    the longest pod names, identities and holders. One ConfigMap cannot hold that; the shards,
    filled as the ledger fills them, each stay far below the limit."""
    pods = [f"{'f' * 30}-{'e' * 25}-{i:05x}" for i in range(4096)]
    owner = f"system:serviceaccount:{'n' * 63}:{'s' * 253}"
    used: list[int] = []
    total = 0
    for i, name in enumerate(pods):
        claim_id = f"api_{i:016x}"
        size = entry_size(claim_id, ClaimRecord([[name]], holder="h" * 253, owner=owner).dump())
        total += size
        index = place(used, size, SHARD_BYTES)
        used += [0] * (index + 1 - len(used))
        used[index] += size
    assert total > 2.5 * CONFIGMAP_LIMIT
    assert len(used) <= -(-total // SHARD_BYTES) + 1 and max(used) <= SHARD_BYTES < CONFIGMAP_LIMIT


async def test_ledger_spreads_over_shards() -> None:
    server = ConfigMapServer()
    fleet = ledger_fleet(12)
    record = ClaimRecord([["p0"]], created=1.0)
    size = entry_size("c00", record.dump())
    ledger = Ledger(server, fleet, Metrics(), shard_bytes=3 * size)  # type: ignore[arg-type]
    await ledger.load()
    # Claims fill the first shard, then the next ones; a claim is whole in one shard.
    await asyncio.gather(*(ledger.commit({f"c{i:02d}": ClaimRecord([[f"p{i}"]], created=1.0)}) for i in range(7)))
    assert sorted(server.objs) == ["f-claims", "f-claims-1", "f-claims-2"]
    assert [sorted(server.data(n)) for n in sorted(server.objs)] == [
        ["c00", "c01", "c02"], ["c03", "c04", "c05"], ["c06"]]
    assert all(server.objs[n]["metadata"]["ownerReferences"][0]["uid"] == "u1" for n in server.objs)
    assert set(fleet.claims) == {f"c{i:02d}" for i in range(7)}
    # A claim bigger than a shard's limit goes to an empty one, whole.
    await ledger.commit({"big": ClaimRecord([["p7", "p8"], ["p9", "p10"]], created=1.0, holder="h" * 200)})
    assert list(server.data("f-claims-3")) == ["big"]
    # A release frees room in its shard, and the next claim takes it (first fit).
    await ledger.commit({"c01": None})
    await ledger.commit({"c11": ClaimRecord([["p1"]], created=1.0)})
    assert sorted(server.data("f-claims")) == ["c00", "c02", "c11"]
    # A renewal stays where its claim is.
    await ledger.commit({"c04": ClaimRecord([["p4"]], created=1.0, expires=99.0)})
    assert ClaimRecord.parse(server.data("f-claims-1")["c04"]).expires == 99.0
    # A restarted operator (or a standby taking over) reads every shard back.
    fresh = ledger_fleet(12)
    await Ledger(server, fresh, Metrics(), shard_bytes=3 * size).load()  # type: ignore[arg-type]
    assert fresh.owner == fleet.owner and fresh.available_lists() == fleet.available_lists()
    # A shard deleted by hand is written back from what this replica knew, at its next write.
    del server.objs["f-claims-1"]
    await ledger.commit({"c03": None})
    assert sorted(server.data("f-claims-1")) == ["c04", "c05"] and "c03" not in fleet.claims
    assert fleet.owner.get("p4") == "c04"
    # Another replica wrote a shard meanwhile: that shard's write is retried on the new version
    # and the other shards' changes in the same batch are not lost.
    server.data("f-claims-2")["other"] = ClaimRecord([["p3"]], created=1.0).dump()
    server.bump("f-claims-2")
    await asyncio.gather(ledger.commit({"c06": None}), ledger.commit({"c00": None}))
    assert sorted(server.data("f-claims-2")) == ["other"] and sorted(server.data("f-claims")) == ["c02", "c11"]
    assert fleet.owner.get("p3") == "other" and "c06" not in fleet.claims and "c00" not in fleet.claims


async def test_a_claim_left_in_two_shards_is_read_once_and_released_from_both() -> None:
    """A write whose answer was lost (the operator died after the API server applied it) can leave
    a claim in a second shard when it is retried elsewhere: read back once, removed from both."""
    server = ConfigMapServer()
    fleet = ledger_fleet(4)
    ledger = Ledger(server, fleet, Metrics())  # type: ignore[arg-type]
    await ledger.load()
    await ledger.commit({"c1": ClaimRecord([["p1"]], created=1.0)})
    copy = dict(server.objs["f-claims"], metadata={**server.objs["f-claims"]["metadata"], "name": "f-claims-1"})
    server.objs["f-claims-1"] = json.loads(json.dumps(copy))
    fresh = ledger_fleet(4)
    again = Ledger(server, fresh, Metrics())  # type: ignore[arg-type]
    await again.load()
    assert fresh.owner == {"p1": "c1"} and len(again.shards) == 2
    await again.commit({"c1": None})
    assert server.data("f-claims") == {} and server.data("f-claims-1") == {} and fresh.owner == {}
