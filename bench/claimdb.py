"""Instance databases made at claim time: which way is fast enough, and what an open episode costs.

    python -m bench.claimdb [--quick] [--json] [--n 30] [--threads 8] [--database-url DSN]

Late binding (issue 22) gives an instance its environment when it is claimed, so the instance's
database may have to be made then. Measured here, in one run, on the embedded PostgreSQL (a
private cluster in a temporary directory, the embedded settings: fsync off) or the given server,
for a small and a medium environment of the generated catalog (awm/synth/varied.py):

* ``today``: ``provision.create_instance`` as the init containers call it (a new admin connection,
  ``CREATE ROLE``, ``CREATE DATABASE ... TEMPLATE`` with the server's default strategy, grants,
  comment): the baseline;
* ``clone_wal_log`` / ``clone_file_copy``: the same statements on a held admin connection, with
  ``STRATEGY WAL_LOG`` / ``STRATEGY FILE_COPY``;
* ``pool_connect``: a database and role made ahead of time (not timed; their making is the
  refill, timed as the clones above) and at claim time only connected to;
* ``pool_handover``: the same, plus a rename of database and role to the claim's name and a new
  password (a fresh credential for the claimant);
* ``schema_copy``: schema per environment in one database: ``CREATE SCHEMA``, the bundle's DDL in
  it, ``INSERT ... SELECT`` from the environment's template schema, ``setval`` of its sequences,
  a role confined to the schema (one transaction).

Every claim ends when the instance's own role has connected and read a table (the first moment
a tool call could run). Each is measured with 1 creator and with ``--threads`` concurrent ones
(p50/p99 per claim and claims/s); releases (``DROP``) are timed too. Then the cost of an open
episode: backends of instance roles holding an open transaction that has read every table,
measured from /proc (RSS, PSS, private) per backend and as the server's PSS growth.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from awm import catalog
from awm.bundle import EnvBundle
from awm.postgres import provision
from awm.postgres.server import EmbeddedPostgres
from awm.synth import varied

TOOL, READER = provision.TOOL_ROLE, provision.READER_ROLE
SHARED_DB = "awm_bench_shared"
SCHEMA_GROUP = "awm_bench_schema_user"  # holds CONNECT on the shared database (a grant per role races on pg_database)
PHASES = threading.local()  # per-claim phase timings (ms), filled by the helpers below


def phase(name: str, started: float) -> None:
    PHASES.current[name] = PHASES.current.get(name, 0.0) + (time.perf_counter() - started) * 1000


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 2)


def summary(values: list[float]) -> dict[str, Any]:
    return {"n": len(values), "p50_ms": pct(values, 0.5), "p99_ms": pct(values, 0.99), "max_ms": pct(values, 1.0)}


def proc_memory_kb(pid: int) -> dict[str, int]:
    out = {}
    try:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            key, _, rest = line.partition(":")
            if key in ("Rss", "Pss", "Private_Clean", "Private_Dirty"):
                out[key] = int(rest.split()[0])
    except OSError:
        pass
    return out


def postmaster_pid(admin_dsn: str) -> int:
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]
    return int(Path(data_dir, "postmaster.pid").read_text().split()[0])


def server_cpu_ms(pid: int) -> float:
    """CPU time of the whole server so far: the postmaster, its live children and the children it
    has reaped (every backend of a closed connection). Unlike latency, it does not grow when other
    jobs compete for the CPU, so it is the number that carries over to another machine."""
    def fields(p: int) -> list[str]:
        try:
            return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            return []
    tick = 1000 / os.sysconf("SC_CLK_TCK")
    own = fields(pid)
    total = sum(int(x) for x in own[11:15]) if own else 0  # utime, stime, cutime, cstime
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            children = [int(c) for c in (task / "children").read_text().split()]
        except OSError:
            children = []
        for child in children:
            f = fields(child)
            total += sum(int(x) for x in f[11:13]) if f else 0
    return total * tick


def server_pss_mb(admin_dsn: str) -> float:
    """PSS of the postmaster and every child process (backends, checkpointer, walwriter...)."""
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]
    pid = int(Path(data_dir, "postmaster.pid").read_text().split()[0])
    pids = [pid]
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            pids += [int(p) for p in (task / "children").read_text().split()]
        except OSError:
            pass
    return round(sum(proc_memory_kb(p).get("Pss", 0) for p in pids) / 1024, 1)


def machine(admin_dsn: str) -> dict[str, Any]:
    cpu = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                if ln.startswith("model name")), platform.processor())
    mem = next(int(ln.split()[1]) for ln in Path("/proc/meminfo").read_text().splitlines() if ln.startswith("MemTotal"))
    with psycopg.connect(admin_dsn, autocommit=True) as conn:
        version = conn.execute("SHOW server_version").fetchone()[0]
        settings = {k: conn.execute(sql.SQL("SHOW {}").format(sql.Identifier(k))).fetchone()[0]
                    for k in ("fsync", "shared_buffers", "max_connections", "wal_level", "full_page_writes")}
        data_dir = conn.execute("SHOW data_directory").fetchone()[0]
    fs = subprocess.run(["stat", "-f", "-c", "%T", data_dir], capture_output=True, text=True).stdout.strip()
    return {"cpu": cpu, "cpus": os.cpu_count(), "mem_gb": round(mem / 1024 / 1024, 1), "kernel": platform.release(),
            "python": platform.python_version(), "postgres": version, "settings": settings, "data_dir_fs": fs,
            "loadavg_start": os.getloadavg()}


# --------------------------------------------------------------------------- the environments


@dataclass
class Env:
    label: str
    bundle: EnvBundle
    template: provision.Template
    tables: list[str]
    sequences: dict[str, tuple[int, bool]]  # name -> (last_value, is_called) in the snapshot
    schema: str = ""  # its template schema in the shared database


def pick(bundles: list[EnvBundle]) -> dict[str, EnvBundle]:
    """The median environment of each size class (by seed rows)."""
    by_size: dict[str, list[EnvBundle]] = {}
    for b in bundles:
        by_size.setdefault(varied.describe(b)["size"], []).append(b)
    chosen = {}
    for size in ("small", "medium"):
        group = sorted(by_size.get(size, []), key=lambda b: varied.describe(b)["rows"])
        if group:
            chosen[size] = group[len(group) // 2]
    return chosen


def prepare(admin_dsn: str, label: str, bundle: EnvBundle) -> Env:
    template = provision.ensure_template(admin_dsn, bundle)
    with provision._admin(admin_dsn) as conn:
        conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS true").format(sql.Identifier(template.dbname)))
    try:
        with provision._admin(admin_dsn, template.dbname) as db:
            sequences = {r[0]: (r[1], r[2]) for r in db.execute("SELECT name, last_value, is_called FROM awm_meta.sequences")}
    finally:
        with provision._admin(admin_dsn) as conn:
            conn.execute(sql.SQL("ALTER DATABASE {} WITH ALLOW_CONNECTIONS false").format(sql.Identifier(template.dbname)))
    tables = [s.table for s in bundle.database.seed]
    return Env(label, bundle, template, tables, sequences)


def with_db(dsn: str, **params: str) -> str:
    return make_conninfo(**{**conninfo_to_dict(dsn), **params})


def ready(dsn: str, table: str, options: str = "") -> None:
    """The instance role connects and reads: the first moment a tool call could run."""
    extra = {"options": options} if options else {}
    t0 = time.perf_counter()
    with psycopg.connect(with_db(dsn, **extra), autocommit=True) as conn:
        phase("connect", t0)
        conn.execute(sql.SQL("SELECT count(*) FROM {}").format(sql.Identifier(table))).fetchone()


# --------------------------------------------------------------------------- strategies


def create_clone(conn: psycopg.Connection, admin_dsn: str, env: Env, name: str, strategy: str | None) -> str:
    """provision._create_instance's statements, with an explicit STRATEGY."""
    password = secrets.token_urlsafe(24)
    ident = sql.Identifier(name)
    conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {}, {} CONNECTION LIMIT 1").format(
        ident, sql.Literal(password), sql.Identifier(TOOL), sql.Identifier(READER)))
    strategy_sql = sql.SQL(" STRATEGY {}").format(sql.SQL(strategy)) if strategy else sql.SQL("")
    t0 = time.perf_counter()
    conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE {}").format(ident, sql.Identifier(env.template.dbname)) + strategy_sql)
    phase("create_database", t0)
    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(ident))
    conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(ident, ident))
    conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(ident, sql.Literal(json.dumps(
        {"env": env.bundle.name, "template": env.template.dbname}))))
    return with_db(admin_dsn, dbname=name, user=name, password=password)


