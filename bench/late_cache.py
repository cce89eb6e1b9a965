"""How often a late fleet's GRPO group claims land on pods that keep their environment.

    .venv/bin/python -m bench.late_cache --json                  # the paper's step, cache 4 and 8
    .venv/bin/python -m bench.late_cache --pods 256 --envs 100 --cache 4

The operator plans a claim of environment E onto free pods that serve E, then onto free pods
that keep E among their cached environments, then onto any others (awm_operator.state.plan_late).
On a real fleet that turns a claim nobody told ahead into a reset instead of a new database
whenever E was served recently enough. How often that happens depends on the workload, so this
replays GRPO steps of the paper's shape (1,024 pods, 526 environments, 64 groups of 16 per step,
each step's environments drawn at random) through the operator's own state and planner, with
each pod modelled as the env server keeps its cache (the last ``--cache`` environments it served,
least recently used dropped). No pods and no network: the planner's choices only, not their
latency (bench/realnode.py --late measures that on real pods: a kept environment's claim is a
reset, ~16 ms claim to connected, a new one a clone, ~143 ms).

Each step claims all its groups at once (every pod is held until the step ends), then releases
them. Baseline in the same run: the same steps planned without the pods' caches (``holding``
not passed), the planner before this change. Prints, per planner and cache size, the share of
bound pods that served the environment already, kept it (a reset), or needed a new database,
over the steps after ``--warmup``.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from typing import Any

from awm.claims import ClaimRequest
from awm_operator.pods import PodInfo
from awm_operator.state import ClaimRecord, Fleet, plan_late


def simulate(pods: int, envs: int, groups: int, group_size: int, cache: int, steps: int, warmup: int,
             cache_aware: bool, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    names = [f"env{i:04d}" for i in range(envs)]
    fleet = Fleet("ns", "bench")
    kept: dict[str, list[str]] = {}  # pod -> what its env server keeps, least recently used first
    for i in range(pods):
        pod, env = f"p{i:05d}", names[i % envs]
        fleet.update_pod(PodInfo(pod, env, True, "Running", "10.0.0.1", False, 1, None, "http://10.0.0.1:8001"))
        kept[pod] = [env]
    counts = {"serving": 0, "cached": 0, "new": 0}
    plan_ms: list[float] = []
    for step in range(steps):
        chosen = rng.sample(names, groups)
        for g, env in enumerate(chosen):
            t0 = time.perf_counter()
            plan = plan_late(fleet.available, ClaimRequest(count=group_size, environment=env, group_size=group_size),
                             fleet.prepared, fleet.holding if cache_aware else None)
            plan_ms.append((time.perf_counter() - t0) * 1000)
            assert plan is not None, "every step fits the fleet"
            (group,) = plan
            fleet.assign(f"s{step}g{g}", ClaimRecord([group]))
            for pod in group:
                if step >= warmup:
                    kind = "serving" if fleet.env_of(pod) == env else "cached" if env in kept[pod] else "new"
                    counts[kind] += 1
                cached = [e for e in kept[pod] if e != env] + [env]
                kept[pod] = cached[-cache:]
                fleet.switched(pod, env, kept[pod] if cache_aware else None)
        for g in range(groups):
            fleet.unassign(f"s{step}g{g}")
    bound = sum(counts.values())
    plan_ms.sort()
    return {"share": {k: round(v / bound, 3) for k, v in counts.items()}, "bound": bound,
            "plan_p50_ms": round(plan_ms[len(plan_ms) // 2], 3), "plan_p99_ms": round(plan_ms[int(len(plan_ms) * 0.99)], 3)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pods", type=int, default=1024)
    ap.add_argument("--envs", type=int, default=526)
    ap.add_argument("--groups", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=16)
    ap.add_argument("--cache", type=int, nargs="+", default=[4, 8], help="environments each pod keeps")
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=20, help="steps not counted (the caches fill)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    if a.groups * a.group_size > a.pods:
        ap.error("a step needs groups x group size <= pods")
    out: dict[str, Any] = {"pods": a.pods, "environments": a.envs, "groups": a.groups, "group_size": a.group_size,
                           "steps": a.steps, "warmup": a.warmup, "seed": a.seed, "runs": {}}
    for cache in a.cache:
        for aware in (False, True):
            label = f"cache {cache}, " + ("keeps first (now)" if aware else "baseline: any free pod")
            out["runs"][label] = simulate(a.pods, a.envs, a.groups, a.group_size, cache, a.steps, a.warmup, aware, a.seed)
    print(json.dumps(out, indent=None if a.json else 1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
