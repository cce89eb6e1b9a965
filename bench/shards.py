"""Postgres shards: 1,024 open episodes over 4 servers against the same on one server.

    .venv/bin/python -m bench.shards [--episodes 1024] [--shards 4] [--json] [--work-dir /dev/shm]

Issue 22 asks what one server per fleet costs at the paper's 1,024 concurrent episodes and what
shards change. Measured here, in one run, on private embedded clusters (fsync off):

* ``sharded``: ``--shards`` servers; each episode's instance database placed by the operator's
  own placement (``awm_operator.databases.choose_shard`` on live probes: the shard with the most
  free connection slots, re-probed every 64 placements, the placements since the last probe
  counted as starting pods, as the operator counts pods not Ready yet; a placement that finds no
  room probes again first, as the operator's next pass would);
* ``baseline``: one server (``max_connections`` raised to hold them all) with every episode.

An open episode is what an env instance holds during an episode: its instance database
(``CREATE DATABASE ... TEMPLATE``), its own role's connection, an open transaction that has read
every table and updated a row. Reported per server: episodes, client backends, max_connections,
PSS of the whole server (postmaster and children) before and with the episodes open, and the time
to open them. The environment is the median small one of the generated catalog.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql

from awm import catalog
from awm.postgres import provision
from awm.postgres.server import EmbeddedPostgres
from awm.synth import varied
from awm_operator.databases import SLOTS_PER_INSTANCE, Shard, choose_shard, probe
from bench.claimdb import PHASES, Env, create_clone, drop_clone, machine, pick, prepare, server_pss_mb

PROBE_EVERY = 64  # placements between probes (the operator probes every 5 s)


def start(root: Path, name: str, max_connections: int) -> EmbeddedPostgres:
    server = EmbeddedPostgres(root / name)
    server.start()
    with psycopg.connect(server.admin_dsn(), autocommit=True) as conn:
        conn.execute(sql.SQL("ALTER SYSTEM SET max_connections = {}").format(sql.Literal(max_connections)))
    server.restart()
    provision.harden_cluster(server.admin_dsn())
    provision.ensure_group_roles(server.admin_dsn())
    return server


def open_episode(admin: psycopg.Connection, admin_dsn: str, env: Env, name: str) -> psycopg.Connection:
    PHASES.current = {}  # (claimdb's per-claim phase timings: not reported here)
    dsn = create_clone(admin, admin_dsn, env, name, "FILE_COPY")
    conn = psycopg.connect(dsn)
    for table in env.tables:
        conn.execute(sql.SQL("SELECT * FROM {} LIMIT 100").format(sql.Identifier(table))).fetchall()
    key = env.bundle.database.seed[0]
    conn.execute(sql.SQL("UPDATE {} SET id = id WHERE id = 1").format(sql.Identifier(key.table)))
    return conn  # the transaction stays open, as during an episode


def run(servers: dict[str, EmbeddedPostgres], bundle: Any, episodes: int) -> dict[str, Any]:
    """Open ``episodes`` episodes over ``servers`` (placed by choose_shard), measure, close."""
    envs = {n: prepare(s.admin_dsn(), "small", bundle) for n, s in servers.items()}
    admins = {n: provision._admin(s.admin_dsn()) for n, s in servers.items()}
    shards = {n: Shard(n, f"dsn-{n}", s.admin_dsn()) for n, s in servers.items()}
    before = {n: server_pss_mb(s.admin_dsn()) for n, s in servers.items()}
    conns: list[psycopg.Connection] = []
    names: dict[str, list[str]] = {n: [] for n in servers}
    since_probe: Counter[str] = Counter()
    refused = 0
    t0 = time.perf_counter()
    try:
        for i in range(episodes):
            shard = None if i % PROBE_EVERY == 0 else choose_shard(shards.values(), since_probe)
            if shard is None:  # due, or no room as far as the last probe knows: probe (the operator's next pass)
                for s in shards.values():
                    s.observe(probe(s.dsn), time.monotonic(), 60)
                since_probe.clear()
                shard = choose_shard(shards.values(), since_probe)
            if shard is None:
                refused += 1
                continue
            since_probe[shard.name] += 1
            name = f"awm_bench_s{i}"
            conns.append(open_episode(admins[shard.name], servers[shard.name].admin_dsn(), envs[shard.name], name))
            names[shard.name].append(name)
        opened_s = time.perf_counter() - t0
        per: dict[str, Any] = {}
        for n, s in servers.items():
            max_conn, backends = probe(s.admin_dsn())
            per[n] = {"episodes": len(names[n]), "client_backends": backends, "max_connections": max_conn,
                      "free_slots_for_instances": (max_conn - backends) // SLOTS_PER_INSTANCE,
                      "server_pss_mb_before": before[n], "server_pss_mb_open": server_pss_mb(s.admin_dsn())}
    finally:
        for conn in conns:
            conn.close()
        for n, admin in admins.items():
            for name in names[n]:
                drop_clone(admin, name)
            admin.close()
    total_pss = sum(v["server_pss_mb_open"] for v in per.values())
    return {"servers": per, "episodes_open": sum(len(v) for v in names.values()), "refused": refused,
            "open_s": round(opened_s, 1), "pss_mb_all_servers": round(total_pss, 1),
            "largest_server_pss_mb": max(v["server_pss_mb_open"] for v in per.values()),
            "largest_server_backends": max(v["client_backends"] for v in per.values())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--episodes", type=int, default=1024)
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--work-dir", help="where the private clusters live (default: the system's temporary directory)")
    ap.add_argument("--json", action="store_true", help="print the JSON result only")
    args = ap.parse_args()
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))
    root = Path(tempfile.mkdtemp(prefix="awm-shards-", dir=args.work_dir))
    servers: dict[str, EmbeddedPostgres] = {}
    try:
        bundle = pick(catalog.load(varied.cached_catalog(100, 0)))["small"]
        per_shard = -(-args.episodes // args.shards)
        # each shard with room for its share and some (as a chart would size it), the baseline for all
        servers = {str(i): start(root, f"shard{i}", per_shard + per_shard // 4 + 20) for i in range(args.shards)}
        result: dict[str, Any] = {"machine": machine(servers["0"].admin_dsn()), "environment": bundle.name,
                                  "episodes": args.episodes, "shards": args.shards}
        log(f"sharded: {args.episodes} episodes over {args.shards} servers")
        result["sharded"] = run(servers, bundle, args.episodes)
        log(json.dumps(result["sharded"]))
        for s in servers.values():
            s.stop()
        servers = {"one": start(root, "one", args.episodes + args.episodes // 4 + 20)}
        log(f"baseline: {args.episodes} episodes on one server")
        result["baseline"] = run(servers, bundle, args.episodes)
        log(json.dumps(result["baseline"]))
        print(json.dumps(result, indent=None if args.json else 2))
    finally:
        for s in servers.values():
            s.stop()
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
