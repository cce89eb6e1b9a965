"""Soak and chaos on a local fleet: episodes back to back under injected faults, every outcome
accounted for, every completed episode's database checked against a quiet replay.

    python -m bench.soak --duration 600 --seed 1 --instances 4 --clients 4 [--json]
                         [--catalogs starter,fixtures] [--deadline 15] [--fault-every 20]
                         [--faults env_kill,env_stop,pg_kill,pg_stop,client_vanish,half_open]

What runs (all of it real processes on this machine):

* its own embedded PostgreSQL cluster (in a temporary directory: it is killed and hung on
  purpose, so never the user's or another job's), and a late-binding :class:`awm.fleet.LocalFleet`
  of ``--instances`` env servers on it (what ``awm serve`` runs) over a catalog of several
  environments (the starter catalog's three and the test fixtures ``lamps`` and ``notes``;
  ``awm1k``: the AWM-1K fixture imported as bench/tool_latency.py does);
* ``--clients`` concurrent clients, each running episodes back to back through the product's own
  client path: :class:`awm.episode.sources.PoolSource` (claims; a claim of an environment no free
  instance serves switches one) and :class:`awm.episode.session.EpisodeSession` (reset, tool
  calls, verification, masking). The policy is a stand-in: each episode is a *script*, a seeded
  random sequence of 3-10 real tool calls of its environment (calibrated as bench/tool_latency.py
  calibrates them: the reference solutions' calls and the tools' schema examples, kept if the
  server runs them), then its database's changes are read (``GET /diff?rows=N``) and the episode
  is verified;
* faults on a seeded schedule (``--fault-every`` seconds apart, each round of faults a seeded
  shuffle of ``--faults``, none in the last ``--quiet-tail`` seconds so that every fault can
  recover), using the real processes' pids:

  - ``env_kill``: an env server SIGKILLed (the fleet restarts it on its ports);
  - ``env_stop``: an env server SIGSTOPped, SIGCONTed after 2 s to ``--deadline`` + 10 s (hung,
    not dead: its clients' requests pass their deadline);
  - ``pg_kill``: the PostgreSQL server killed (SIGKILL to the postmaster and every backend, as
    an OOM kill of its cgroup would), started again after 1-5 s (crash recovery);
  - ``pg_stop``: every PostgreSQL process SIGSTOPped, SIGCONTed after 2 s to ``--deadline`` + 10 s;
  - ``client_vanish``: a client in the middle of an episode cancelled and its connections dropped
    without ending the episode or its MCP session (a replacement client starts);
  - ``half_open``: connections to an env server's MCP and control ports that never finish: some
    send nothing, some part of a request head, some a head and part of its body; and MCP
    sessions opened and never ended. How long the server holds each is recorded.

What it records, per interval (``--interval``) and in total:

* episodes completed, masked (by the stage that failed - claim, reset, call, diff, verify - the
  error class of :mod:`awm.errorclass` and what the transport said, e.g. ``deadline``), abandoned
  (by ``client_vanish``, on purpose) and **lost** (an episode with no outcome: a client that raised
  something unexpected, or still running when the soak ended); claims that failed;
* every reset checked (``POST /reset {"verify": true}``: a checksum of every table and sequence
  against the snapshot): **dirty** = a reset that was not proven pristine or had to repair;
* **cross-episode**: every script's result was computed before the soak, twice, on two instances,
  one call at a time and nothing else running (a script whose two replays differ is left out, and
  reported); every completed episode's tool results and final database changes are compared with
  it (timestamps of the episode's own "now" normalised), and so are the results a masked episode
  saw before its failure: any difference is another episode's state seen, a leak;
* **leaked**: claims still held (or instances never returned to the pool) after every client has
  ended; databases the provisioner made that no live instance holds; processes of a killed env
  server still alive; Postgres backends of no live instance; connections an env server still
  holds from a half-open client;
* instances replaced (restarts by the fleet), and the recovery time of every fault: from its
  injection to the next episode that started after it and completed, on its instance (or the
  fleet, and every instance, for the Postgres faults);
* the longest episode (a hung server must cost an episode its deadline, never hang a client).

The report is one JSON object (``--json``; otherwise progress per interval and a summary). Anything
of the expected zeros that is not zero (lost, dirty, leaked, cross-episode, an unrecovered fault, a
failed claim, an episode past ``--deadline`` + 60 s) is printed loudly on stderr and the process
exits 1.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import logging
import os
import random
import re
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from awm.errorclass import ENVIRONMENT_FAULTS
from bench.runtime import children as descendants

FAULT_KINDS = ("env_kill", "env_stop", "pg_kill", "pg_stop", "client_vanish", "half_open")
ENV_FAULT_CLASSES = tuple(c.value for c in ENVIRONMENT_FAULTS)  # a call the environment failed: masks
DIFF_ROWS = 500
FIXTURES = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
# A timestamp in a tool's answer or a changed row: ``now()`` of the episode's transaction differs
# between an episode and its replay, so one of today's (yesterday's, tomorrow's) is normalised.
TIMESTAMP = re.compile(r"\d{4}-\d{2}-\d{2}(?:[T ]\d{2}:\d{2}:\d{2}(?:\.\d+)?(?:Z|[+-]\d{2}(?::?\d{2})?)?)?")


def now() -> float:
    return time.monotonic()


def pct(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(ordered) - 1)
    return round(ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo), 3)



def alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


# -- scripts and their replay ----------------------------------------------------------------------


@dataclass
class Script:
    """One episode's stand-in policy: a task and its tool calls."""

    env: str
    index: int
    task: str
    calls: list[tuple[str, dict[str, Any]]]
    truth: list[Any] | None = None  # per call: its normalised result; then the normalised diff
    excluded: str | None = None  # why it is not used (its two replays differed)

    @property
    def inserts(self) -> bool:
        """Its replay inserted rows (a second run of it would insert more)."""
        return bool(self.truth) and any(t["inserted"] for t in self.truth[-1]["rows"].values())  # type: ignore[index]

    @property
    def key(self) -> str:
        return f"{self.env}#{self.index}"


class Normaliser:
    """Timestamps of the run's dates are the episode's own ``now()``: replaced by a marker."""

    def __init__(self) -> None:
        self.start = dt.datetime.now(dt.timezone.utc).date()

    def dates(self) -> set[str]:
        today = dt.datetime.now(dt.timezone.utc).date()
        days = (today - self.start).days + 3
        return {str(self.start + dt.timedelta(days=d)) for d in range(-1, days)}

    def text(self, text: str) -> str:
        dates = self.dates()
        return TIMESTAMP.sub(lambda m: "<now>" if m.group(0)[:10] in dates else m.group(0), text)

    def diff(self, answer: dict[str, Any]) -> Any:
        rows = answer.get("rows") or {}
        out = {}
        for table, entry in sorted(rows.items()):
            canon = {k: sorted(self.text(json.dumps(r, sort_keys=True, default=str)) for r in entry.get(k, []))
                     for k in ("inserted", "updated", "deleted")}
            out[table] = {**canon, "truncated": bool(entry.get("truncated"))}
        return {"tables": answer.get("tables"), "rows": out}


