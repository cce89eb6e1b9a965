"""The synthesis stages: scenario → task → db → sample → spec → env → verifier → solution.

Every stage reads the previous stages' JSONL files in the run directory and appends its own
(``gen_<stage>.jsonl``; the AWM names). An item that still fails validation after its repair
attempts goes to ``gen_<stage>.rejected.jsonl`` with its reasons, never into the stage output.
Re-running a stage skips every item already in either file.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Awaitable, Callable, Literal, TypeVar

from pydantic import BaseModel, Field

from awm import settings as awm_settings
from awm.bundle import EnvBundle, SeedTable, Task, Tool, ToolCall, Verifier
from awm.synth import prompts
from awm.synth import validate as check
from awm.synth.embed import Embedder, dedup
from awm.judge import JudgeSettings
from awm.llm import LLMBadOutput, LLMClient, LLMUnavailable
from awm.synth.store import StageOutput, read_jsonl

log = logging.getLogger("awm.synth")

STAGES = ["scenario", "task", "db", "sample", "spec", "env", "verifier", "solution"]
FILES = {"scenario": "gen_scenario.jsonl", "task": "gen_tasks.jsonl", "db": "gen_db.jsonl",
         "sample": "gen_sample.jsonl", "spec": "gen_spec.jsonl", "env": "gen_envs.jsonl",
         "verifier": "gen_verifier.jsonl", "solution": "gen_solution.jsonl"}

M = TypeVar("M", bound=BaseModel)


# -- what the model must return, per stage ------------------------------------------------------

class _Scenario(BaseModel):
    name: str
    description: str
    category: str = "other"


class _Scenarios(BaseModel):
    scenarios: list[_Scenario]


class Classification(BaseModel):
    """The reference system's CRUD-suitability classification of a scenario."""

    name: str
    categories: list[str] = Field(default_factory=list)
    suitability_score: int = Field(ge=1, le=10)
    suitability_level: Literal["high", "medium", "low"]
    reasoning: str = ""
    simulatable_features: list[str] = Field(default_factory=list)
    non_simulatable_features: list[str] = Field(default_factory=list)


class _Classifications(BaseModel):
    classifications: list[Classification]


class _Tasks(BaseModel):
    tasks: list[str] = Field(min_length=1)


class _Ddl(BaseModel):
    ddl: str = Field(min_length=10)


class _Seed(BaseModel):
    tables: list[SeedTable] = Field(min_length=1)


class _ToolSpec(BaseModel):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    description: str
    input_schema: dict[str, Any]
    example_arguments: dict[str, Any] = Field(default_factory=dict)


class _Spec(BaseModel):
    tools: list[_ToolSpec] = Field(min_length=1)


class _ToolCode(BaseModel):
    name: str
    code: str


class _Env(BaseModel):
    prelude: str = ""
    tools: list[_ToolCode]


class _Verifier(BaseModel):
    code: str


class _JudgeVerifier(BaseModel):
    code: str
    success_criteria: str = Field(min_length=1)
    failure_criteria: str = Field(min_length=1)


class _Solution(BaseModel):
    steps: list[ToolCall] = Field(min_length=1)
    final_answer: str | None = None


# -- the run --------------------------------------------------------------------------------

