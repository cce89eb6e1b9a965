"""The operator's in-memory fleet state (awm_operator/state.py): planning claims onto free pods
(plan, plan_late), the fleet's cache of pods, reservations and claims, what late pods serve, keep
and are made ready for, and the floors that waiting claims put under the spread."""

from __future__ import annotations

import asyncio

import pytest

from awm.claims import ClaimRequest
from awm_operator.pods import PodInfo, spread
from awm_operator.state import ClaimRecord, Fleet, plan, plan_late, unsatisfiable
from tests.operator_fakes import fleet_spec, ledger_fleet, pod


def _envs_fleet(envs: list[str], owned: dict[str, str] | None = None) -> Fleet:
    fleet = Fleet("ns", "f")
    for name, env in (owned or {}).items():
        fleet.update_pod(PodInfo.from_pod(pod(name, env)))
        fleet.owner[name] = "c0"
    return fleet


def _spread_then_plan(fleet: Fleet, envs: list[str], replicas: int, req: ClaimRequest) -> list[list[str]] | None:
    """What the reconciler builds for the waiting claim, then whether the claim binds on it."""
    fleet.pending["c1"] = req
    desired = spread(replicas, envs, fleet.floors(envs, replicas))
    held = {e: sum(1 for n in fleet.owner if fleet.pods[n].env == e) for e in envs}
    free = {e: [f"{e}-{i}" for i in range(desired[e] - held[e])] for e in envs}
    return plan(free, req)


def test_waiting_grpo_and_per_environment_claims_shape_the_spread() -> None:
    envs = ["crm", "bike_shop", "notes"]
    grpo = ClaimRequest(count=16, group_size=4)
    # the chart's example: autoscaled to 16 + buffer 2; an even 6/6/6 spread holds only 3 groups
    assert plan({e: [f"{e}-{i}" for i in range(6)] for e in envs}, grpo) is None
    assert len(_spread_then_plan(_envs_fleet(envs), envs, 18, grpo) or []) == 4
    assert _envs_fleet(envs).floors(envs, 18) == {"crm": 0, "bike_shop": 0, "notes": 0}
    one_env = ClaimRequest(count=8, environment="crm")
    assert len(_spread_then_plan(_envs_fleet(envs), envs, 10, one_env) or []) == 1
    # allocated instances count where they are; groups go to the least loaded environments
    busy = _envs_fleet(envs, {f"c{i}": "crm" for i in range(6)})
    busy.pending["c1"] = ClaimRequest(count=8, group_size=4)
    assert busy.floors(envs, 16) == {"crm": 6, "bike_shop": 4, "notes": 4}
    assert len(_spread_then_plan(busy, envs, 16, ClaimRequest(count=8, group_size=4)) or []) == 2
    # within replicas: a fleet that is not autoscaled never grows past them for a claim, and a
    # claim that cannot fit (all-or-nothing) does not strip the other environments
    capped = _envs_fleet(envs)
    capped.pending["c1"] = one_env
    assert capped.floors(envs, 5) == {"crm": 0, "bike_shop": 0, "notes": 0}
    capped.pending["c1"] = ClaimRequest(count=4, environment="crm")
    assert capped.floors(envs, 5) == {"crm": 4, "bike_shop": 0, "notes": 0}
    # groups go where unallocated pods already are: no pod is deleted in one environment to be
    # created in another
    warm = _envs_fleet(envs)
    for i in range(4):
        warm.update_pod(PodInfo.from_pod(pod(f"n{i}", "notes")))
    warm.update_pod(PodInfo.from_pod(pod("b0", "bike_shop")))
    warm.pending["c1"] = ClaimRequest(count=4, group_size=4)
    assert warm.floors(envs, 5) == {"crm": 0, "bike_shop": 0, "notes": 4}
    assert spread(5, envs, warm.floors(envs, 5), {"bike_shop": 1, "notes": 4}) == {"crm": 0, "bike_shop": 1, "notes": 4}
    # an older claim for one environment uses its free pods first: the group goes elsewhere
    full = _envs_fleet(envs)
    for env, n in (("crm", 5), ("bike_shop", 4), ("notes", 4)):
        for i in range(n):
            full.update_pod(PodInfo.from_pod(pod(f"{env}{i}", env)))
    full.pending["c1"] = ClaimRequest(count=4, environment="crm")
    full.pending["c2"] = ClaimRequest(count=4, group_size=4)
    floors = full.floors(envs, 13)
    assert floors["crm"] == 4 and sorted(floors.values()) == [0, 4, 4]
    assert spread(13, envs, floors, {"crm": 5, "bike_shop": 4, "notes": 4}) == {"crm": 5, "bike_shop": 4, "notes": 4}


