"""Late binding: what a claim of another environment costs an instance, against today's ways.

    python -m bench.switch [--quick] [--json] [--envs 32] [--instances 4] [--catalog-count 1000]

One run, on a private embedded PostgreSQL (a temporary directory), over environments of the
generated catalog (awm/synth/varied.py; distinct schemas, tools and tasks):

* ``switch_ready``: ``POST /bind`` of an environment the instance does not hold, whose database the
  provisioner made ahead (what a step's environments get once prefilled), then a new MCP session
  and the first tool call: "claim of an environment not cached on that instance -> first tool call";
* ``switch_clone``: the same with no database made ahead (the provisioner clones on the claim path);
* ``lease_switch``: a switch through the client library a trainer's pool uses: ``Lease.bind`` of
  one connected lease on instance 0 (its control client and connections kept, a new MCP session
  and its ``tools/list``), then its first tool call; only switches to a database new to the
  instance count (none when ``--cache-envs`` holds every environment of the phase);
* ``repeat_cached``: ``POST /reset {"env": E}`` of an environment the instance still holds (a switch
  back to a cached environment), then its first tool call on the open MCP session;
* ``group_switch``: ``PoolSource.claim_group(E, instances)``: every instance switched at once;
* baselines in the same run: ``pinned_reset`` (a per-environment fleet's instance of E exists: a
  reset) and ``pinned_cold_start`` (it does not: a new pinned instance of E - a database cloned
  and an env-server process started, until it is ready), the cost a per-environment fleet pays
  for an environment it has no instance of;
* memory: PSS of one late-binding env server and all its descendants with ``cache_envs``
  environments held, against a pinned one.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from awm import catalog
from awm.bundle import EnvBundle
from awm.client import ControlClient, McpSession
from awm.episode.sources import Lease, PoolSource
from awm.fleet import Database, LocalFleet
from awm.postgres import provision
from awm.postgres.server import EmbeddedPostgres
from awm.synth import varied
from bench.runtime import children, machine, pss_mb, read_tool


def summary(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    ordered = sorted(values)
    return {"n": len(values), "p50_ms": round(statistics.median(ordered), 2),
            "p99_ms": round(ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))], 2),
            "max_ms": round(ordered[-1], 2), "mean_ms": round(statistics.fmean(ordered), 2)}


async def first_call(mcp_url: str, bundle: EnvBundle) -> float:
    """A new MCP session and one read-only tool call: the moment the agent can act."""
    tool, args = read_tool(bundle)
    t0 = time.perf_counter()
    async with McpSession(mcp_url) as mcp:
        await mcp.call_tool(tool, args)
    return (time.perf_counter() - t0) * 1000


async def switches(fleet: LocalFleet, envs: list[EnvBundle], prefill: bool, log) -> dict[str, Any]:
    """Each instance switches to each of ``envs`` in turn (never one it holds)."""
    assert fleet.provisioner is not None
    fleet.provisioner.keep = 1 if prefill else 0
    bind_ms, to_first_call_ms, inside_ms = [], [], []
    for handle in fleet.instances:
        control = ControlClient(handle.control_url)
        try:
            for bundle in envs:
                if prefill:  # the step's environments are known when it starts: made ahead
                    fleet.provisioner.prefill(bundle.name, 1)
                    for _ in range(400):
                        if fleet.provisioner.ready_count(bundle.name):
                            break
                        await asyncio.sleep(0.025)
                t0 = time.perf_counter()
                result = await control.bind(bundle.name)
                bound = (time.perf_counter() - t0) * 1000
                assert result["switched"] and not result["cached"] and result["pristine"], result
                call = await first_call(handle.mcp_url, bundle)
                bind_ms.append(bound)
                inside_ms.append(result["bind_ms"])
                to_first_call_ms.append(bound + call)
        finally:
            await control.close()
    log(f"  switch ({'ready database' if prefill else 'clone on the claim path'}): "
        f"bind p50 {statistics.median(bind_ms):.1f} ms, to first call p50 {statistics.median(to_first_call_ms):.1f} ms")
    return {"bind_http": summary(bind_ms), "bind_inside_server": summary(inside_ms),
            "to_first_tool_call": summary(to_first_call_ms)}


async def lease_switches(fleet: LocalFleet, envs: list[EnvBundle], log) -> dict[str, Any]:
    """What a trainer's pool sees: one connected lease (``awm.episode.sources.Lease``) switched to
    each of ``envs`` (databases made ahead) by ``Lease.bind``, then the first tool call on its
    handle: the client's side of a switch (its control client, the new MCP session, the tools)."""
    assert fleet.provisioner is not None
    keep, fleet.provisioner.keep = fleet.provisioner.keep, 1
    handle = fleet.instances[0]
    control = ControlClient(handle.control_url)
    try:
        info = await control.info()
    finally:
        await control.close()
    lease = Lease(info["env"], handle.name, handle.mcp_url, handle.control_url, late=True)
    await lease.connect()
    to_first_call_ms = []
    try:
        for bundle in envs * 2:  # a switch each time: the instance keeps at most the last few
            fleet.provisioner.prefill(bundle.name, 1)
            for _ in range(400):
                if fleet.provisioner.ready_count(bundle.name):
                    break
                await asyncio.sleep(0.025)
            tool, args = read_tool(bundle)
            t0 = time.perf_counter()
            result = await lease.bind(bundle.name)
            await lease.handle.mcp.call_tool(tool, args)  # type: ignore[union-attr]
            if result.get("switched") and not result.get("cached"):
                to_first_call_ms.append((time.perf_counter() - t0) * 1000)
    finally:
        await lease.disconnect()
        fleet.provisioner.keep = keep
    if to_first_call_ms:
        log(f"  a connected lease switched: to its first call p50 {statistics.median(to_first_call_ms):.1f} ms")
    return {"bind_to_first_tool_call": summary(to_first_call_ms)}