@dataclass
class Run:
    dir: Path
    llm: LLMClient
    admin_dsn: str
    attempts: int = 3
    num_tasks: int = 10
    on_progress: Callable[[str, int, int], None] = lambda stage, done, total: None
    report: dict[str, Any] = field(default_factory=dict)
    validation_slots: int = 4
    # "code": verifiers decide; "judge": they gather evidence and an LLM judge decides (served,
    # gated and solved with ``judge``, by default the synthesis endpoint itself).
    verifier_mode: str = "code"
    judge: JudgeSettings | None = None
    # Scenarios are classified for CRUD suitability; below this score they are not synthesised.
    classify: bool = True
    min_suitability: int = 5
    # Keep the best failed attempt of a tolerant stage (KEEP_BEST) for the next stages; never
    # into the catalog.
    keep_best: bool = False

    def __post_init__(self) -> None:
        # LLM calls are bounded by the client; validations start databases and processes, so
        # they get their own, smaller bound.
        self.slots = asyncio.Semaphore(self.validation_slots)
        if self.verifier_mode not in ("code", "judge"):
            raise ValueError("verifier mode must be code or judge")
        if self.verifier_mode == "judge" and self.judge is None:
            settings = self.llm.settings
            key_env = (awm_settings.names.AWM_LLM_API_KEY if awm_settings.var.AWM_LLM_API_KEY.is_set()
                       else "OPENAI_API_KEY")
            self.judge = JudgeSettings(base_url=settings.base_url, model=settings.model, api_key_env=key_env)

    def path(self, stage: str) -> Path:
        return self.dir / FILES[stage]

    def output(self, stage: str, key: Callable[[dict[str, Any]], str]) -> tuple[StageOutput, StageOutput]:
        good = StageOutput(self.path(stage), key)
        rejected = StageOutput(self.dir / FILES[stage].replace(".jsonl", ".rejected.jsonl"), key)
        return good, rejected

    def load(self, stage: str) -> dict[str, dict[str, Any]]:
        key = "name" if stage == "scenario" else "scenario"
        return {r[key]: r for r in read_jsonl(self.path(stage))}

    def note(self, stage: str, outcome: str, item: str, reasons: list[str] | None = None) -> None:
        entry = self.report.setdefault(stage, {"kept": 0, "rejected": 0, "rejections": []})
        if outcome == "kept":
            entry["kept"] += 1
        elif outcome == "kept-unvalidated":
            entry["unvalidated"] = entry.get("unvalidated", 0) + 1
            entry["rejections"].append({"item": item, "reasons": ["kept unvalidated: " + r for r in (reasons or [])[:5]]})
        else:
            entry["rejected"] += 1
            entry["rejections"].append({"item": item, "reasons": (reasons or [])[:5]})


class _Summary(BaseModel):
    guidance: str = Field(min_length=1)


SUMMARY_ABOVE = 4000  # characters of errors fed back verbatim; longer ones are summarised first
MAX_ERRORS = 64_000  # what the summariser reads at most (the reference's cap)


