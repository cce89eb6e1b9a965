"""The training subset: which environments and tasks of a catalog a run trains on.

The AWM paper trains on 526 environments and 3,315 tasks of AgentWorldModel-1K's 1,000 x 10: the
tasks whose verifiers can be believed, in environments with enough of them. This module makes that
choice explicit and reproducible: per task, the reasons it is left out (its verifier says
*complete* on the untouched snapshot - its verdicts carry no signal; the gates have not passed
for the verifier served); per environment, too few tasks left; then, if asked, a seeded choice of
``envs`` environments and at most ``max_tasks`` tasks of each. ``awm catalog select`` writes the
result as a catalog and records every choice in ``selection.json``.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from awm.bundle import EnvBundle
from awm.gates import gate_status, negative_failure


@dataclass(frozen=True)
class Filters:
    """What a task and an environment must be to be trained on."""

    gates: bool = True  # both gates passed for the verifier served (the negative one included)
    verifier_kind: str | None = None  # the kind served where a task has both (code | judge)
    min_tasks: int = 1  # an environment with fewer tasks left is left out
    max_tasks: int | None = None  # at most this many tasks of an environment (a seeded choice)
    envs: int | None = None  # at most this many environments (a seeded choice of the eligible)
    seed: int = 0


@dataclass
class Selection:
    bundles: list[EnvBundle] = field(default_factory=list)  # the chosen, with the chosen tasks only
    dropped_tasks: Counter[str] = field(default_factory=Counter)  # reason -> tasks
    dropped_envs: Counter[str] = field(default_factory=Counter)  # reason -> environments

    def record(self, filters: Filters, catalog: str) -> dict[str, Any]:
        return {"catalog": catalog, "filters": filters.__dict__,
                "environments": len(self.bundles), "tasks": sum(len(b.tasks) for b in self.bundles),
                "dropped_tasks": dict(self.dropped_tasks), "dropped_environments": dict(self.dropped_envs),
                "chosen": {b.name: [t.id for t in b.tasks] for b in self.bundles}}


def task_problem(bundle: EnvBundle, task: Any, filters: Filters) -> str | None:
    """Why ``task`` is not trained on, or None."""
    kind = task.select(filters.verifier_kind).kind  # type: ignore[arg-type]
    if negative_failure(bundle, task, kind) is not None:
        return "verifier says complete on the untouched snapshot"
    if filters.gates:
        ok, why = gate_status(bundle, task, filters.verifier_kind)
        if not ok:
            return "gates: " + why.split(":")[0]
    return None


def select(bundles: list[EnvBundle], filters: Filters) -> Selection:
    """The environments and tasks ``filters`` keep, in name order, each with its tasks in order."""
    out = Selection()
    eligible: list[EnvBundle] = []
    rng = random.Random(filters.seed)
    for bundle in sorted(bundles, key=lambda b: b.name):
        kept = []
        for task in bundle.tasks:
            problem = task_problem(bundle, task, filters)
            if problem is None:
                kept.append(task)
            else:
                out.dropped_tasks[problem] += 1
        if len(kept) < max(1, filters.min_tasks):
            out.dropped_envs[f"fewer than {max(1, filters.min_tasks)} tasks left"] += 1
            out.dropped_tasks["its environment left out"] += len(kept)
            continue
        if filters.max_tasks is not None and len(kept) > filters.max_tasks:
            chosen = set(t.id for t in rng.sample(kept, filters.max_tasks))
            out.dropped_tasks["over max_tasks"] += len(kept) - filters.max_tasks
            kept = [t for t in kept if t.id in chosen]
        eligible.append(bundle.model_copy(update={"tasks": kept}))
    if filters.envs is not None and len(eligible) > filters.envs:
        order = eligible[:]
        random.Random(filters.seed).shuffle(order)
        names = {b.name for b in order[:filters.envs]}
        out.dropped_envs["over envs"] += len(eligible) - filters.envs
        out.dropped_tasks["its environment left out"] += sum(len(b.tasks) for b in eligible if b.name not in names)
        eligible = [b for b in eligible if b.name in names]
    out.bundles = eligible
    return out