def call_record(norm: Normaliser, out: Any) -> list[Any]:
    return [bool(out.is_error), str(out.error_kind) if out.error_kind else None, norm.text(out.text)]


def digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True, default=str).encode()).hexdigest()[:16]


# -- the run -----------------------------------------------------------------------------------------


@dataclass
class Episode:
    id: int
    client: int
    script: Script
    t_claim: float
    instance: str | None = None
    t_start: float | None = None  # claimed
    t_end: float | None = None
    stage: str = "claim"
    outcome: str | None = None  # completed | masked | abandoned | lost | claim_failed
    leak_injected: bool = False  # --inject-leak: its mismatch is the check's negative control


@dataclass
class Fault:
    kind: str
    target: str  # an instance's name, "postgres", or "client <n>"
    instance: str | None  # the instance whose next good episode recovers it (None: the fleet's)
    t: float  # injected (seconds since the soak started)
    detail: dict[str, Any] = field(default_factory=dict)
    cleared: float | None = None  # SIGCONT sent, server started again...
    recovered_s: float | None = None
    all_instances_s: float | None = None
    instances_ok: set[str] = field(default_factory=set)


class WarningCounter(logging.Handler):
    """The product's own warnings in this process (the provisioner, the pool, the fleet), counted
    by their text with names and numbers taken out: what went wrong under the faults, in short."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.counts: Counter[str] = Counter()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001
            return
        if record.name == "awm.fleet" and text.startswith("["):
            key = "awm.fleet: an env server's stderr line"
        else:
            key = f"{record.name}: " + re.sub(r"awm_i_\w+|\d+(\.\d+)?|/\S+", "#", text.splitlines()[0])[:140]
        self.counts[key] += 1


class Client:
    def __init__(self, cid: int) -> None:
        self.cid = cid
        self.generation = 0
        self.task: asyncio.Task[None] | None = None
        self.episode: Episode | None = None
        self.vanishing = False


class Soak:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.norm = Normaliser()
        self.t0 = now()
        self.stop = asyncio.Event()
        self.episodes_started = 0
        self.open: dict[int, Episode] = {}
        self.counts: Counter[str] = Counter()
        self.masked_by_reason: Counter[str] = Counter()
        self.masked_by_detail: Counter[str] = Counter()
        self.mismatches: list[dict[str, Any]] = []
        self.dirty: list[dict[str, Any]] = []
        self.lost: list[dict[str, Any]] = []
        self.claim_failures: list[str] = []
        self.episode_s: list[float] = []
        self.faults: list[Fault] = []
        self.active_targets: set[str] = set()
        self.pg_lock = asyncio.Lock()
        self.half_open: list[dict[str, Any]] = []
        self.orphan_checks: list[dict[str, Any]] = []
        self.intervals: list[dict[str, Any]] = []
        self.clients: list[Client] = []
        self.scripts: list[Script] = []
        self.calls_by_env: dict[str, list[tuple[str, dict[str, Any]]]] = {}
        self.tasks_by_env: dict[str, list[str]] = {}
        self._bg: set[asyncio.Task[Any]] = set()
        self.notes: list[str] = []
        self.leaks_left = args.inject_leak
        self.warnings = WarningCounter()
        shown = logging.StreamHandler(sys.stderr)
        shown.setLevel(logging.WARNING)
        shown.addFilter(lambda r: not r.getMessage().startswith("["))  # an env server's own stderr: counted only
        for name in ("awm.provisioner", "awm.episode.sources", "awm.fleet"):
            logging.getLogger(name).addHandler(self.warnings)
            if not args.quiet:
                logging.getLogger(name).addHandler(shown)

    def elapsed(self) -> float:
        return now() - self.t0

    def spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._bg.add(task)
        task.add_done_callback(self._bg.discard)
        return task

    def log(self, message: str) -> None:
        if not self.args.quiet:
            print(f"[soak {self.elapsed():7.1f}s] {message}", file=sys.stderr, flush=True)

    # -- setup ---------------------------------------------------------------------------------------

    async def setup(self) -> None:
        from awm.fleet import Database, LocalFleet
        from awm.postgres import provision
        from awm.postgres.server import EmbeddedPostgres

        self.workdir = Path(tempfile.mkdtemp(prefix="awm-soak-"))
        self.pg = EmbeddedPostgres(self.workdir / "postgres")
        await asyncio.to_thread(self.pg.start)
        await asyncio.to_thread(provision.harden_cluster, self.pg.admin_dsn())
        self.database = Database(self.pg.admin_dsn(), self.pg, True)
        self.bundles = await self.load_catalogs()
        for bundle in self.bundles:
            tasks = [t.id for t in bundle.tasks if t.verifier.kind == "code" and t.solution]
            if tasks:
                self.tasks_by_env[bundle.name] = tasks
        self.bundles = [b for b in self.bundles if b.name in self.tasks_by_env]
        self.fleet = LocalFleet(self.bundles, instances=self.args.instances, database=self.database,
                                allow_ungated=True, fleet_id=f"soak{self.args.seed}")
        t = now()
        await self.fleet.start()
        self.fleet_start_s = now() - t
        from awm.episode.sources import PoolSource

        self.source = PoolSource.from_fleet(self.fleet, claim_timeout_s=self.args.claim_timeout,
                                            ready_timeout_s=30.0)
        self.log(f"fleet of {len(self.fleet.instances)} up in {self.fleet_start_s:.1f} s "
                 f"({', '.join(b.name for b in self.bundles)})")

    async def load_catalogs(self) -> list[Any]:
        from awm import catalog
        from awm.authoring import compile_source_dir

        out = []
        for name in self.args.catalogs.split(","):
            if name == "starter":
                out += catalog.load("starter")
            elif name == "fixtures":
                out += [compile_source_dir(FIXTURES / n) for n in ("lamps", "notes")]
            elif name == "awm1k":
                from bench.tool_latency import load_catalogs

                out += (await load_catalogs(["awm1k"], self.database, self.workdir))["awm1k"]
            else:
                raise SystemExit(f"unknown catalog {name!r} (starter, fixtures, awm1k)")
        return out

    async def calibrate(self) -> None:
        """Per environment, the calls that reach the server's code and answer in their own right
        (bench/tool_latency.py's candidates); then the scripts and their replays."""
        from awm.episode.session import EpisodeSession
        from bench.tool_latency import REJECTED, candidate_calls

        t = now()
        by_name = {b.name: b for b in self.bundles}
        for env, bundle in by_name.items():
            lease = await self.source.claim(env)
            try:
                session = EpisodeSession(lease.handle)
                kept = []
                for name, args in candidate_calls(bundle):
                    await session.reset(self.tasks_by_env[env][0])
                    out = await session.call_tool(name, args)
                    if session.infra_error:
                        raise RuntimeError(f"{env}: calibration failed: {session.infra_error}")
                    if out.error_kind in REJECTED or out.error_kind in ENV_FAULT_CLASSES or out.ms > 2000:
                        continue
                    kept.append((name, args))
                await session.reset(self.tasks_by_env[env][0])
            finally:
                await self.source.release(lease)
            if not kept:
                raise RuntimeError(f"{env}: no calibrated call")
            self.calls_by_env[env] = kept
        rng = random.Random(f"{self.args.seed}-scripts")
        for env in sorted(self.calls_by_env):
            calls = self.calls_by_env[env]
            for i in range(self.args.scripts):
                self.scripts.append(Script(env, i, rng.choice(self.tasks_by_env[env]),
                                           [rng.choice(calls) for _ in range(rng.randint(3, 10))]))
        self.calibrate_s = now() - t
        t = now()
        await self.replay_all()
        self.replay_s = now() - t
        excluded = [s for s in self.scripts if s.excluded]
        self.log(f"{len(self.scripts)} scripts over {len(self.calls_by_env)} environments replayed twice in "
                 f"{self.replay_s:.1f} s ({len(excluded)} nondeterministic, left out)")
        self.scripts = [s for s in self.scripts if not s.excluded]
        self.excluded = excluded
        if not self.scripts:
            raise RuntimeError("no deterministic script")

    async def replay_all(self) -> None:
        """Every script on a fresh reset, one call at a time, nothing else running; then again on
        another instance. The first is the truth; a script whose replays differ is left out."""
        for env in sorted(self.calls_by_env):
            scripts = [s for s in self.scripts if s.env == env]
            leases = await self.source.claim_group(env, 2)
            try:
                if len(leases) < 2:
                    raise RuntimeError("the replays need two instances (--instances 2 or more)")
                for pass_, lease in enumerate(leases):
                    for script in scripts:
                        got = await self.replay(lease, script)
                        if pass_ == 0:
                            script.truth = got
                        elif got != script.truth:
                            script.excluded = f"replays on {leases[0].name} and {lease.name} differ"
            finally:
                await self.source.release(leases)

    async def replay(self, lease: Any, script: Script) -> list[Any]:
        from awm.episode.session import EpisodeSession

        session = EpisodeSession(lease.handle)
        reset = await session.reset(script.task, verify=True)
        if reset.get("pristine") is not True or reset.get("repaired"):
            raise RuntimeError(f"replay of {script.key}: reset not pristine: {reset}")
        out = []
        for name, args in script.calls:
            result = await session.call_tool(name, args)
            if session.infra_error or result.error_kind in ENV_FAULT_CLASSES:
                raise RuntimeError(f"replay of {script.key} failed: {result.text}")
            out.append(call_record(self.norm, result))
        out.append(self.norm.diff(await session.control.diff(DIFF_ROWS)))
        return out

    # -- clients -------------------------------------------------------------------------------------

    async def client_loop(self, client: Client) -> None:
        rng = random.Random(f"{self.args.seed}-client-{client.cid}-{client.generation}")
        while not self.stop.is_set():
            script = rng.choice(self.scripts)
            await self.episode(client, script)

    async def episode(self, client: Client, script: Script) -> None:
        from awm.episode.session import EpisodeSession
        from awm.episode.sources import EnvironmentRefused, InstancesUnavailable

        self.episodes_started += 1
        ep = Episode(self.episodes_started, client.cid, script, self.elapsed())
        self.open[ep.id] = ep
        client.episode = ep
        try:
            try:
                lease = await self.source.claim(script.env)
            except (InstancesUnavailable, EnvironmentRefused) as exc:
                self.end(ep, "claim_failed")
                self.claim_failures.append(f"{script.env}: {type(exc).__name__}: {exc}"[:400])
                self.log(f"CLAIM FAILED {script.env}: {exc}")
                await asyncio.sleep(1.0)
                return
            ep.instance, ep.t_start, ep.stage = lease.name, self.elapsed(), "reset"
            healthy = False
            try:
                session = EpisodeSession(lease.handle)
                await self.run_script(ep, session, script)
                healthy = session.healthy
            except asyncio.CancelledError:
                if client.vanishing:  # gone: no DELETE of the session, no end of the episode
                    if lease.handle is not None:
                        lease.handle.mcp.forget_session()
                    await lease.disconnect()
                    self.end(ep, "abandoned")
                raise
            finally:
                await self.source.release(lease, healthy)
        except asyncio.CancelledError:
            if ep.outcome is None and client.vanishing:
                self.end(ep, "abandoned")
            raise
        except Exception as exc:  # noqa: BLE001 - an episode with no outcome: LOST
            self.end(ep, "lost")
            self.lost.append({"episode": ep.id, "instance": ep.instance, "stage": ep.stage,
                              "error": f"{type(exc).__name__}: {exc}"[:500]})
            self.log(f"LOST episode {ep.id} on {ep.instance} at {ep.stage}: {type(exc).__name__}: {exc}")
        finally:
            client.episode = None

    async def run_script(self, ep: Episode, session: Any, script: Script) -> None:
        from awm.episode.session import ENV_ERRORS

        failed: tuple[str, str] | None = None  # stage, text
        try:
            reset = await session.reset(script.task, verify=True)
        except ENV_ERRORS as exc:
            await session.abort(f"reset failed: {exc}")
            return self.masked(ep, "reset", "infra", str(exc))
        self.counts["resets"] += 1
        if self.leaks_left > 0 and script.inserts and ep.id % 5 == 0:
            # --inject-leak, the check's negative control: the script's calls once before the
            # episode's own, with no reset between (as if a previous episode's rows had survived
            # the reset): what the episode then sees must differ from its replay
            self.leaks_left -= 1
            self.counts["leaks_injected"] += 1
            ep.leak_injected = True
            for name, args in script.calls:
                await session.call_tool(name, args)
        if reset.get("pristine") is not True or reset.get("repaired") or reset.get("escaped"):
            self.dirty.append({"episode": ep.id, "instance": ep.instance, "env": script.env,
                               "pristine": reset.get("pristine"), "repaired": reset.get("repaired"),
                               "escaped": reset.get("escaped")})
            self.log(f"DIRTY reset on {ep.instance}: {self.dirty[-1]}")
        if reset.get("env") != script.env:
            self.mismatches.append({"episode": ep.id, "instance": ep.instance, "script": script.key,
                                    "what": f"the reset served {reset.get('env')!r}, not {script.env!r}"})
        ep.stage = "calls"
        seen = []
        for name, args in script.calls:
            out = await session.call_tool(name, args)
            if session.infra_error or out.error_kind in ENV_FAULT_CLASSES:
                failed = failed or ("call", f"{out.error_kind}: {out.text}")
                if session.infra_error:
                    break
                continue
            if failed is None:
                seen.append(call_record(self.norm, out))
        diff = None
        if failed is None:
            ep.stage = "diff"
            try:
                diff = self.norm.diff(await session.control.diff(DIFF_ROWS))
            except ENV_ERRORS as exc:
                session.infra_error = f"diff failed: {exc}"
                failed = ("diff", f"infra: {exc}")
        ep.stage = "verify"
        outcome = await session.finish("done")
        self.check(ep, script, seen, diff if not outcome.masked else None)
        if outcome.masked:
            if failed is None:
                failed = ("verify", f"{outcome.verdict.get('error_kind') or 'infra'}: "
                                    f"{outcome.verdict.get('reason') or outcome.mask_reason}")
            stage, text = failed
            kind, _, rest = text.partition(": ")
            return self.masked(ep, stage, kind, rest)
        if ep.leak_injected:
            self.counts["leaks_injected_completed"] += 1
        self.completed(ep)

    def check(self, ep: Episode, script: Script, seen: list[Any], diff: Any) -> None:
        """The results the episode saw (all of them, or those before its failure), and its final
        changes when it completed, against the script's replay."""
        assert script.truth is not None
        self.counts["calls_checked"] += len(seen)
        self.counts["finals_checked" if diff is not None else "masked_prefixes_checked"] += 1
        for i, got in enumerate(seen):
            if got != script.truth[i]:
                return self.mismatch(ep, script, f"call {i} ({script.calls[i][0]})", script.truth[i], got)
        if diff is not None and diff != script.truth[-1]:
            return self.mismatch(ep, script, "final database changes", script.truth[-1], diff)

    def mismatch(self, ep: Episode, script: Script, what: str, want: Any, got: Any) -> None:
        if ep.leak_injected:  # the negative control: found, as it must be
            self.counts["leaks_detected"] += 1
            return
        self.mismatches.append({"episode": ep.id, "instance": ep.instance, "script": script.key, "what": what,
                                "replay": json.dumps(want, default=str)[:600], "episode_saw": json.dumps(got, default=str)[:600]})
        self.log(f"CROSS-EPISODE MISMATCH episode {ep.id} on {ep.instance} ({script.key}): {what}")

    def masked(self, ep: Episode, stage: str, kind: str, text: str) -> None:
        detail = classify(text)
        self.masked_by_reason[f"{stage}:{kind}"] += 1
        self.masked_by_detail[f"{stage}:{kind}:{detail}"] += 1
        self.end(ep, "masked")

    def completed(self, ep: Episode) -> None:
        self.end(ep, "completed")
        assert ep.t_start is not None and ep.t_end is not None
        for fault in self.faults:
            if ep.t_start < fault.t:
                continue
            if fault.recovered_s is None and (fault.instance is None or fault.instance == ep.instance):
                fault.recovered_s = round(ep.t_end - fault.t, 3)
            if fault.instance is None and fault.all_instances_s is None and ep.instance:
                fault.instances_ok.add(ep.instance)
                if len(fault.instances_ok) == len(self.fleet.instances):
                    fault.all_instances_s = round(ep.t_end - fault.t, 3)

    def end(self, ep: Episode, outcome: str) -> None:
        if ep.outcome is not None:
            return
        ep.outcome, ep.t_end = outcome, self.elapsed()
        self.counts[outcome] += 1
        self.open.pop(ep.id, None)
        if ep.t_start is not None and outcome in ("completed", "masked"):
            self.episode_s.append(ep.t_end - ep.t_start)

    def start_client(self, client: Client) -> None:
        client.vanishing = False
        client.task = self.spawn(self.client_loop(client))

    # -- faults --------------------------------------------------------------------------------------

    def schedule(self) -> list[tuple[float, str]]:
        """(seconds after the start, kind): rounds of every kind in a seeded order, ``fault_every``
        apart (+-25 %), none in the quiet tail."""
        rng = random.Random(f"{self.args.seed}-faults")
        kinds = [k for k in self.args.faults.split(",") if k]
        for kind in kinds:
            if kind not in FAULT_KINDS:
                raise SystemExit(f"unknown fault {kind!r} ({', '.join(FAULT_KINDS)})")
        out, t = [], self.args.warmup
        last = self.args.duration - self.args.quiet_tail
        while kinds:
            round_ = kinds[:]
            rng.shuffle(round_)
            for kind in round_:
                if t > last:
                    return out
                out.append((round(t, 2), kind))
                t += self.args.fault_every * rng.uniform(0.75, 1.25)
        return out

    async def injector(self) -> None:
        plan = self.schedule()
        self.planned = len(plan)
        rng = random.Random(f"{self.args.seed}-targets")
        for at, kind in plan:
            delay = at - self.elapsed()
            if delay > 0:
                try:
                    await asyncio.wait_for(self.stop.wait(), delay)
                    return
                except TimeoutError:
                    pass
            self.spawn(self.inject(kind, rng))

    async def pick_instance(self, rng: random.Random) -> Any | None:
        """An instance no other fault is working on (waits for one, a minute at most)."""
        for _ in range(600):
            free = [h for h in self.fleet.instances if h.name not in self.active_targets]
            if free:
                return rng.choice(free)
            await asyncio.sleep(0.1)
        self.notes.append("no instance free of other faults for 60 s: a fault was not injected")
        return None

    async def inject(self, kind: str, rng: random.Random) -> None:
        try:
            await getattr(self, f"fault_{kind}")(rng)
        except Exception as exc:  # noqa: BLE001 - the harness's own failure: said, not hidden
            self.notes.append(f"fault {kind} could not be injected: {type(exc).__name__}: {exc}")
            self.log(self.notes[-1])

    def new_fault(self, kind: str, target: str, instance: str | None, **detail: Any) -> Fault:
        fault = Fault(kind, target, instance, round(self.elapsed(), 3), detail)
        self.faults.append(fault)
        self.log(f"inject {kind} -> {target} {detail or ''}")
        return fault

    async def fault_env_kill(self, rng: random.Random) -> None:
        handle = await self.pick_instance(rng)
        if handle is None:
            return
        self.active_targets.add(handle.name)
        try:
            pid, kids = handle.pid, descendants(handle.pid)
            restarts = handle.restarts
            fault = self.new_fault("env_kill", handle.name, handle.name, pid=pid)
            os.kill(pid, signal.SIGKILL)
            t = now()
            while handle.restarts == restarts or handle.pid == pid:
                if now() - t > 180:
                    fault.detail["restart"] = "not restarted within 180 s"
                    return
                await asyncio.sleep(0.1)
            fault.cleared = round(self.elapsed(), 3)
            fault.detail["restarted_after_s"] = round(now() - t, 3)
            self.spawn(self.orphans_of(handle.name, pid, kids))
        finally:
            self.active_targets.discard(handle.name)

    async def orphans_of(self, name: str, pid: int, kids: list[int]) -> None:
        """The killed server's processes (fork server, workers) must follow it."""
        await asyncio.sleep(10.0)
        left = [k for k in kids if alive(k)]
        self.orphan_checks.append({"instance": name, "pid": pid, "processes": len(kids), "still_alive": left})
        if left:
            self.log(f"LEAK: {len(left)} processes of the killed env server {pid} still alive: {left}")

    async def fault_env_stop(self, rng: random.Random) -> None:
        handle = await self.pick_instance(rng)
        if handle is None:
            return
        hold = rng.uniform(2.0, self.args.deadline + 10.0)
        self.active_targets.add(handle.name)
        pid = handle.pid
        try:
            fault = self.new_fault("env_stop", handle.name, handle.name, pid=pid, stopped_s=round(hold, 2))
            os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(hold)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
            fault.cleared = round(self.elapsed(), 3)
        finally:
            self.active_targets.discard(handle.name)

    def pg_pids(self) -> list[int]:
        try:
            postmaster = int((self.pg.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return []
        if not alive(postmaster):
            return []
        return [postmaster, *descendants(postmaster)]

    async def fault_pg_kill(self, rng: random.Random) -> None:
        async with self.pg_lock:
            pids = self.pg_pids()
            if not pids:
                return
            down = rng.uniform(1.0, 5.0)
            fault = self.new_fault("pg_kill", "postgres", None, processes=len(pids), down_s=round(down, 2))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            t = now()
            # gone, not only dead: while the postmaster is a zombie nobody has reaped yet (init
            # reaps late in some containers), pg_ctl takes the server for running and starts none
            while any(Path(f"/proc/{p}").exists() for p in pids) and now() - t < 60:
                await asyncio.sleep(0.05)
            fault.detail["reaped_s"] = round(now() - t, 3)
            await asyncio.sleep(max(0.0, down - (now() - t)))
            t = now()
            while True:
                try:
                    started = await asyncio.to_thread(self.pg.start)
                    await asyncio.to_thread(self.pg.version)  # it answers
                    break
                except Exception as exc:  # noqa: BLE001 - tried again until it is up
                    if now() - t > 120:
                        raise RuntimeError(f"Postgres did not start again within 120 s: {exc}") from exc
                    await asyncio.sleep(0.5)
            fault.cleared = round(self.elapsed(), 3)
            fault.detail.update(start_s=round(now() - t, 3), started_here=started)

    async def fault_pg_stop(self, rng: random.Random) -> None:
        async with self.pg_lock:
            pids = self.pg_pids()
            if not pids:
                return
            hold = rng.uniform(2.0, self.args.deadline + 10.0)
            fault = self.new_fault("pg_stop", "postgres", None, processes=len(pids), stopped_s=round(hold, 2))
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGSTOP)
            try:
                await asyncio.sleep(hold)
            finally:
                for pid in pids:
                    with contextlib.suppress(ProcessLookupError):
                        os.kill(pid, signal.SIGCONT)
            fault.cleared = round(self.elapsed(), 3)

    async def fault_client_vanish(self, rng: random.Random) -> None:
        for _ in range(200):  # a client in the middle of an episode (claimed, not yet verified)
            busy = [c for c in self.clients if c.episode is not None and c.episode.stage in ("reset", "calls")
                    and c.episode.instance not in self.active_targets and not c.vanishing]
            if busy:
                break
            await asyncio.sleep(0.02)
        else:
            self.notes.append("client_vanish: no client was in an episode")
            return
        client = rng.choice(busy)
        episode = client.episode
        assert episode is not None and client.task is not None
        fault = self.new_fault("client_vanish", f"client {client.cid}", episode.instance, episode=episode.id,
                               stage=episode.stage)
        client.vanishing = True
        client.task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await client.task
        fault.cleared = round(self.elapsed(), 3)
        client.generation += 1
        if not self.stop.is_set():
            self.start_client(client)

    async def fault_half_open(self, rng: random.Random) -> None:
        handle = await self.pick_instance(rng)
        if handle is None:
            return
        self.active_targets.add(handle.name)  # killed meanwhile, it would close them all
        try:
            await self._half_open(handle)
        finally:
            self.active_targets.discard(handle.name)

    async def _half_open(self, handle: Any) -> None:
        fault = self.new_fault("half_open", handle.name, handle.name)
        mcp = ("127.0.0.1", handle.mcp_port)
        control = ("127.0.0.1", handle.control_port)
        conns: list[tuple[str, socket.socket]] = []

        def open_(kind: str, where: tuple[str, int], data: bytes) -> None:
            sock = socket.create_connection(where, timeout=5)
            if data:
                sock.sendall(data)
            sock.setblocking(False)
            conns.append((kind, sock))

        head = "POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: application/json\r\n" \
               "Accept: application/json, text/event-stream\r\n"
        for _ in range(self.args.half_open):
            open_("idle", mcp, b"")
            open_("idle", control, b"")
            open_("partial_head", mcp, head.format(path="/mcp", port=mcp[1]).encode())
            open_("partial_head", control, head.format(path="/reset", port=control[1]).encode())
            open_("partial_body", mcp, (head.format(path="/mcp", port=mcp[1]) + "Content-Length: 400\r\n\r\n"
                                        '{"jsonrpc": "2.0", "id": 1,').encode())
            open_("partial_body", control, (head.format(path="/verify", port=control[1]) +
                                            "Content-Length: 400\r\n\r\n{\"final_answer\":").encode())
        sessions = await asyncio.to_thread(orphan_sessions, mcp, self.args.orphan_sessions)
        fault.detail.update(connections=len(conns), orphan_sessions=sessions)
        opened = self.elapsed()
        closed: dict[int, float] = {}
        window = self.args.half_open_window
        while self.elapsed() - opened < window and len(closed) < len(conns):
            for i, (_, sock) in enumerate(conns):
                if i in closed:
                    continue
                try:
                    if sock.recv(4096) == b"":
                        closed[i] = self.elapsed() - opened
                except BlockingIOError:
                    pass
                except OSError:
                    closed[i] = self.elapsed() - opened
            await asyncio.sleep(0.25)
        by_kind: dict[str, dict[str, Any]] = {}
        for i, (kind, sock) in enumerate(conns):
            entry = by_kind.setdefault(kind, {"opened": 0, "closed_by_server": 0, "held_past_window": 0,
                                              "close_s": []})
            entry["opened"] += 1
            if i in closed:
                entry["closed_by_server"] += 1
                entry["close_s"].append(round(closed[i], 2))
            else:
                entry["held_past_window"] += 1
            sock.close()
        for entry in by_kind.values():
            values = entry.pop("close_s")
            entry["close_s_max"] = max(values) if values else None
        self.half_open.append({"instance": handle.name, "window_s": window, "by_kind": by_kind})
        fault.cleared = round(self.elapsed(), 3)
        held = sum(e["held_past_window"] for e in by_kind.values())
        if held:
            self.log(f"LEAK: {handle.name} still held {held} half-open connections after {window:g} s: "
                     f"{ {k: v['held_past_window'] for k, v in by_kind.items() if v['held_past_window']} }")

    # -- intervals and the end -------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {"completed": self.counts["completed"], "masked": self.counts["masked"],
                "abandoned": self.counts["abandoned"], "lost": len(self.lost), "claim_failed": self.counts["claim_failed"],
                "resets_checked": self.counts["resets"], "dirty": len(self.dirty), "finals_checked": self.counts["finals_checked"],
                "cross_episode": len(self.mismatches), "faults": len(self.faults),
                "replaced": sum(h.restarts for h in self.fleet.instances)}

    async def reporter(self) -> None:
        last, t_last = self.snapshot(), self.elapsed()
        masked_last: Counter[str] = Counter()
        while not self.stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.args.interval)
            cur, t = self.snapshot(), self.elapsed()
            delta = {k: cur[k] - last[k] for k in cur}
            entry = {"t_s": round(t, 1), **delta,
                     "episodes_per_s": round(delta["completed"] / max(t - t_last, 1e-9), 2),
                     "masked_by_reason": dict(self.masked_by_reason - masked_last),
                     "faults_injected": [f"{f.kind}->{f.target}" for f in self.faults if t_last <= f.t < t],
                     "open_episodes": len(self.open), "load_average": round(os.getloadavg()[0], 2)}
            self.intervals.append(entry)
            self.log(f"interval: {entry['completed']} completed ({entry['episodes_per_s']}/s), {entry['masked']} masked, "
                     f"{entry['abandoned']} abandoned, {entry['lost']} lost, {entry['dirty']} dirty, "
                     f"{entry['cross_episode']} cross-episode; faults {entry['faults_injected']}")
            last, t_last, masked_last = cur, t, Counter(self.masked_by_reason)

    async def finish_clients(self) -> None:
        """Clients end their current episode; one still running after the grace is LOST (hung)."""
        grace = self.args.deadline * 2 + 60.0
        tasks = [c.task for c in self.clients if c.task is not None]
        done, pending = await asyncio.wait(tasks, timeout=grace) if tasks else (set(), set())
        for task in done:
            if not task.cancelled() and task.exception() is not None:
                self.lost.append({"client_failed": f"{type(task.exception()).__name__}: {task.exception()}"[:500]})
        for ep in list(self.open.values()):
            self.lost.append({"episode": ep.id, "instance": ep.instance, "stage": ep.stage,
                              "error": f"still running {grace:g} s after the soak ended (hung)"})
            self.end(ep, "lost")
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)

    async def leak_checks(self) -> dict[str, Any]:
        # faults still running (a stop's SIGCONT, a restart) end first
        await asyncio.gather(*[t for t in self._bg], return_exceptions=True)
        t = now()
        while (self.source.free() < self.source.size or any(self.source._leased.values())) and now() - t < 90:
            await asyncio.sleep(0.2)
        held = {env: n for env, n in self.source._leased.items() if n}
        free = {lease.name for q in self.source._queues.values() for lease in list(q._queue)}  # type: ignore[attr-defined]
        missing = sorted(lease.name for lease in self.source._all if lease.name not in free)
        out: dict[str, Any] = {"claims_held": sum(held.values()), "claims_held_by_env": held,
                               "instances_not_returned": missing, "settle_s": round(now() - t, 2)}
        # the provisioner's databases: each made one is held by a live instance, or made ahead
        prov = self.fleet.provisioner
        assert prov is not None

        def unheld_now() -> tuple[set[str], set[str], dict[str, str], set[str]]:
            with prov._lock:
                made = set(prov._made)
                holders = dict(prov._holders)
                ready = {i.dbname for q in prov._ready.values() for i in q}
            live = {h.name for h in self.fleet.instances if h.process is not None and h.process.returncode is None}
            return {db for db in made if db not in ready and holders.get(db) not in live}, made, holders, ready

        await asyncio.sleep(1.0)  # releases answered before their drop
        first = unheld_now()[0]
        await asyncio.sleep(2.0)  # twice, apart: never a database caught between its clone and the ready list
        second, made, holders, ready = unheld_now()
        unheld = sorted(first & second)
        per_instance = Counter(holders[db] for db in made if db in holders)
        import psycopg

        def query() -> tuple[list[str], list[str], int]:
            with psycopg.connect(self.pg.admin_dsn(), autocommit=True) as conn:
                names = [r[0] for r in conn.execute(
                    "SELECT datname FROM pg_database WHERE datname LIKE %s", [f"awm_i_{prov.prefix[:8]}%"]).fetchall()]
                roles = [r[0] for r in conn.execute(
                    "SELECT usename FROM pg_stat_activity WHERE usename LIKE 'awm_i_%%'").fetchall()]
                version = conn.execute("SHOW server_version").fetchone()
            return names, roles, version

        names, roles, version = await asyncio.to_thread(query)
        self.pg_version = version[0] if version else None
        roles_of_made = {prov._made[db].role for db in made if db in prov._made}
        out.update({
            "databases_made": len(made), "databases_ready": len(ready),
            "databases_held_max_per_instance": max(per_instance.values()) if per_instance else 0,
            "databases_unheld": unheld,
            "databases_orphaned": sorted(set(names) - made),  # on the server, forgotten by the provisioner
            "pg_backends": len(roles), "pg_backends_orphaned": sorted({r for r in roles if r not in roles_of_made}),
            "killed_server_processes_alive": sum(len(c["still_alive"]) for c in self.orphan_checks),
            "half_open_connections_held": sum(e["held_past_window"] for h in self.half_open
                                              for e in h["by_kind"].values()),
        })
        return out

    async def run(self) -> dict[str, Any]:
        await self.setup()
        try:
            await self.calibrate()
            self.t0 = now()
            self.clients = [Client(i) for i in range(self.args.clients)]
            for client in self.clients:
                self.start_client(client)
            reporter = self.spawn(self.reporter())
            injector = self.spawn(self.injector())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.stop.wait(), self.args.duration)
            soak_s = self.elapsed()
            self.stop.set()
            await injector
            await self.finish_clients()
            await reporter
            leaks = await self.leak_checks()
            return self.report(soak_s, leaks)
        finally:
            await self.teardown()

    async def teardown(self) -> None:
        for task in list(self._bg):
            task.cancel()
        await asyncio.gather(*list(self._bg), return_exceptions=True)
        for pid in self.pg_pids():  # never left stopped
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
        for handle in self.fleet.instances if hasattr(self, "fleet") else []:
            with contextlib.suppress(ProcessLookupError):
                if handle.pid:
                    os.kill(handle.pid, signal.SIGCONT)
        with contextlib.suppress(Exception):
            await self.source.close()
        with contextlib.suppress(Exception):
            await self.fleet.stop()
        with contextlib.suppress(Exception):
            await asyncio.to_thread(self.pg.stop)
        shutil.rmtree(getattr(self, "workdir", "/nonexistent"), ignore_errors=True)

    def report(self, soak_s: float, leaks: dict[str, Any]) -> dict[str, Any]:
        from bench.runtime import machine

        by_kind: dict[str, Any] = {}
        for fault in self.faults:
            entry = by_kind.setdefault(fault.kind, {"injected": 0, "recovered": 0, "recovery_s": []})
            entry["injected"] += 1
            if fault.recovered_s is not None:
                entry["recovered"] += 1
                entry["recovery_s"].append(fault.recovered_s)
        for entry in by_kind.values():
            values = entry.pop("recovery_s")
            entry.update(recovery_s_p50=pct(values, 0.5), recovery_s_max=max(values) if values else None)
        completed = self.counts["completed"]
        replaced = sum(h.restarts for h in self.fleet.instances)
        kills = sum(1 for f in self.faults if f.kind == "env_kill")
        bound = self.args.deadline + 60.0
        over = [round(s, 2) for s in self.episode_s if s > bound]
        report: dict[str, Any] = {
            "seed": self.args.seed, "duration_s": round(soak_s, 1), "instances": self.args.instances,
            "clients": self.args.clients, "deadline_s": self.args.deadline,
            "catalog": {env: {"calls": len(calls), "tasks": len(self.tasks_by_env[env]),
                              "scripts": sum(1 for s in self.scripts if s.env == env)}
                        for env, calls in self.calls_by_env.items()},
            "setup_s": {"fleet_start": round(self.fleet_start_s, 1), "calibrate": round(self.calibrate_s, 1),
                        "replays": round(self.replay_s, 1)},
            "episodes": {"started": self.episodes_started, "completed": completed, "masked": self.counts["masked"],
                         "abandoned_by_client_vanish": self.counts["abandoned"], "lost": len(self.lost),
                         "claims_failed": self.counts["claim_failed"],
                         "completed_per_s": round(completed / soak_s, 2), "tool_calls_checked": self.counts["calls_checked"]},
            "masked_by_reason": dict(self.masked_by_reason.most_common()),
            "masked_by_detail": dict(self.masked_by_detail.most_common()),
            "resets": {"checked": self.counts["resets"], "dirty": len(self.dirty), "dirty_examples": self.dirty[:5]},
            "cross_episode": {"leaks_injected": self.counts["leaks_injected"],
                              "leaks_injected_completed": self.counts["leaks_injected_completed"],
                              "leaks_detected": self.counts["leaks_detected"],
                              "finals_checked": self.counts["finals_checked"],
                              "masked_prefixes_checked": self.counts["masked_prefixes_checked"],
                              "mismatches": len(self.mismatches), "examples": self.mismatches[:5],
                              "scripts": len(self.scripts),
                              "scripts_left_out_nondeterministic": [f"{s.key}: {s.excluded}" for s in self.excluded]},
            "lost": self.lost[:10],
            "claim_failures": self.claim_failures[:10],
            "leaks": leaks,
            "instances_replaced": replaced, "instances_replaced_not_killed_by_us": max(0, replaced - kills),
            "faults": {"planned": getattr(self, "planned", 0), "injected": len(self.faults), "by_kind": by_kind,
                       "unrecovered": [f"{f.kind}->{f.target} at {f.t} s" for f in self.faults if f.recovered_s is None],
                       "all": [{"kind": f.kind, "target": f.target, "t_s": f.t, **f.detail,
                                "cleared_s": None if f.cleared is None else round(f.cleared - f.t, 3),
                                "recovered_s": f.recovered_s, "all_instances_s": f.all_instances_s}
                               for f in self.faults]},
            "half_open": self.half_open,
            "episode_s": {"p50": pct(self.episode_s, 0.5), "p99": pct(self.episode_s, 0.99),
                          "max": round(max(self.episode_s), 3) if self.episode_s else None,
                          "bound_s": bound, "over_bound": over},
            "intervals": self.intervals,
            "notes": self.notes,
            "product_warnings": dict(self.warnings.counts.most_common(25)),
            "postgres": getattr(self, "pg_version", None),
            "machine": {**machine(), "load_average_at_end": [round(x, 2) for x in os.getloadavg()]},
        }
        failures = []
        if report["episodes"]["lost"]:
            failures.append(f"{report['episodes']['lost']} episodes LOST (no outcome)")
        if self.dirty:
            failures.append(f"{len(self.dirty)} resets DIRTY")
        if self.mismatches:
            failures.append(f"{len(self.mismatches)} CROSS-EPISODE mismatches")
        if self.counts["leaks_detected"] < self.counts["leaks_injected_completed"]:
            failures.append(f"the cross-episode check MISSED injected leaks: {self.counts['leaks_detected']} of "
                            f"{self.counts['leaks_injected_completed']} found")
        if leaks["claims_held"] or leaks["instances_not_returned"]:
            failures.append(f"claims LEAKED: {leaks['claims_held']} held, not returned: {leaks['instances_not_returned']}")
        if leaks["databases_unheld"] or leaks["databases_orphaned"]:
            failures.append(f"databases LEAKED: {leaks['databases_unheld'] + leaks['databases_orphaned']}")
        if leaks["pg_backends_orphaned"]:
            failures.append(f"Postgres backends LEAKED: {leaks['pg_backends_orphaned']}")
        if leaks["killed_server_processes_alive"]:
            failures.append(f"{leaks['killed_server_processes_alive']} processes of killed env servers LEAKED")
        if leaks["half_open_connections_held"]:
            failures.append(f"{leaks['half_open_connections_held']} half-open connections still HELD by env servers "
                            f"after {self.args.half_open_window:g} s")
        if report["faults"]["unrecovered"]:
            failures.append(f"faults NOT RECOVERED: {report['faults']['unrecovered']}")
        if self.counts["claim_failed"]:
            failures.append(f"{self.counts['claim_failed']} claims FAILED (a training run would have stopped)")
        if over:
            failures.append(f"{len(over)} episodes ran past {bound:g} s: {over[:5]}")
        if report["faults"]["injected"] < report["faults"]["planned"]:
            failures.append(f"only {report['faults']['injected']} of {report['faults']['planned']} faults injected")
        report["failures"] = failures
        report["ok"] = not failures
        return report