def drop_clone(conn: psycopg.Connection, name: str) -> None:
    conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def load_template_schema(admin_dsn: str, env: Env) -> None:
    """The environment's snapshot as a schema of the shared database (once per environment)."""
    env.schema = f"tpl_{env.bundle.database_hash()[:12]}"
    with provision._admin(admin_dsn, SHARED_DB) as db:
        if db.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (env.schema,)).fetchone():
            return
        with db.transaction():
            db.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(env.schema)))
            db.execute(sql.SQL("SET LOCAL search_path = {}").format(sql.Identifier(env.schema)))
            db.execute(env.bundle.database.ddl)
            for seed in env.bundle.database.seed:
                for start in range(0, len(seed.rows), 500):
                    for columns, group in _runs(seed.rows[start:start + 500]):
                        statement = sql.SQL("INSERT INTO {}.{} ({}) VALUES ({})").format(
                            sql.Identifier(env.schema), sql.Identifier(seed.table),
                            sql.SQL(", ").join(map(sql.Identifier, columns)),
                            sql.SQL(", ").join(sql.Placeholder() * len(columns)))
                        with db.cursor() as cur:
                            cur.executemany(statement, [tuple(provision._adapt(r[c]) for c in columns) for r in group])
            for seq, (last, called) in env.sequences.items():
                db.execute("SELECT setval(%s, %s, %s)", (f"{env.schema}.{seq}", last, called))