async def feedback(run: Run, errors: list[str]) -> str:
    """What the next attempt is told: the errors as they are when short; when long (a stack of
    SQL errors, a huge traceback), a summary by the LLM - the reference system's step - and, if
    the summariser fails, the errors cut to size. Never stops the run."""
    if not errors:
        return ""
    text = "\n".join(errors)
    if len(text) <= SUMMARY_ABOVE:
        return prompts.feedback(errors)
    try:
        summary = await run.llm.structured("summary", prompts.SUMMARY, prompts.summary_user(errors)[:MAX_ERRORS],
                                           _Summary, attempts=2, max_tokens=1024)
        return prompts.feedback([f"(summary of {len(errors)} error(s), {len(text)} characters) {summary.guidance}"])
    except (LLMBadOutput, LLMUnavailable):
        return prompts.feedback([e[:SUMMARY_ABOVE // max(len(errors), 1)] for e in errors])


async def _repair_loop(run: Run, stage: str, system: str, user: str, model: type[M],
                       validate: Callable[[M], Awaitable[list[str]]]) -> tuple[M | None, list[str]]:
    """Generate, execute, feed the errors back; at most ``run.attempts`` generations. With
    ``run.keep_best`` (for the stages in :data:`KEEP_BEST`), the attempt with the fewest errors is
    returned when none passes, with its errors: it is recorded ``unvalidated`` so later stages can
    go on from it, and :func:`assemble` keeps it out of the catalog."""
    errors: list[str] = []
    best: tuple[M, list[str]] | None = None
    for _ in range(run.attempts):
        try:
            candidate = await run.llm.structured(stage, system, user + await feedback(run, errors),
                                                 model)
        except LLMBadOutput as exc:
            errors = [str(exc)]
            continue
        try:
            errors = await validate(candidate)
        except (LLMUnavailable, asyncio.CancelledError):
            raise
        except Exception as exc:  # noqa: BLE001 - generated input that breaks a check fails the item, not the run
            log.warning("%s: validating a candidate failed", stage, exc_info=True)
            errors = [f"validation failed: {type(exc).__name__}: {str(exc)[:500]}"]
        if not errors:
            return candidate, []
        if best is None or len(errors) < len(best[1]):
            best = (candidate, errors)
    if run.keep_best and stage in KEEP_BEST and best is not None:
        return best
    return None, errors


# Stages whose best failed attempt may carry the run on (the reference system writes failed rows
# and goes on); an unvalidated record never reaches the catalog.
KEEP_BEST = ("task", "db", "sample", "spec", "env")


def normalise_name(name: str) -> str:
    return re.sub(r"_+", "_", re.sub(r"[^a-z0-9_]", "_", name.lower())).strip("_")[:60] or "scenario"


async def _each(items: list[Any], fn: Callable[[Any], Awaitable[None]], run: Run, stage: str) -> None:
    done = 0

    async def one(item: Any) -> None:
        nonlocal done
        await fn(item)
        done += 1
        run.on_progress(stage, done, len(items))

    run.on_progress(stage, 0, len(items))
    await asyncio.gather(*(one(i) for i in items))


# -- stages -----------------------------------------------------------------------------------

async def classify(run: Run, scenarios: list[dict[str, Any]], rejected: StageOutput) -> list[dict[str, Any]]:
    """The scenarios worth synthesising, with their classification; the others are recorded as
    rejected with the reason (a classifier that fails keeps them unclassified: it never blocks)."""
    if not run.classify or not scenarios:
        return scenarios
    found: dict[str, Classification] = {}
    for start in range(0, len(scenarios), 10):
        batch = scenarios[start:start + 10]
        try:
            reply = await run.llm.structured("classify", prompts.CLASSIFY, prompts.classify_user(batch),
                                             _Classifications, max_tokens=8000)
        except LLMBadOutput as exc:
            run.note("classify", "rejected", f"batch {start // 10}", [str(exc)])
            continue
        found.update({normalise_name(c.name): c for c in reply.classifications})
    keep = []
    for scenario in scenarios:
        c = found.get(scenario["name"])
        if c is not None and c.suitability_score < run.min_suitability:
            reason = f"not CRUD-simulatable enough (score {c.suitability_score}): {c.reasoning}"
            rejected.append(dict(scenario, classification=c.model_dump(exclude={"name"}), errors=[reason]))
            run.note("scenario", "rejected", scenario["name"], [reason])
            continue
        keep.append(dict(scenario, classification=c.model_dump(exclude={"name"})) if c else scenario)
    return keep


def _examples(kept: list[dict[str, Any]], count: int = 8) -> list[dict[str, Any]]:
    """Few-shot examples: the most CRUD-suitable scenarios first (the reference uses high ones)."""
    return sorted(kept, key=lambda k: -(k.get("classification") or {}).get("suitability_score", 5))[:count]


async def stage_scenario(run: Run, seeds: list[dict[str, Any]], target: int, embedder: Embedder,
                         threshold: float = 0.85, max_per_category: int = 80, batch: int = 10,
                         max_rounds: int = 50) -> None:
    """Seeds plus generated scenarios up to ``target`` in all, deduplicated by embedding (against
    the seeds and each other) and capped per category."""
    out, rejected = run.output("scenario", lambda r: r["name"])
    pool = [{"name": normalise_name(s["name"]), "description": s["description"],
             "category": s.get("category", "seed"), "seed": True} for s in seeds]
    for seed in await classify(run, [s for s in pool if s["name"] not in out and s["name"] not in rejected],
                               rejected):
        out.append(seed)
    kept = list(out.records())
    vectors = await embedder.embed([f"{s['name']}: {s['description']}" for s in kept])
    rounds = 0
    while len(kept) < target and rounds < max_rounds:
        rounds += 1
        try:
            reply = await run.llm.structured("scenario", prompts.SCENARIO,
                                             prompts.scenario_user(batch, _examples(kept), [k["name"] for k in kept]),
                                             _Scenarios)
        except LLMBadOutput as exc:
            run.note("scenario", "rejected", f"round {rounds}", [str(exc)])
            continue
        candidates = [{"name": normalise_name(s.name), "description": s.description,
                       "category": normalise_name(s.category)} for s in reply.scenarios]
        names = {k["name"] for k in kept}
        fresh = [c for c in candidates if c["name"] not in names]
        for c in candidates:
            if c not in fresh:
                run.note("scenario", "rejected", c["name"], ["duplicate name"])
        new_vectors = await embedder.embed([f"{c['name']}: {c['description']}" for c in fresh]) if fresh else []
        counts: dict[str, int] = {}
        for k in kept:
            counts[k.get("category", "")] = counts.get(k.get("category", ""), 0) + 1
        accepted, reasons = dedup(fresh, new_vectors, vectors, threshold, max_per_category, counts)
        for c, why in reasons.items():
            run.note("scenario", "rejected", c, [why])
        suitable = {c["name"]: c for c in await classify(run, [c for c, _ in accepted], rejected)}
        accepted = [(suitable[c["name"]], v) for c, v in accepted if c["name"] in suitable]
        for c, v in accepted:
            if len(kept) >= target:
                break
            out.append(c)
            kept.append(c)
            vectors.append(v)
            run.note("scenario", "kept", c["name"])
        run.on_progress("scenario", len(kept), target)


async def stage_task(run: Run) -> None:
    scenarios = list(run.load("scenario").values())
    out, rejected = run.output("task", lambda r: r["scenario"])

    async def one(s: dict[str, Any]) -> None:
        if s["name"] in out or s["name"] in rejected:
            return

        async def validate(reply: _Tasks) -> list[str]:
            tasks = [t.strip() for t in reply.tasks if t.strip()]
            if len(set(tasks)) < run.num_tasks:
                return [f"need {run.num_tasks} distinct tasks, got {len(set(tasks))}"]
            return []

        reply, errors = await _repair_loop(run, "task", prompts.TASK,
                                           prompts.task_user(s["name"], s["description"], run.num_tasks), _Tasks,
                                           validate)
        # a best attempt carried on by --keep-best is marked unvalidated, as every stage's is
        tasks = list(dict.fromkeys(t.strip() for t in reply.tasks if t.strip()))[: run.num_tasks] if reply else []
        _record(run, "task", out, rejected, s["name"], {"scenario": s["name"], "tasks": tasks} if reply else None,
                errors)

    await _each(scenarios, one, run, "task")


async def stage_db(run: Run) -> None:
    scenarios, tasks = run.load("scenario"), run.load("task")
    out, rejected = run.output("db", lambda r: r["scenario"])

    async def one(name: str) -> None:
        if name in out or name in rejected:
            return
        s = scenarios[name]

        async def validate(reply: _Ddl) -> list[str]:
            async with run.slots:
                return await asyncio.to_thread(check.check_ddl, run.admin_dsn, reply.ddl)

        reply, errors = await _repair_loop(run, "db", prompts.DB,
                                           prompts.db_user(name, s["description"], tasks[name]["tasks"]), _Ddl,
                                           validate)
        _record(run, "db", out, rejected, name, {"scenario": name, "ddl": reply.ddl} if reply else None, errors)

    await _each(list(tasks), one, run, "db")


async def stage_sample(run: Run) -> None:
    scenarios, tasks, dbs = run.load("scenario"), run.load("task"), run.load("db")
    out, rejected = run.output("sample", lambda r: r["scenario"])

    async def one(name: str) -> None:
        if name in out or name in rejected:
            return
        ddl = dbs[name]["ddl"]

        async def validate(reply: _Seed) -> list[str]:
            async with run.slots:
                return await asyncio.to_thread(check.check_seed, run.admin_dsn, ddl, reply.tables)

        reply, errors = await _repair_loop(
            run, "sample", prompts.SAMPLE,
            prompts.sample_user(name, scenarios[name]["description"], ddl, tasks[name]["tasks"]), _Seed, validate)
        record = {"scenario": name, "seed": [t.model_dump(mode="json") for t in reply.tables]} if reply else None
        _record(run, "sample", out, rejected, name, record, errors)

    await _each(list(dbs), one, run, "sample")


async def stage_spec(run: Run) -> None:
    scenarios, tasks, dbs, samples = run.load("scenario"), run.load("task"), run.load("db"), run.load("sample")
    out, rejected = run.output("spec", lambda r: r["scenario"])

    async def one(name: str) -> None:
        if name in out or name in rejected:
            return

        async def validate(reply: _Spec) -> list[str]:
            errors = []
            names = [t.name for t in reply.tools]
            if len(set(names)) != len(names):
                errors.append("tool names must be unique")
            for t in reply.tools:
                try:
                    Tool(name=t.name, description=t.description, input_schema=t.input_schema, code="")
                except ValueError as exc:
                    errors.append(f"{t.name}: {exc}")
            return errors

        reply, errors = await _repair_loop(
            run, "spec", prompts.SPEC,
            prompts.spec_user(name, scenarios[name]["description"], dbs[name]["ddl"], tasks[name]["tasks"]), _Spec,
            validate)
        record = {"scenario": name, "tools": [t.model_dump() for t in reply.tools]} if reply else None
        _record(run, "spec", out, rejected, name, record, errors)

    await _each(list(samples), one, run, "spec")


async def stage_env(run: Run) -> None:
    """Tool code, loaded into the real runtime and called once per tool with example arguments."""
    scenarios, dbs, samples, specs = run.load("scenario"), run.load("db"), run.load("sample"), run.load("spec")
    out, rejected = run.output("env", lambda r: r["scenario"])

    async def one(name: str) -> None:
        if name in out or name in rejected:
            return
        tools = specs[name]["tools"]

        async def validate(reply: _Env) -> list[str]:
            code = {t.name: t.code for t in reply.tools}
            missing = [t["name"] for t in tools if t["name"] not in code]
            if missing:
                return [f"missing tools: {', '.join(missing)}"]
            try:
                bundle = _bundle(scenarios[name], dbs[name], samples[name], tools, reply.prelude, code)
            except ValueError as exc:
                return [str(exc)]
            async with run.slots:
                return await check.check_tools(run.admin_dsn, bundle,
                                               {t["name"]: t["example_arguments"] for t in tools})

        reply, errors = await _repair_loop(run, "env", prompts.ENV, prompts.env_user(name, dbs[name]["ddl"], tools),
                                           _Env, validate)
        record = ({"scenario": name, "prelude": reply.prelude, "tools": [t.model_dump() for t in reply.tools]}
                  if reply else None)
        _record(run, "env", out, rejected, name, record, errors)

    await _each(list(specs), one, run, "env")


def _verifier_of(reply: _Verifier | _JudgeVerifier) -> Verifier:
    if isinstance(reply, _JudgeVerifier):
        return Verifier(kind="judge", code=reply.code, entrypoint="verify", success_criteria=reply.success_criteria,
                        failure_criteria=reply.failure_criteria)
    return Verifier(code=reply.code, entrypoint="verify")


async def stage_verifier(run: Run) -> None:
    """One verifier per task, kept only if it says *not complete* on the untouched snapshot."""
    scenarios, tasks, dbs, samples = run.load("scenario"), run.load("task"), run.load("db"), run.load("sample")
    specs, envs = run.load("spec"), run.load("env")
    out, rejected = run.output("verifier", lambda r: f"{r['scenario']}/{r['task_idx']}")

    async def one(name: str) -> None:
        pending = [i for i in range(len(tasks[name]["tasks"]))
                   if f"{name}/{i}" not in out and f"{name}/{i}" not in rejected]
        if not pending:
            return
        base = _bundle(scenarios[name], dbs[name], samples[name], specs[name]["tools"], envs[name]["prelude"],
                       {t["name"]: t["code"] for t in envs[name]["tools"]})
        excerpt = _seed_excerpt(samples[name]["seed"])

        async def per_task(i: int) -> None:
            text = tasks[name]["tasks"][i]
            judged = run.verifier_mode == "judge"

            async def validate(reply: _Verifier | _JudgeVerifier) -> list[str]:
                if not re.search(r"\bdef\s+verify\s*\(", reply.code):
                    return ["the code must define verify(final, initial, answer)"]
                task = Task(id=f"t{i}", instruction=text, verifier=_verifier_of(reply), solution=[])
                bundle = base.model_copy(update={"tasks": [task]})
                # A judge verifier's negative gate runs the judge too: on the untouched state it
                # must not be judged complete, and its evidence must be JSON.
                async with run.slots, check.served(run.admin_dsn, bundle, judge=run.judge) as (control, _):
                    return (await check.check_verifiers_untouched(control, [task])).get(task.id, [])

            reply, errors = await _repair_loop(run, "verifier", prompts.VERIFIER_JUDGE if judged else prompts.VERIFIER,
                                               prompts.verifier_user(name, dbs[name]["ddl"], excerpt, text),
                                               _JudgeVerifier if judged else _Verifier, validate)  # type: ignore[arg-type]
            record = {"scenario": name, "task_idx": i, "task": text}
            verification = _verifier_of(reply).model_dump(exclude_defaults=True) if reply else None
            if verification is not None:
                verification.setdefault("entrypoint", "verify")
            _record(run, "verifier", out, rejected, f"{name}/{i}",
                    dict(record, verification=verification) if reply else None, errors, record)

        for i in pending:  # one scenario's verifiers share its template: run them in order
            await per_task(i)

    await _each(list(envs), one, run, "verifier")


async def stage_solution(run: Run) -> None:
    """Reference solutions, kept only if replaying them through MCP makes the verifier say
    complete. Each round serves the scenario with every pending candidate at once."""
    scenarios, dbs, samples = run.load("scenario"), run.load("db"), run.load("sample")
    specs, envs = run.load("spec"), run.load("env")
    verifiers = [r for r in read_jsonl(run.path("verifier"))]
    out, rejected = run.output("solution", lambda r: f"{r['scenario']}/{r['task_idx']}")
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for v in verifiers:
        by_scenario.setdefault(v["scenario"], []).append(v)

    async def one(name: str) -> None:
        pending = {v["task_idx"]: v for v in by_scenario[name]
                   if f"{name}/{v['task_idx']}" not in out and f"{name}/{v['task_idx']}" not in rejected}
        if not pending:
            return
        base = _bundle(scenarios[name], dbs[name], samples[name], specs[name]["tools"], envs[name]["prelude"],
                       {t["name"]: t["code"] for t in envs[name]["tools"]})
        excerpt = _seed_excerpt(samples[name]["seed"])
        errors: dict[int, list[str]] = {i: [] for i in pending}
        for _ in range(run.attempts):
            candidates: dict[int, _Solution] = {}
            for i, v in pending.items():
                try:
                    candidates[i] = await run.llm.structured(
                        "solution", prompts.SOLUTION,
                        prompts.solution_user(name, specs[name]["tools"], excerpt, v["task"])
                        + await feedback(run, errors[i]), _Solution)
                except LLMBadOutput as exc:
                    errors[i] = [str(exc)]
            tasks = []
            for i, sol in candidates.items():
                unknown = [s.tool for s in sol.steps if s.tool not in {t.name for t in base.tools}]
                if unknown:
                    errors[i] = [f"unknown tools {unknown}"]
                    continue
                tasks.append(Task(id=f"t{i}", instruction=pending[i]["task"],
                                  verifier=Verifier(**pending[i]["verification"]),
                                  solution=sol.steps, final_answer=sol.final_answer))
            if tasks:
                bundle = base.model_copy(update={"tasks": tasks})
                async with run.slots:
                    failures = await check.check_solutions_through_mcp(run.admin_dsn, bundle, run.judge)
                for task in tasks:
                    i = int(task.id[1:])
                    if task.id in failures:
                        errors[i] = failures[task.id]
                    else:
                        sol = candidates[i]
                        _record(run, "solution", out, rejected, f"{name}/{i}",
                                {"scenario": name, "task_idx": i, "task": pending.pop(i)["task"],
                                 "solution": [s.model_dump() for s in sol.steps], "final_answer": sol.final_answer},
                                [])
            if not pending:
                return
        for i, v in pending.items():
            _record(run, "solution", out, rejected, f"{name}/{i}", None, errors[i],
                    {"scenario": name, "task_idx": i, "task": v["task"]})

    await _each(list(by_scenario), one, run, "solution")


# -- assembling the catalog ------------------------------------------------------------------

def assemble(run: Run, catalog_dir: Path) -> list[EnvBundle]:
    """Bundles of every scenario that made it through; tasks without a verified solution are
    dropped (and were reported by their stage)."""
    scenarios, dbs, samples = run.load("scenario"), run.load("db"), run.load("sample")
    specs, envs = run.load("spec"), run.load("env")
    solutions: dict[str, list[dict[str, Any]]] = {}
    for r in read_jsonl(run.path("solution")) if run.path("solution").exists() else []:
        solutions.setdefault(r["scenario"], []).append(r)
    verifiers = {f"{r['scenario']}/{r['task_idx']}": r for r in read_jsonl(run.path("verifier"))}
    catalog_dir.mkdir(parents=True, exist_ok=True)
    bundles = []
    for name, env in envs.items():
        chain = {"task": run.load("task").get(name), "db": dbs.get(name), "sample": samples.get(name),
                 "spec": specs.get(name), "env": env}
        unvalidated = [stage for stage, record in chain.items() if record and record.get("unvalidated")]
        if unvalidated:
            run.note("assemble", "rejected", name, [f"built on unvalidated {', '.join(unvalidated)} (keep-best)"])
            continue
        base = _bundle(scenarios[name], dbs[name], samples[name], specs[name]["tools"], env["prelude"],
                       {t["name"]: t["code"] for t in env["tools"]})
        tasks = [Task(id=f"task_{s['task_idx']}", instruction=s["task"],
                      verifier=Verifier(**verifiers[f"{name}/{s['task_idx']}"]["verification"]),
                      solution=s["solution"], final_answer=s.get("final_answer"))
                 for s in sorted(solutions.get(name, []), key=lambda s: s["task_idx"])]
        if not tasks:
            continue
        bundle = base.model_copy(update={"tasks": tasks})
        bundle = EnvBundle.model_validate_json(bundle.model_dump_json())  # re-validate the whole
        (catalog_dir / f"{name}.json").write_text(bundle.model_dump_json(indent=1))
        bundles.append(bundle)
    return bundles


def _bundle(scenario: dict[str, Any], db: dict[str, Any], sample: dict[str, Any], tools: list[dict[str, Any]],
            prelude: str, code: dict[str, str]) -> EnvBundle:
    return EnvBundle(
        scenario={"name": scenario["name"], "description": scenario["description"]},
        database={"ddl": db["ddl"], "seed": sample["seed"]},
        tool_prelude=prelude,
        tools=[Tool(name=t["name"], description=t["description"], input_schema=t["input_schema"],
                    code=code.get(t["name"], "")) for t in tools],
        tasks=[],
    )


def _seed_excerpt(seed: list[dict[str, Any]], rows_per_table: int = 8) -> str:
    return "\n".join(f"{t['table']}: {json.dumps(t['rows'][:rows_per_table], default=str)}" for t in seed)


def _record(run: Run, stage: str, out: StageOutput, rejected: StageOutput, item: str,
            record: dict[str, Any] | None, errors: list[str], base: dict[str, Any] | None = None) -> None:
    if record is not None and errors:  # keep-best: carried on, never into the catalog
        out.append(dict(record, unvalidated=errors[:20]))
        run.note(stage, "kept-unvalidated", item, errors)
    elif record is not None:
        out.append(record)
        run.note(stage, "kept", item)
    else:
        rejected.append(dict(base or {"scenario": item}, errors=errors))
        run.note(stage, "rejected", item, errors)