def orphan_sessions(where: tuple[str, int], count: int) -> int:
    """MCP sessions opened (initialize) and never ended, their connections then dropped."""
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize",
                       "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                                  "clientInfo": {"name": "soak-orphan", "version": "1"}}}).encode()
    request = (f"POST /mcp HTTP/1.1\r\nHost: {where[0]}:{where[1]}\r\nContent-Type: application/json\r\n"
               f"Accept: application/json, text/event-stream\r\nContent-Length: {len(body)}\r\n\r\n").encode() + body
    made = 0
    for _ in range(count):
        try:
            with socket.create_connection(where, timeout=5) as sock:
                sock.sendall(request)
                if b"mcp-session-id" in sock.recv(65536).lower():
                    made += 1
        except OSError:
            pass
    return made


def classify(text: str) -> str:
    """What the transport or the server said, in a word."""
    checks = (("deadline", "deadline"), ("ConnectError", "connect"), ("Connection refused", "connect"),
              ("All connection attempts failed", "connect"), ("RemoteProtocolError", "disconnected"),
              ("Server disconnected", "disconnected"), ("ReadError", "read_error"), ("WriteError", "write_error"),
              ("episode lost", "episode_lost"), ("database unavailable", "database_unavailable"),
              ("database connection", "database_unavailable"), ("restarting", "instance_restarting"),
              ("Session not found", "session_gone"), ("did not finish within", "tool_time_limit"))
    for needle, word in checks:
        if needle in text:
            return word
    found = re.search(r"HTTP (\d{3})", text)
    if found:
        return f"http_{found.group(1)}"
    return (text.split(":", 1)[0].strip() or "unknown")[:40]