async def repeats(fleet: LocalFleet, envs: list[EnvBundle], log) -> dict[str, Any]:
    """Back and forth between two environments the instance holds: a reset each."""
    reset_ms, call_ms = [], []
    handle = fleet.instances[0]
    control = ControlClient(handle.control_url)
    try:
        for bundle in envs * 25:  # 50 switches
            t0 = time.perf_counter()
            result = await control.reset(None, env=bundle.name)
            reset_ms.append((time.perf_counter() - t0) * 1000)
            assert result.get("bind", {}).get("cached") in (True, None), result
            call_ms.append(await first_call(handle.mcp_url, bundle))
    finally:
        await control.close()
    log(f"  repeat claim of a cached environment: reset p50 {statistics.median(reset_ms):.2f} ms")
    return {"reset_with_env_http": summary(reset_ms), "new_session_and_first_call": summary(call_ms)}


async def group_switches(fleet: LocalFleet, envs: list[EnvBundle], log) -> dict[str, Any]:
    source = PoolSource.from_fleet(fleet)
    group_ms = []
    try:
        for bundle in envs:
            fleet.provisioner.prefill(bundle.name, len(fleet.instances))  # type: ignore[union-attr]
            for _ in range(400):
                if fleet.provisioner.ready_count(bundle.name) >= len(fleet.instances):  # type: ignore[union-attr]
                    break
                await asyncio.sleep(0.025)
            t0 = time.perf_counter()
            group = await source.claim_group(bundle.name, len(fleet.instances))
            group_ms.append((time.perf_counter() - t0) * 1000)
            assert len(group) == len(fleet.instances) and all(lease.env == bundle.name for lease in group)
            await source.release(group)
    finally:
        await source.close()
    log(f"  group of {len(fleet.instances)} switched at once: p50 {statistics.median(group_ms):.1f} ms")
    return {"group_size": len(fleet.instances), "claim_group": summary(group_ms)}


async def pinned(database: Database, envs: list[EnvBundle], log) -> dict[str, Any]:
    """Today's per-environment fleet: a reset where E's instance exists, a cold start where not."""
    cold_ms, reset_ms = [], []
    for bundle in envs:
        t0 = time.perf_counter()
        fleet = LocalFleet([bundle], database=database, binding="pinned", allow_ungated=True, fleet_id="pin")
        await fleet.start()
        try:
            cold_ms.append((time.perf_counter() - t0) * 1000 + await first_call(fleet.instances[0].mcp_url, bundle))
            control = ControlClient(fleet.instances[0].control_url)
            try:
                for _ in range(10):
                    t1 = time.perf_counter()
                    await control.reset(None)
                    reset_ms.append((time.perf_counter() - t1) * 1000)
            finally:
                await control.close()
        finally:
            await fleet.stop()
    log(f"  pinned: reset p50 {statistics.median(reset_ms):.2f} ms, cold start p50 {statistics.median(cold_ms):.0f} ms")
    return {"pinned_reset_http": summary(reset_ms), "pinned_cold_start_to_first_call": summary(cold_ms)}