def _runs(rows: list[dict[str, Any]]) -> list[tuple[list[str], list[dict[str, Any]]]]:
    out: list[tuple[list[str], list[dict[str, Any]]]] = []
    for row in rows:
        if out and out[-1][0] == list(row):
            out[-1][1].append(row)
        else:
            out.append((list(row), [row]))
    return out


def create_schema_copy(conn: psycopg.Connection, admin_dsn: str, env: Env, name: str) -> str:
    """Schema-per-environment: the bundle's DDL in a new schema, rows copied from the template
    schema, sequences set, a role that reaches only that schema; one transaction."""
    password = secrets.token_urlsafe(24)
    ident, tpl = sql.Identifier(name), sql.Identifier(env.schema)
    with conn.transaction():
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {} IN ROLE {} CONNECTION LIMIT 1").format(
            ident, sql.Literal(password), sql.Identifier(SCHEMA_GROUP)))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(ident))
        conn.execute(sql.SQL("SET LOCAL search_path = {}").format(ident))
        t0 = time.perf_counter()
        conn.execute(env.bundle.database.ddl)
        phase("ddl", t0)
        t0 = time.perf_counter()
        for table in env.tables:
            conn.execute(sql.SQL("INSERT INTO {s}.{t} SELECT * FROM {tpl}.{t}").format(s=ident, t=sql.Identifier(table), tpl=tpl))
        phase("copy_rows", t0)
        for seq, (last, called) in env.sequences.items():
            conn.execute("SELECT setval(%s, %s, %s)", (f"{name}.{seq}", last, called))
        conn.execute(sql.SQL("GRANT USAGE ON SCHEMA {} TO {}").format(ident, ident))
        conn.execute(sql.SQL("GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA {} TO {}").format(ident, ident))
        conn.execute(sql.SQL("GRANT USAGE, SELECT, UPDATE ON ALL SEQUENCES IN SCHEMA {} TO {}").format(ident, ident))
    return with_db(admin_dsn, dbname=SHARED_DB, user=name, password=password)


def drop_schema_copy(conn: psycopg.Connection, name: str) -> None:
    ident = sql.Identifier(name)
    with conn.transaction():
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(ident))
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(ident))


class Counter:
    def __init__(self) -> None:
        self._n, self._lock = 0, threading.Lock()

    def next(self) -> int:
        with self._lock:
            self._n += 1
            return self._n


NAMES = Counter()