def summary(report: dict[str, Any]) -> str:
    ep, leaks = report["episodes"], report["leaks"]
    lines = [
        f"soak {report['duration_s']} s, {report['instances']} instances, {report['clients']} clients, seed {report['seed']}",
        f"episodes: {ep['completed']} completed ({ep['completed_per_s']}/s), {ep['masked']} masked, "
        f"{ep['abandoned_by_client_vanish']} abandoned (client_vanish), {ep['lost']} lost, {ep['claims_failed']} claims failed",
        f"masked by reason: {report['masked_by_reason']}",
        f"resets checked: {report['resets']['checked']}, dirty: {report['resets']['dirty']}",
        f"cross-episode: {report['cross_episode']['finals_checked']} final states and "
        f"{ep['tool_calls_checked']} tool results checked against replays, {report['cross_episode']['mismatches']} mismatches",
        f"leaks: claims {leaks['claims_held']}, instances not returned {leaks['instances_not_returned']}, databases "
        f"{len(leaks['databases_unheld']) + len(leaks['databases_orphaned'])}, backends {len(leaks['pg_backends_orphaned'])}, "
        f"processes {leaks['killed_server_processes_alive']}, half-open connections held {leaks['half_open_connections_held']}",
        f"instances replaced: {report['instances_replaced']}",
        "faults: " + ", ".join(f"{k} {v['recovered']}/{v['injected']} recovered (p50 {v['recovery_s_p50']} s, "
                               f"max {v['recovery_s_max']} s)" for k, v in report["faults"]["by_kind"].items()),
        f"episode seconds: p50 {report['episode_s']['p50']}, p99 {report['episode_s']['p99']}, max {report['episode_s']['max']}",
    ]
    return "\n".join(lines)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--duration", type=float, default=600.0, help="seconds of episodes under faults")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--instances", type=int, default=4)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--catalogs", default="starter,fixtures", help="starter, fixtures (lamps, notes), awm1k")
    parser.add_argument("--scripts", type=int, default=40, help="scripts per environment (each replayed twice first)")
    parser.add_argument("--deadline", type=float, default=15.0,
                        help="AWM_ENV_DEADLINE_S for the clients: a hung server costs an episode this long")
    parser.add_argument("--faults", default=",".join(FAULT_KINDS))
    parser.add_argument("--fault-every", type=float, default=20.0, help="seconds between faults (+-25 %%)")
    parser.add_argument("--warmup", type=float, default=5.0, help="seconds before the first fault")
    parser.add_argument("--quiet-tail", type=float, default=None,
                        help="no fault in the last seconds (default: deadline + 40)")
    parser.add_argument("--interval", type=float, default=60.0, help="seconds per reported interval")
    parser.add_argument("--claim-timeout", type=float, default=180.0)
    parser.add_argument("--half-open", type=int, default=2, help="connections of each half-open kind per fault")
    parser.add_argument("--orphan-sessions", type=int, default=600,
                        help="MCP sessions opened and never ended per fault (past the server's cap of 512)")
    parser.add_argument("--half-open-window", type=float, default=30.0,
                        help="seconds an env server may hold a half-open connection (head deadline 10 s + keep-alive)")
    parser.add_argument("--inject-leak", type=int, default=0,
                        help="the cross-episode check's negative control: this many episodes skip their reset")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--quiet", action="store_true", help="no progress on stderr")
    args = parser.parse_args(argv)
    if args.quiet_tail is None:
        args.quiet_tail = args.deadline + 40.0
    return args


async def amain(args: argparse.Namespace) -> dict[str, Any]:
    # Every client of the env servers made from here on has this deadline (awm.client.env_deadline_s).
    os.environ["AWM_ENV_DEADLINE_S"] = str(args.deadline)
    t = time.perf_counter()
    load0 = [round(x, 2) for x in os.getloadavg()]
    report = await Soak(args).run()
    report["machine"]["load_average_at_start"] = load0
    report["bench_wall_s"] = round(time.perf_counter() - t, 1)
    report["command"] = "python -m bench.soak " + " ".join(sys.argv[1:])
    return report


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    report = asyncio.run(amain(args))
    if args.json:
        print(json.dumps(report))
    else:
        print(summary(report))
    for failure in report["failures"]:
        print(f"SOAK FAILURE: {failure}", file=sys.stderr)
    if report["failures"]:
        print("SOAK FAILED: expected 0 lost, 0 dirty, 0 leaked, 0 cross-episode, every fault recovered",
              file=sys.stderr)
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    raise SystemExit(main())