async def test_claims_nudge_the_reconciler_pods_poke_it() -> None:
    """A claim bound or released changes only the status's counts: it wakes the reconciler
    without urgency (a pass within the status interval); a pod event is urgent."""
    fleet = ledger_fleet(2)
    fleet.wake.clear()
    fleet.urgent = False
    fleet.assign("c1", ClaimRecord([["p0"]]))
    fleet.unassign("c1")
    assert fleet.wake.is_set() and not fleet.urgent
    fleet.update_pod(PodInfo.from_pod(pod("p2")))
    assert fleet.urgent


def test_plan_late_prefers_pods_that_serve_the_environment() -> None:
    """A late fleet files its free pods under the environment each serves now (its last switch),
    so that a claim finds the pods that serve it at once, whatever the fleet's size."""
    fleet = Fleet("ns", "f")
    for name in ("a1", "a2", "b1", "b2", "b3"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.assign("c1", ClaimRecord([["a2", "b2"]]))
    fleet.switched("a2", "crm")  # switched while held: filed under crm once free
    fleet.unassign("c1")
    fleet.switched("b2", "crm")  # free already (a claim released while its pods switched)
    assert dict(fleet.available) == {"a": {"a1": None}, "b": {"b1": None, "b3": None},
                                     "crm": {"a2": None, "b2": None}}
    available = fleet.available
    (group,) = plan_late(available, ClaimRequest(count=2, environment="crm"))
    assert sorted(group) == ["a2", "b2"]  # a repeat claim: no switch
    groups = plan_late(available, ClaimRequest(count=4, environment="crm", group_size=2))
    assert groups is not None and [len(g) for g in groups] == [2, 2] and {"a2", "b2"} == set(groups[0])
    assert plan_late(available, ClaimRequest(count=6, environment="crm")) is None  # all or nothing
    assert len(plan_late(available, ClaimRequest(count=5, environment="zzz"))[0]) == 5  # any pod serves it
    # without an environment: as plan() (groups of one environment each, the one served now)
    assert plan_late(available, ClaimRequest(count=2, group_size=2)) == plan(available, ClaimRequest(count=2, group_size=2))
    fleet.reserve(["a2"])
    assert "a2" not in fleet.available["crm"]
    fleet.unreserve(["a2"])
    fleet.remove_pod("a2")  # gone: from under what it served, and its switch forgotten
    assert "a2" not in fleet.available["crm"] and "a2" not in fleet.bound_env


def test_a_claim_lands_on_free_pods_that_keep_its_environment() -> None:
    """A late pod keeps the environments it served (its answers' cached_envs): a claim of one of
    them lands on such a pod, after those that serve it and before any other (a reset there, not
    a new database); pods made ready for another environment stay last. The index follows the
    pods as they are held, released, refiled and removed, and counts toward a preparation."""
    fleet = Fleet("ns", "f")
    for name in ("a1", "a2", "b1", "b2", "c1"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.switched("a1", "a", ["x", "a"])
    fleet.switched("b1", "b", ["y", "x", "b"])
    fleet.switched("b2", "b", ["y", "b"])
    assert {e: set(n) for e, n in fleet.holding.items()} == {"x": {"a1", "b1"}, "y": {"b1", "b2"}}

    def claim(env: str, count: int, group_size: int | None = None) -> list[list[str]] | None:
        return plan_late(fleet.available, ClaimRequest(count=count, environment=env, group_size=group_size),
                         fleet.prepared, fleet.holding)

    assert sorted(claim("x", 2)[0]) == ["a1", "b1"]
    (group,) = claim("x", 3)
    assert sorted(group[:2]) == ["a1", "b1"] and group[2] in {"a2", "b2", "c1"} and len(set(group)) == 3
    (group,) = claim("b", 3)  # serving it first, then one that keeps... none: any other
    assert set(group[:2]) == {"b1", "b2"} and len(set(group)) == 3
    assert len(set(claim("x", 5)[0])) == 5 and claim("x", 6) is None  # never a pod twice
    fleet.mark_prepared("b1", "z")  # made ready for z: kept for it, last for x
    (group,) = claim("x", 4)
    assert group[0] == "a1" and "b1" not in group
    assert claim("x", 5)[0][-1] == "b1"
    fleet.reserve(["a1"])  # taken: not free, not holding
    assert set(fleet.holding["x"]) == {"b1"} and "a1" not in fleet.available["a"]
    fleet.unreserve(["a1"])
    assert set(fleet.holding["x"]) == {"a1", "b1"}
    fleet.assign("held", ClaimRecord([["a1", "b2"]]))
    assert set(fleet.holding["x"]) == {"b1"} and set(fleet.holding["y"]) == {"b1"}
    fleet.reported("a1", "x", ["a", "x"])  # released: its client had switched it to x
    fleet.unassign("held")
    assert "a1" in fleet.available["x"] and set(fleet.holding["a"]) == {"a1"} and "a1" not in fleet.holding["x"]
    # a free pod that keeps x counts toward x's preparation, and is not taken for another one
    assert fleet.to_prepare({"x": 1}) == {}
    chosen = fleet.to_prepare({"y": 2})  # b2 keeps it (b1 too, but b1 is made ready for z)
    assert len(chosen) == 1 and "b2" not in chosen
    assert "b2" not in fleet.to_prepare({"y": 3, "w": 1})
    fleet.holds("b2", [])
    assert "y" not in fleet.holding or "b2" not in fleet.holding["y"]
    fleet.remove_pod("b1")
    assert "b1" not in fleet.cached and all("b1" not in names for names in fleet.holding.values())


def test_grpo_steps_over_a_catalog_land_more_groups_on_pods_that_keep_their_environment() -> None:
    """bench/late_cache.py in small: GRPO steps of random environments planned by the operator's
    own state, each pod keeping its last 4; planned with the pods' caches, more of the bound pods
    keep their group's environment (a reset) than when any free pod is taken (a new database)."""
    from bench.late_cache import simulate

    shape = dict(pods=128, envs=40, groups=8, group_size=16, cache=4, steps=30, warmup=10, seed=1)
    before = simulate(**shape, cache_aware=False)["share"]
    now = simulate(**shape, cache_aware=True)["share"]
    assert now["cached"] > before["cached"] + 0.1 and now["new"] < before["new"], (before, now)


def test_pods_made_ready_ahead_are_filed_under_that_environment() -> None:
    """The allocation API's prepare: pods that serve or are made ready for an environment count
    toward it; the others come from free pods of environments not wanted, then from held pods;
    a prepared pod is filed under its environment until it is switched to anything."""
    fleet = Fleet("ns", "f")
    for name in ("a1", "a2", "b1", "b2", "c1", "c2"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.assign("held", ClaimRecord([["c1", "c2"]]))
    assert fleet.to_prepare({"a": 2}) == {}  # two free pods serve it already
    # a: one more; b: served already; x: two. No free pod of an environment not wanted is
    # left, so the held pods, as far as they go (a best effort: claims switch otherwise).
    assert fleet.to_prepare({"a": 3, "b": 1, "x": 2}) == {"c1": "a", "c2": "x"}
    fleet = Fleet("ns", "f")
    for name in ("a1", "b1", "b2", "c1"):
        fleet.update_pod(PodInfo(name, name[0], True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
    fleet.assign("held", ClaimRecord([["c1"]]))
    chosen = fleet.to_prepare({"x": 3, "a": 1})
    assert chosen == {"b1": "x", "b2": "x", "c1": "x"}  # b's free pods (b not wanted), then the held one
    for name, env in chosen.items():
        fleet.mark_prepared(name, env)
    assert dict(fleet.available) == {"a": {"a1": None}, "x": {"b1": None, "b2": None}}
    # filed under x (a GRPO group claim naming no environment switches it to x), serving b still
    assert (fleet.key_of("b1"), fleet.env_of("b1")) == ("x", "b")
    assert fleet.to_prepare({"x": 3}) == {}  # two free and one held pod are on it
    assert fleet.to_prepare({"y": 2}) == {"a1": "y"}  # told next: the pods made ready for x keep it
    (group,) = plan_late(fleet.available, ClaimRequest(count=2, environment="x"), fleet.prepared)
    assert sorted(group) == ["b1", "b2"]  # the claim lands where it is ready
    # a claim of another environment takes pods made ready for nothing first
    assert plan_late(fleet.available, ClaimRequest(count=1, environment="z"), fleet.prepared) == [["a1"]]
    (group,) = plan_late(fleet.available, ClaimRequest(count=3, environment="z"), fleet.prepared)
    assert group[0] == "a1" and set(group[1:]) == {"b1", "b2"}
    fleet.unassign("held")
    assert set(fleet.available["x"]) == {"b1", "b2", "c1"}  # released: filed under what it made ready
    fleet.switched("b1", "a")  # claimed for another environment: the preparation is forgotten
    assert "b1" not in fleet.prepared and set(fleet.available["a"]) == {"a1", "b1"}
    fleet.mark_prepared("b2", None)  # the pod failed to make it ready
    assert set(fleet.available["x"]) == {"c1"} and set(fleet.available["b"]) == {"b2"}
    fleet.remove_pod("c1")
    assert "c1" not in fleet.prepared and "x" not in fleet.available


# --------------------------------------------------------------------------- allocation


def test_plan_single_instances_balances_environments() -> None:
    available = {"a": ["a1", "a2", "a3", "a4"], "b": ["b1", "b2"], "c": []}
    (group,) = plan(available, ClaimRequest(count=4))
    assert len(group) == 4 and len(set(group)) == 4
    assert sum(n.startswith("a") for n in group) == 3  # the fullest environment gives most
    assert plan(available, ClaimRequest(count=7)) is None     # all or nothing
    assert plan(available, ClaimRequest(count=2, environment="b")) == [["b1", "b2"]]
    assert plan(available, ClaimRequest(count=3, environment="b")) is None


def test_plan_grpo_groups_come_from_one_environment() -> None:
    available = {"a": [f"a{i}" for i in range(5)], "b": [f"b{i}" for i in range(4)], "c": ["c0"]}
    groups = plan(available, ClaimRequest(count=8, group_size=4))
    assert groups is not None and len(groups) == 2
    for g in groups:
        assert len(g) == 4 and len({n[0] for n in g}) == 1
    assert {g[0][0] for g in groups} == {"a", "b"}
    assert plan(available, ClaimRequest(count=12, group_size=4)) is None  # c cannot hold a group
    assert plan(available, ClaimRequest(count=4, group_size=2, environment="a")) == [["a0", "a1"], ["a2", "a3"]]


def test_claim_request_problems() -> None:
    spec = fleet_spec(autoscale=True, maxReplicas=10)
    with pytest.raises(ValueError, match="multiple of groupSize"):  # the request alone says so
        ClaimRequest(count=6, group_size=4)
    assert unsatisfiable(ClaimRequest(count=2, environment="nope"), spec) is not None
    assert unsatisfiable(ClaimRequest(count=11), spec) is not None
    assert unsatisfiable(ClaimRequest(count=8, group_size=4, environment="crm"), spec) is None


async def test_fleet_cache_reservations_and_stale_events() -> None:
    fleet = Fleet("ns", "f")
    fleet.update_pod(PodInfo.from_pod(pod("a", rv=5)))
    fleet.update_pod(PodInfo.from_pod(pod("b", env="bike_shop", rv=6)))
    assert fleet.available_lists() == {"crm": ["a"], "bike_shop": ["b"]}
    fleet.reserve(["a"])
    assert fleet.available_lists() == {"bike_shop": ["b"]}
    fleet.assign("c1", ClaimRecord([["a"]]))
    fleet.unreserve(["a"])
    assert fleet.available_lists() == {"bike_shop": ["b"]}  # held by c1, whatever pod events say
    fleet.update_pod(PodInfo.from_pod(pod("a", rv=7)))
    fleet.update_pod(PodInfo.from_pod(pod("a", rv=6, ready=False)))  # an older event arriving late is ignored
    assert fleet.pods["a"].ready and [p.name for p in fleet.claim_pods("c1")] == ["a"]
    c = fleet.counts()
    assert (c.replicas, c.ready, c.allocated, c.starting) == (2, 1, 1, 0)
    waiter = asyncio.ensure_future(fleet.wait_capacity(5))
    await asyncio.sleep(0)
    fleet.update_pod(PodInfo.from_pod(pod("c", rv=8)))
    await asyncio.wait_for(waiter, 1)  # new capacity wakes waiting claims
    fleet.doom(fleet.pods["c"])
    fleet.update_pod(PodInfo.from_pod(pod("c", rv=9)))  # still being deleted, whatever the event says
    assert fleet.counts().replicas == 2 and "c" not in fleet.available_lists().get("crm", [])
    fleet.remove_pod("c")
    assert "c" not in fleet.doomed
    # Released: the pod is allocatable again; a claim whose pod vanished reports it lost.
    fleet.unassign("c1")
    assert fleet.available_lists()["crm"] == ["a"]
    fleet.assign("c2", ClaimRecord([["a"], ["b"]]))
    assert fleet.counts().allocated == 2 and fleet.available_lists() == {}
    fleet.remove_pod("b")
    assert fleet.lost_pods("c2") == ["b"] and [p.name for p in fleet.claim_pods("c2")] == ["a"]