def tree_pss(pid: int) -> float:
    return round(pss_mb(pid) + sum(pss_mb(p) for p in children(pid)), 1)


async def memory(database: Database, envs: list[EnvBundle], cache: int, log) -> dict[str, Any]:
    out: dict[str, Any] = {}
    async with LocalFleet(envs[:1], database=database, binding="pinned", allow_ungated=True, fleet_id="mem1") as one:
        await asyncio.sleep(1.0)
        out["pinned_one_env_pss_mb"] = tree_pss(one.instances[0].pid)
    async with LocalFleet(envs[:cache], database=database, allow_ungated=True, instances=1, cache_envs=cache,
                          fleet_id="memlate", keep_ready=0) as late:
        handle = late.instances[0]
        control = ControlClient(handle.control_url)
        try:
            for bundle in envs[:cache]:
                await control.bind(bundle.name)
                await first_call(handle.mcp_url, bundle)
            await asyncio.sleep(1.0)
            info = await control.info()
        finally:
            await control.close()
        out[f"late_{cache}_envs_cached_pss_mb"] = tree_pss(handle.pid)
        out["cached_envs"] = len(info["cached_envs"])
    log(f"  memory: pinned {out['pinned_one_env_pss_mb']} MB, late with {cache} cached "
        f"{out[f'late_{cache}_envs_cached_pss_mb']} MB (PSS, env server and descendants)")
    return out


async def run(args: argparse.Namespace, admin_dsn: str, log) -> dict[str, Any]:
    bundles = catalog.load(varied.cached_catalog(args.catalog_count, 0))
    step = max(1, len(bundles) // (args.envs * 2 + args.instances))
    chosen = bundles[::step][: args.envs * 2 + args.instances]
    firsts, ready_envs, clone_envs = (chosen[: args.instances], chosen[args.instances: args.instances + args.envs],
                                      chosen[args.instances + args.envs:])
    database = Database(admin_dsn)
    result: dict[str, Any] = {"environments": {"catalog": len(bundles), "measured": len(chosen),
                                               "sizes": sorted({varied.describe(b)["size"] for b in chosen})}}
    log(f"{len(chosen)} environments of the {len(bundles)}-environment catalog, {args.instances} instances")
    t0 = time.perf_counter()
    fleet = LocalFleet(chosen, database=database, allow_ungated=True, instances=args.instances,
                       cache_envs=args.cache_envs, keep_ready=0, fleet_id="switch")
    await fleet.start()
    result["fleet_start_s"] = round(time.perf_counter() - t0, 1)
    try:
        result["switch_ready"] = await switches(fleet, ready_envs, True, log)
        result["switch_clone"] = await switches(fleet, clone_envs, False, log)
        result["repeat_cached"] = await repeats(fleet, clone_envs[-2:], log)
        result["lease_switch"] = await lease_switches(fleet, ready_envs, log)
        result["group_switch"] = await group_switches(fleet, ready_envs[: max(2, args.envs // 4)], log)
        result["provisioner"] = dict(fleet.provisioner.stats)  # type: ignore[union-attr]
    finally:
        await fleet.stop()
    result["baseline"] = await pinned(database, firsts + ready_envs[:2], log)
    result["memory"] = await memory(database, chosen, args.cache_envs, log)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(prog="python -m bench.switch", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--envs", type=int, default=16, help="environments switched to per phase")
    ap.add_argument("--instances", type=int, default=4)
    ap.add_argument("--cache-envs", type=int, default=8)
    ap.add_argument("--catalog-count", type=int, default=1000)
    ap.add_argument("--work-dir", help="where the private PostgreSQL's data directory goes (default: /tmp)")
    ap.add_argument("--quick", action="store_true", help="a smoke run (4 environments, 2 instances)")
    ap.add_argument("--json", action="store_true", help="print the JSON result only")
    args = ap.parse_args()
    if args.quick:
        args.envs, args.instances, args.cache_envs = 4, 2, 2
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    tmp = tempfile.mkdtemp(prefix="awm-switch-", dir=args.work_dir)
    server = EmbeddedPostgres(Path(tmp) / "postgres")
    server.start()
    try:
        admin_dsn = server.admin_dsn()
        provision.harden_cluster(admin_dsn)
        result = {"machine": machine(), **asyncio.run(run(args, admin_dsn, log))}
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)  # the private cluster's data directory
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