def run_strategy(strategy: str, admin_dsn: str, env: Env, threads: int, per_thread: int) -> dict[str, Any]:
    """``threads`` creators, each making ``per_thread`` claims one after another; then the releases."""
    pool: list[tuple[str, str]] = []
    pool_lock = threading.Lock()
    refill_ms: list[float] = []
    if strategy.startswith("pool"):  # made ahead of time: the refill, timed but not on the claim path
        with provision._admin(admin_dsn) as conn:
            for _ in range(threads * per_thread):
                name = f"awm_bench_p{NAMES.next()}"
                PHASES.current = {}
                t0 = time.perf_counter()
                pool.append((name, create_clone(conn, admin_dsn, env, name, None)))
                refill_ms.append((time.perf_counter() - t0) * 1000)
    first_table = env.tables[0]

    def claim(conn: psycopg.Connection) -> tuple[float, str, str, dict[str, float]]:
        name = f"awm_bench_i{NAMES.next()}"
        PHASES.current = {}
        t0 = time.perf_counter()
        kind = "database"
        if strategy == "today":
            instance = provision.create_instance(admin_dsn, env.template, name)
            ready(instance.dsn, first_table)
        elif strategy in ("clone_wal_log", "clone_file_copy"):
            dsn = create_clone(conn, admin_dsn, env, name, strategy.removeprefix("clone_").upper())
            ready(dsn, first_table)
        elif strategy == "pool_connect":
            with pool_lock:
                name, dsn = pool.pop()
            ready(dsn, first_table)
        elif strategy == "pool_handover":
            with pool_lock:
                old, _ = pool.pop()
            password = secrets.token_urlsafe(24)
            conn.execute(sql.SQL("ALTER DATABASE {} RENAME TO {}").format(sql.Identifier(old), sql.Identifier(name)))
            conn.execute(sql.SQL("ALTER ROLE {} RENAME TO {}").format(sql.Identifier(old), sql.Identifier(name)))
            conn.execute(sql.SQL("ALTER ROLE {} PASSWORD {}").format(sql.Identifier(name), sql.Literal(password)))
            conn.execute(sql.SQL("COMMENT ON DATABASE {} IS {}").format(sql.Identifier(name), sql.Literal(
                json.dumps({"env": env.bundle.name, "claim": name}))))
            ready(with_db(admin_dsn, dbname=name, user=name, password=password), first_table)
        elif strategy == "schema_copy":
            dsn = create_schema_copy(conn, admin_dsn, env, name)
            ready(dsn, first_table, options=f"-c search_path={name}")
            kind = "schema"
        else:
            raise ValueError(strategy)
        return (time.perf_counter() - t0) * 1000, name, kind, dict(PHASES.current)

    def creator(_: int) -> list[tuple[float, str, str, dict[str, float]]]:
        dbname = SHARED_DB if strategy == "schema_copy" else None
        with provision._admin(admin_dsn, dbname) as conn:
            return [claim(conn) for _ in range(per_thread)]

    if not strategy.startswith("pool"):  # one warm-up claim (the first after a start fills caches), not counted
        with provision._admin(admin_dsn, SHARED_DB if strategy == "schema_copy" else None) as conn:
            warm = claim(conn)
            if warm[2] == "schema":
                drop_schema_copy(conn, warm[1])
            else:
                drop_clone(conn, warm[1])
    pid = postmaster_pid(admin_dsn)
    load = os.getloadavg()[0]
    cpu0 = server_cpu_ms(pid)
    t0 = time.perf_counter()
    with ThreadPoolExecutor(threads) as ex:
        made = [m for batch in ex.map(creator, range(threads)) for m in batch]
    wall = time.perf_counter() - t0
    cpu = server_cpu_ms(pid) - cpu0
    release_ms = []
    with provision._admin(admin_dsn) as conn, provision._admin(admin_dsn, SHARED_DB) as shared:
        for _, name, kind, _ in made:
            t1 = time.perf_counter()
            if kind == "schema":
                drop_schema_copy(shared, name)
            else:
                drop_clone(conn, name)
            release_ms.append((time.perf_counter() - t1) * 1000)
    out = {"threads": threads, "claim": summary([m[0] for m in made]),
           "claims_per_s": round(len(made) / wall, 1), "server_cpu_ms_per_claim": round(cpu / len(made), 1),
           "loadavg_1m_at_start": round(load, 1), "release": summary(release_ms)}
    for key in sorted({k for m in made for k in m[3]}):
        out[f"{key}_p50_ms"] = pct([m[3].get(key, 0.0) for m in made], 0.5)
    if refill_ms:
        out["refill"] = summary(refill_ms)
    return out


