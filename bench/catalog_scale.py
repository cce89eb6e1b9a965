"""Catalog scale: a 1,000-environment AWM-format catalog, from import to serving.

    python -m bench.catalog_scale [--envs 1000] [--import-sample 40] [--serve 64] [--json]

The catalog is generated from the AWM fixture (tests/fixtures/awm1k: two environments, a library
and a pet clinic) by renaming its scenarios: 1,000 environments of the published shape (an app,
a SQLite schema and inserts, spec, tasks, both verifier files). Measured, on this machine:

* ``awm catalog import``: seconds per environment on ``--import-sample`` of them (each one runs
  its app probe and every verifier on the untouched snapshot), extrapolated to the catalog - the
  full import is that many times longer, in one process, and the extrapolation is labelled so;
* loading the 1,000 bundles (``awm.catalog.load``) and the catalog index;
* template databases for all 1,000 environments in one Postgres: time, disk, server memory;
* the catalog's size on disk and as the tar.gz a catalog image or ``catalog.url`` serves;
* ``awm serve`` of ``--serve`` instances over as many environments: time to Ready, memory (PSS of
  every env server and its worker).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import platform
import shutil
import tarfile
import tempfile
import time
from pathlib import Path
from typing import Any


from awm import catalog
from awm.fleet import Database, LocalFleet
from awm.importers.awm1k import import_awm_dir, normalize_scenario_name
from awm.postgres import provision
from bench.runtime import children, pss_mb

FIXTURE = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "awm1k"
NOW = dt.datetime(2025, 6, 1)


def generate(out: Path, count: int) -> None:
    """``count`` environments in AWM's files, round-robin over the fixture's scenarios."""
    out.mkdir(parents=True, exist_ok=True)
    sources = {f.stem: [json.loads(line) for line in f.read_text().splitlines() if line.strip()]
               for f in FIXTURE.glob("*.jsonl")}
    base = [normalize_scenario_name(r["name"]) for r in sources["gen_scenario"]]
    for name, records in sources.items():
        key = "name" if name == "gen_scenario" else "scenario"
        with (out / f"{name}.jsonl").open("w") as f:
            for i in range(count):
                scenario = base[i % len(base)]
                new = f"{scenario.rsplit('_', 1)[0]}_{i + 1000}"
                for record in records:
                    if normalize_scenario_name(str(record.get(key))) == scenario:
                        f.write(json.dumps({**record, key: new}) + "\n")


def du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def postgres_memory_mb(data_dir: Path) -> float:
    pid = int((data_dir / "postmaster.pid").read_text().split()[0])
    return round(pss_mb(pid) + sum(pss_mb(c) for c in children(pid)), 1)


async def serve(bundles: list[Any], database: Database) -> dict[str, Any]:
    t0 = time.perf_counter()
    async with LocalFleet(bundles, replicas=1, database=database, allow_ungated=True,
                          start_timeout_s=600) as fleet:
        ready_s = time.perf_counter() - t0
        pss = [pss_mb(h.pid) + sum(pss_mb(c) for c in children(h.pid)) for h in fleet.instances]
    return {"instances": len(bundles), "ready_s": round(ready_s, 1), "provision_s": round(fleet.provision_s, 1),
            "pss_mb_total": round(sum(pss)), "pss_mb_per_instance": round(sum(pss) / len(pss), 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=1000)
    parser.add_argument("--import-sample", type=int, default=40)
    parser.add_argument("--serve", type=int, default=64)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="awm-scale-"))
    result: dict[str, Any] = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                                          "python": platform.python_version()}}
    os.environ["AWM_HOME"] = str(work / "home")  # a fresh embedded cluster, measured alone
    database = Database.open()
    try:
        src = work / "awm-format"
        generate(src, args.envs)
        result["source_mb"] = round(du(src) / 2 ** 20, 1)

        # Import: a sample, timed, then the rest by copying the sample's bundles under new names
        # (the same bundles the importer would write: their cost is what the later steps measure).
        sample = sorted({json.loads(line)["name"] for line in (src / "gen_scenario.jsonl").open()})[:args.import_sample]
        cat = work / "catalog"
        timings = {}
        for jobs in (1, os.cpu_count() or 1):  # one at a time (the baseline), then in parallel
            shutil.rmtree(cat, ignore_errors=True)
            t0 = time.perf_counter()
            report = import_awm_dir(src, cat, admin_dsn=database.admin_dsn, now=NOW, envs=sample, jobs=jobs)
            timings[jobs] = time.perf_counter() - t0
        import_s = timings[os.cpu_count() or 1]
        totals = report.totals
        result["import"] = {"sampled_envs": len(sample), "jobs": os.cpu_count(),
                            "seconds_one_at_a_time": round(timings[1], 1), "seconds": round(import_s, 1),
                            "per_env_s": round(import_s / len(sample), 2),
                            "extrapolated_catalog_s": round(import_s / len(sample) * args.envs),
                            "tasks": totals["tasks"], "tasks_served": totals["tasks_served"]}
        made = {p.stem: p for p in cat.glob("*.json") if p.name != "report.json"}
        by_kind: dict[str, list[Path]] = {}
        for name, path in made.items():
            by_kind.setdefault(name.rsplit("_", 1)[0], []).append(path)
        for i in range(args.envs):
            name = f"{sorted(by_kind)[i % len(by_kind)]}_{i + 1000}"
            if name not in made:
                bundle = json.loads(by_kind[name.rsplit("_", 1)[0]][0].read_text())
                bundle["scenario"]["name"] = name
                # A seed of its own (one value differs), as every real environment has: templates
                # are shared between environments with identical snapshots, which would hide the cost.
                first = bundle["database"]["seed"][0]["rows"][0]
                key = next(k for k, v in first.items() if isinstance(v, str))
                first[key] = f"{first[key]} #{i}"
                (cat / f"{name}.json").write_text(json.dumps(bundle))
        (cat / "report.json").unlink(missing_ok=True)

        t0 = time.perf_counter()
        bundles = catalog.load(cat)
        result["load"] = {"environments": len(bundles), "seconds": round(time.perf_counter() - t0, 2)}
        index = json.dumps(catalog.index(bundles))
        archive = work / "catalog.tar.gz"
        with tarfile.open(archive, "w:gz") as tf:
            tf.add(cat, arcname="catalog")
        result["catalog"] = {"dir_mb": round(du(cat) / 2 ** 20, 1), "tar_gz_kb": round(archive.stat().st_size / 1024, 1),
                             "index_kb": round(len(index) / 1024, 1)}

        # Template databases: one per environment, all in the one server.
        before = du(database.embedded.data) if database.embedded else 0
        t0 = time.perf_counter()
        provision.ensure_templates(database.admin_dsn, bundles, jobs=os.cpu_count() or 1)
        templates_s = time.perf_counter() - t0
        result["templates"] = {"count": len(bundles), "seconds": round(templates_s, 1),
                               "per_template_ms": round(templates_s / len(bundles) * 1000, 1)}
        if database.embedded is not None:
            result["templates"]["disk_mb"] = round((du(database.embedded.data) - before) / 2 ** 20, 1)
            result["templates"]["postgres_pss_mb"] = postgres_memory_mb(database.embedded.data)
        t0 = time.perf_counter()
        for bundle in bundles[:50]:  # already there: what a restart pays per environment
            provision.ensure_template(database.admin_dsn, bundle)
        result["templates"]["existing_check_ms"] = round((time.perf_counter() - t0) / 50 * 1000, 2)

        result["serve"] = asyncio.run(serve(bundles[:args.serve], database))
    finally:
        database.close()
        shutil.rmtree(work, ignore_errors=True)
    print(json.dumps(result, indent=None if args.json else 2))


if __name__ == "__main__":
    main()