# --------------------------------------------------------------------------- open episodes


def episode_memory(admin_dsn: str, env: Env, count: int, mode: str) -> dict[str, Any]:
    """``count`` open episodes: each an instance role's connection holding an open transaction
    that has read every table and updated one row (as a tool call would); their backends measured."""
    names: list[str] = []
    conns: list[psycopg.Connection] = []
    before = server_pss_mb(admin_dsn)
    idle: list[dict[str, int]] = []
    busy: list[dict[str, int]] = []
    admin = provision._admin(admin_dsn, SHARED_DB if mode == "schema" else None)
    try:
        for _ in range(count):
            name = f"awm_bench_m{NAMES.next()}"
            PHASES.current = {}
            if mode == "schema":
                dsn = with_db(create_schema_copy(admin, admin_dsn, env, name), options=f"-c search_path={name}")
            else:
                dsn = create_clone(admin, admin_dsn, env, name, None)
            names.append(name)
            conn = psycopg.connect(dsn)
            conns.append(conn)
            pid = conn.execute("SELECT pg_backend_pid()").fetchone()[0]
            conn.commit()
            idle.append(proc_memory_kb(pid))
            for table in env.tables:
                conn.execute(sql.SQL("SELECT * FROM {} LIMIT 100").format(sql.Identifier(table))).fetchall()
            key = env.bundle.database.seed[0]
            conn.execute(sql.SQL("UPDATE {} SET id = id WHERE id = 1").format(sql.Identifier(key.table)))
            busy.append(proc_memory_kb(pid))  # transaction left open, as during an episode
        during = server_pss_mb(admin_dsn)
    finally:
        for conn in conns:
            conn.close()
        for name in names:
            if mode == "schema":
                drop_schema_copy(admin, name)
            else:
                drop_clone(admin, name)
        admin.close()

    def med(rows: list[dict[str, int]], key: str) -> float:
        return round(statistics.median(r.get(key, 0) for r in rows) / 1024, 2)

    return {"episodes": count, "mode": mode,
            "backend_rss_mb": med(busy, "Rss"), "backend_pss_mb": med(busy, "Pss"),
            "backend_private_mb": round(statistics.median(r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)
                                                          for r in busy) / 1024, 2),
            "backend_pss_mb_idle_connection": med(idle, "Pss"),
            "server_pss_growth_mb_per_episode": round((during - before) / count, 2),
            "server_pss_mb_before": before, "server_pss_mb_open": during}


def database_size_mb(admin_dsn: str, name: str) -> float:
    with provision._admin(admin_dsn) as conn:
        return round(conn.execute("SELECT pg_database_size(%s)", (name,)).fetchone()[0] / 1024 / 1024, 2)


# --------------------------------------------------------------------------- main


STRATEGIES = ["today", "clone_wal_log", "clone_file_copy", "pool_connect", "pool_handover", "schema_copy"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--database-url", help="admin DSN of a server to use (default: a private embedded cluster)")
    ap.add_argument("--work-dir", help="where the private cluster lives (default: the system's temporary "
                                       "directory); e.g. /dev/shm for a data directory on tmpfs")
    ap.add_argument("--n", type=int, default=20, help="claims per strategy and size with one creator")
    ap.add_argument("--threads", type=int, default=8, help="concurrent creators in the concurrency runs")
    ap.add_argument("--per-thread", type=int, default=5, help="claims per creator in the concurrency runs")
    ap.add_argument("--episodes", type=int, default=32, help="open episodes for the memory measurement")
    ap.add_argument("--catalog-count", type=int, default=100, help="environments of the varied catalog to choose from")
    ap.add_argument("--only", nargs="*", choices=STRATEGIES, help="only these strategies")
    ap.add_argument("--episodes-only", choices=["database", "schema"],
                    help="skip the claim measurements: only open episodes of this mode (e.g. --episodes 256: one shard's share of 1,024)")
    ap.add_argument("--quick", action="store_true", help="few repetitions (a smoke run)")
    ap.add_argument("--json", action="store_true", help="print the JSON result only")
    args = ap.parse_args()
    if args.quick:
        args.n, args.per_thread, args.episodes = 5, 2, 4
    log = (lambda *a: None) if args.json else (lambda *a: print(*a, file=sys.stderr, flush=True))

    tmp = None
    server = None
    if args.database_url:
        admin_dsn = args.database_url
    else:
        tmp = tempfile.mkdtemp(prefix="awm-claimdb-", dir=args.work_dir)
        server = EmbeddedPostgres(Path(tmp) / "postgres")
        server.start()
        admin_dsn = server.admin_dsn()
        provision.harden_cluster(admin_dsn)
    try:
        result: dict[str, Any] = {"machine": machine(admin_dsn), "strategies": {}, "episodes": {}, "environments": {}}
        provision.ensure_group_roles(admin_dsn)
        bundles = catalog.load(varied.cached_catalog(args.catalog_count, 0))
        with provision._admin(admin_dsn) as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(SHARED_DB)))
            conn.execute(sql.SQL("CREATE DATABASE {} TEMPLATE template0").format(sql.Identifier(SHARED_DB)))
            conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(sql.Identifier(SHARED_DB)))
            if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (SCHEMA_GROUP,)).fetchone():
                conn.execute(sql.SQL("CREATE ROLE {} NOLOGIN").format(sql.Identifier(SCHEMA_GROUP)))
            conn.execute(sql.SQL("GRANT CONNECT ON DATABASE {} TO {}").format(sql.Identifier(SHARED_DB),
                                                                             sql.Identifier(SCHEMA_GROUP)))
        envs = {}
        for label, bundle in pick(bundles).items():
            env = prepare(admin_dsn, label, bundle)
            load_template_schema(admin_dsn, env)
            envs[label] = env
            d = varied.describe(bundle)
            result["environments"][label] = {"name": bundle.name, "tables": d["tables"], "rows": d["rows"],
                                             "template_mb": database_size_mb(admin_dsn, env.template.dbname)}
            log(f"{label}: {bundle.name}, {d['tables']} tables, {d['rows']} rows")
        shared_before = database_size_mb(admin_dsn, SHARED_DB)
        for strategy in [] if args.episodes_only else args.only or STRATEGIES:
            for label, env in envs.items():
                runs = []
                for threads, per in ((1, args.n), (args.threads, args.per_thread)):
                    r = run_strategy(strategy, admin_dsn, env, threads, per)
                    runs.append(r)
                    log(f"{strategy:16} {label:7} x{threads}: claim p50 {r['claim']['p50_ms']} p99 {r['claim']['p99_ms']} ms, "
                        f"{r['claims_per_s']}/s, server CPU {r['server_cpu_ms_per_claim']} ms/claim, "
                        f"release p50 {r['release']['p50_ms']} ms, load {r['loadavg_1m_at_start']}; "
                        + ", ".join(f"{k} {v}" for k, v in r.items() if k.endswith("_p50_ms")))
                result["strategies"].setdefault(strategy, {})[label] = runs
        result["shared_db_mb_after"] = {"before": shared_before, "after": database_size_mb(admin_dsn, SHARED_DB)}
        for label, env in envs.items():
            for mode in [args.episodes_only] if args.episodes_only else ["database", "schema"]:
                r = episode_memory(admin_dsn, env, args.episodes, mode)
                result["episodes"].setdefault(label, {})[mode] = r
                log(f"episodes {label:7} {mode:8}: backend PSS {r['backend_pss_mb']} MB (idle {r['backend_pss_mb_idle_connection']}), "
                    f"RSS {r['backend_rss_mb']}, private {r['backend_private_mb']}, server +{r['server_pss_growth_mb_per_episode']} MB/episode")
        result["machine"]["loadavg_end"] = os.getloadavg()
        print(json.dumps(result, indent=1))
    finally:
        if server is not None:
            server.stop()
        if tmp:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
