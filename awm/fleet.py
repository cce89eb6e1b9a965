"""The local fleet: N env-server processes on one Postgres, without Kubernetes.

It provisions (template per environment, database and role per instance), starts one
``python -m awm.envserver`` per instance with a scrubbed environment (the child gets its own DSN and
nothing else of ours), waits for each to announce its URLs, restarts any that die on the same
ports, and on exit stops them and drops their databases. A fleet that could not clean up (killed,
machine lost power) leaves databases behind; each instance's database comment names the host and
the owning process (pid and start time), so the next fleet on that host drops those whose owner is
gone (``reap_abandoned``; also ``awm postgres gc``). The env servers themselves never outlive the
fleet's process: each learns its parent's pid (``AWM_PARENT_PID``) and has the kernel stop it when
that process dies, however it dies (awm.envserver.lifeline).
"""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
import logging
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from awm import settings
from awm.bundle import EnvBundle
from awm.judge import JudgeSettings
from awm.postgres import provision
from awm.postgres.provisioner import Provisioner, ProvisionerServer
from awm.postgres.server import EmbeddedPostgres

log = logging.getLogger("awm.fleet")
_INHERITED = ("PATH", "LANG", "LC_ALL", "TZ", "PYTHONPATH", "HOME", "MALLOC_ARENA_MAX",
              settings.names.AWM_ALLOW_WEAK_ISOLATION, settings.names.AWM_SANDBOX_LAYERS,
              settings.names.AWM_ALLOWED_HOSTS, settings.names.AWM_ALLOWED_ORIGINS,
              settings.names.AWM_SERVER_LOOP, settings.names.AWM_SERVER_HTTP, settings.names.AWM_HEAD_TIMEOUT_S)


class FleetError(RuntimeError):
    pass


def _process_start(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (``/proc/<pid>/stat`` field 22), which
    tells a live owner from a later process that reused its pid; None if there is no such process."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[19]


def owner_meta() -> dict[str, str]:
    """What a local fleet writes into each instance database's comment."""
    pid = os.getpid()
    return {"owner": "local-fleet", "host": socket.gethostname(), "pid": str(pid),
            "pid_start": _process_start(pid) or ""}


def reap_abandoned(admin_dsn: str) -> list[str]:
    """Drop instance databases of local fleets on this host whose owning process is gone."""
    host = socket.gethostname()
    dropped = []
    for name, meta in provision.instances_with_meta(admin_dsn).items():
        if meta.get("owner") != "local-fleet" or meta.get("host") != host:
            continue
        try:
            pid = int(meta.get("pid", ""))
        except ValueError:
            continue
        start = _process_start(pid)
        if start is not None and start == meta.get("pid_start"):
            continue  # its fleet is alive
        provision.drop_instance(admin_dsn, name)
        dropped.append(name)
    if dropped:
        log.info("dropped %d databases of local fleets that exited without cleaning up", len(dropped))
    return dropped


@dataclass
class Database:
    """Where instance databases live: an external server or the embedded one."""

    admin_dsn: str
    embedded: EmbeddedPostgres | None = None
    started_here: bool = False

    @classmethod
    def open(cls, database_url: str | None = None) -> Database:
        url = database_url or settings.AWM_DATABASE_URL
        if url:
            return cls(url)
        pg = EmbeddedPostgres.default()
        started = pg.start()
        db = cls(pg.admin_dsn(), pg, started)
        provision.harden_cluster(db.admin_dsn)
        return db

    def close(self, keep_running: bool = False) -> None:
        if self.embedded is not None and self.started_here and not keep_running:
            self.embedded.stop()


@dataclass
class InstanceHandle:
    env: str  # the environment it served first (a late-binding instance may serve others since)
    name: str
    bundle_path: Path
    pinned_db: provision.Instance | None = None  # a pinned instance's one database
    mcp_url: str = ""
    control_url: str = ""
    pid: int = 0
    restarts: int = 0
    process: asyncio.subprocess.Process | None = field(default=None, repr=False)
    mcp_port: int = 0
    control_port: int = 0
    provisioner: Provisioner | None = field(default=None, repr=False)

    @property
    def db(self) -> provision.Instance:
        """The database the instance serves now (a late-binding one's: the last it acquired)."""
        if self.pinned_db is not None:
            return self.pinned_db
        found = self.provisioner.held_by(self.name) if self.provisioner is not None else None
        if found is None:
            raise FleetError(f"{self.name} holds no database now")
        return found


class LocalFleet:
    def __init__(self, bundles: list[EnvBundle], replicas: int = 1, database: Database | None = None,
                 verifier_workers: int = 1, host: str = "127.0.0.1", start_timeout_s: float = 120.0,
                 fleet_id: str | None = None, allowed_hosts: list[str] | None = None,
                 allowed_origins: list[str] | None = None, judge: JudgeSettings | None = None,
                 verifier_kind: str | None = None, allow_ungated: bool = False, binding: str = "late",
                 instances: int | None = None, cache_envs: int = 4, keep_ready: int = 1,
                 spare_workers: int = 1) -> None:
        if replicas < 1:
            raise FleetError("replicas must be at least 1")
        if binding not in ("late", "pinned"):
            raise FleetError(f"binding must be late or pinned, not {binding!r}")
        if instances is not None and (instances < 1 or binding == "pinned"):
            raise FleetError("instances (a total over the catalog) needs late binding and at least 1")
        # Late binding (the default): every instance may serve any environment of the fleet's
        # catalog, switched when a claim asks for another one (a database from the fleet's
        # provisioner, awm.postgres.provisioner); it starts on its first environment. Pinned: an
        # instance serves the one environment it started with (the fleet makes its database).
        self.binding = binding
        self.total = instances  # late: this many instances, first environments in turn
        self.cache_envs = cache_envs
        self.keep_ready = keep_ready  # late: databases made ahead per environment in demand
        self.provisioner: Provisioner | None = None
        self._provisioner_server: ProvisionerServer | None = None
        self.bundles = bundles
        self.replicas = replicas
        self.database = database
        self.verifier_workers = verifier_workers
        self.spare_workers = spare_workers  # tool workers each env server forks ahead (envserver --spare-workers)
        self.host = host
        # Host names and browser origins the env servers accept besides their own (DNS-rebinding
        # protection; awm.envserver.hostguard).
        self.allowed_hosts = list(allowed_hosts or [])
        self.allowed_origins = list(allowed_origins or [])
        self.start_timeout_s = start_timeout_s
        # The LLM judge for judge-verifier tasks, which verifier kind to prefer, and whether tasks
        # that have not passed both gates are served (marked ungated): see awm.envserver.instance.
        self.judge = judge
        self.verifier_kind = verifier_kind
        self.allow_ungated = allow_ungated
        self.instances: list[InstanceHandle] = []
        self.fleet_id = fleet_id or secrets.token_hex(3)
        # The catalog files the env servers read and the provisioner's socket: made by start()
        # (before _provision, which bench/runtime.py replaces), removed at stop (a laptop that runs `awm serve` daily must not collect them in /tmp).
        self._workdir: Path | None = None
        self._supervisor: asyncio.Task[None] | None = None
        # The template the env servers' app zygotes are forked from (awm.sandbox.forkserver):
        # their imported and warmed-up frameworks in memory once for the fleet, not once per
        # instance. Started with the fleet when its catalog has apps; an env server that cannot
        # reach it starts a zygote of its own.
        self._template: subprocess.Popen[bytes] | None = None
        self._stopping = False
        self.provision_s = 0.0
        # Late binding: the environments the instances may serve, by name. Their bundles are files
        # of the fleet's catalog directory, read when the provisioner makes an environment's
        # template (once): a fleet serving 1,000 scenarios on demand holds none of them in memory.
        self._envs: set[str] = set()

    async def __aenter__(self) -> LocalFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()

    async def start(self) -> list[InstanceHandle]:
        if importlib.util.find_spec("uvicorn") is None:  # before any database is made for nothing
            raise FleetError("a local fleet runs env servers, which need the envserver extra: "
                             "pip install 'awm-fleet[envserver]' (in a checkout: pip install -e '.[envserver]')")
        if self.database is None:
            self.database = await asyncio.to_thread(Database.open)
        self._workdir = Path(tempfile.mkdtemp(prefix="awm-fleet-"))
        if any(b.app is not None for b in self.bundles):
            from awm.sandbox.pool import start_template

            try:
                self._template = await asyncio.to_thread(start_template, str(self._workdir / "forkserver.sock"))
            except OSError as exc:
                log.warning("no fork-server template (each instance starts its own): %s", exc)
        t0 = time.perf_counter()
        try:
            self.instances = await asyncio.to_thread(self._provision)
        except BaseException:
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None
            raise
        self.provision_s = time.perf_counter() - t0
        try:
            await asyncio.gather(*(self._launch(h) for h in self.instances))
        except BaseException:
            await self.stop()
            raise
        self._supervisor = asyncio.create_task(self._supervise())
        return self.instances

    def _provision(self) -> list[InstanceHandle]:
        assert self.database is not None
        reap_abandoned(self.database.admin_dsn)
        meta = owner_meta()
        handles = []
        if self.binding == "pinned":
            starting = self.bundles
        else:  # late: the environments instances start on; the provisioner makes others on demand
            starting = self.bundles[: self.total] if self.total is not None else self.bundles
        templates = provision.ensure_templates(self.database.admin_dsn, starting, jobs=os.cpu_count() or 1)
        assert self._workdir is not None  # made by start()
        catalog_dir = self._workdir / "catalog"
        catalog_dir.mkdir(exist_ok=True)
        catalog_dir.chmod(0o755)
        paths = {}
        for bundle in self.bundles:
            path = paths[bundle.name] = catalog_dir / f"{bundle.name}.json"
            path.write_text(bundle.model_dump_json())
            path.chmod(0o644)
        if self.binding == "pinned":
            for bundle, template in zip(self.bundles, templates):
                for i in range(self.replicas):
                    name = provision.instance_name(bundle.name, i, self.fleet_id)
                    db = provision.create_instance(self.database.admin_dsn, template, name, meta=meta)
                    handles.append(InstanceHandle(bundle.name, name, paths[bundle.name], db))
            return handles
        self._envs = {b.name for b in self.bundles}
        self.provisioner = Provisioner(self.database.admin_dsn, self._bundle, self.fleet_id,
                                       keep=self.keep_ready, meta=meta)
        self.provisioner.add_templates(templates)
        self._provisioner_server = ProvisionerServer(self.provisioner, self._workdir / "provisioner.sock").start()
        if self.total is None:
            firsts = [(b.name, i) for b in self.bundles for i in range(self.replicas)]
        else:
            firsts = [(self.bundles[i % len(self.bundles)].name, i) for i in range(self.total)]
        for env, i in firsts:
            name = provision.instance_name(env, i, self.fleet_id) if self.total is None else \
                provision.instance_name("late", i, self.fleet_id)
            handles.append(InstanceHandle(env, name, paths[env], provisioner=self.provisioner))
        return handles

    def add(self, bundle: EnvBundle) -> None:
        """Late binding: one more environment the instances may switch to, from now on (a catalog
        served on demand adds each environment at its first claim, never all of them at start)."""
        if self.binding != "late" or self._workdir is None or self.provisioner is None:
            raise FleetError("environments are added to a started late-binding fleet only")
        if bundle.name in self._envs:
            return
        catalog_dir = self._workdir / "catalog"
        partial = catalog_dir / f".{bundle.name}.json.partial"
        partial.write_text(bundle.model_dump_json())
        partial.chmod(0o644)
        partial.rename(catalog_dir / f"{bundle.name}.json")  # an env server never reads half a file
        self._envs.add(bundle.name)

    def _bundle(self, env: str) -> EnvBundle:
        """An environment of the fleet, read from its catalog directory (the provisioner's lookup)."""
        if env not in self._envs or self._workdir is None:
            raise KeyError(env)
        return EnvBundle.model_validate_json((self._workdir / "catalog" / f"{env}.json").read_text())

    async def _launch(self, handle: InstanceHandle) -> None:
        env = {k: v for k, v in os.environ.items() if k in _INHERITED}
        # Secrets travel through a pipe, never the environment: a process's initial environment
        # block (/proc/<pid>/environ) keeps what it was started with even after os.environ.pop.
        secrets: dict[str, str] = {"dsn": handle.pinned_db.dsn} if handle.pinned_db is not None else {}
        env[settings.names.AWM_PARENT_PID] = str(os.getpid())  # it exits when we do, even by SIGKILL
        if self._template is not None and self._workdir is not None:
            env[settings.names.AWM_FORK_TEMPLATE] = str(self._workdir / "forkserver.sock")
        if self.judge is not None:
            env.update(self.judge.to_env())
            if os.environ.get(self.judge.api_key_env):
                secrets["judge_api_key"] = os.environ[self.judge.api_key_env]
        secrets_fd, writer = os.pipe()
        with os.fdopen(writer, "w") as pipe:  # a few hundred bytes: within the pipe's buffer
            pipe.write(json.dumps(secrets))
        env[settings.names.AWM_SECRETS_FD] = str(secrets_fd)
        if self.verifier_kind:
            env[settings.names.AWM_VERIFIER_KIND] = self.verifier_kind
        if self.allow_ungated:
            env[settings.names.AWM_ALLOW_UNGATED] = "1"
        guard_args = [*(a for h in self.allowed_hosts for a in ("--allowed-host", h)),
                      *(a for o in self.allowed_origins for a in ("--allowed-origin", o))]
        if self._provisioner_server is not None:  # late binding: databases from the fleet's provisioner
            where = ["--catalog", str(handle.bundle_path.parent), "--env", handle.env,
                     "--provisioner", self._provisioner_server.path, "--cache-envs", str(self.cache_envs)]
        else:
            where = ["--bundle", str(handle.bundle_path)]
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "awm.envserver", *where, "--name", handle.name,
            "--host", self.host, "--mcp-port", str(handle.mcp_port), "--control-port", str(handle.control_port),
            "--verifier-workers", str(self.verifier_workers), "--spare-workers", str(self.spare_workers),
            *guard_args,
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            env=env, start_new_session=True, pass_fds=(secrets_fd,),
        )
        os.close(secrets_fd)
        handle.process = proc
        assert proc.stdout is not None
        try:
            line = await asyncio.wait_for(proc.stdout.readline(), self.start_timeout_s)
        except asyncio.TimeoutError:
            proc.kill()
            raise FleetError(f"{handle.name}: no ready line within {self.start_timeout_s:g} s") from None
        if not line:
            err = (await proc.stderr.read()).decode(errors="replace") if proc.stderr else ""
            raise FleetError(f"{handle.name} failed to start:\n{err[-3000:]}")
        ready = json.loads(line)
        handle.mcp_url, handle.control_url, handle.pid = ready["mcp_url"], ready["control_url"], ready["pid"]
        handle.mcp_port = int(handle.mcp_url.rsplit(":", 1)[1].split("/")[0])
        handle.control_port = int(handle.control_url.rsplit(":", 1)[1])
        asyncio.create_task(_drain(proc.stderr, handle.name))

    async def _supervise(self) -> None:
        """Self-healing: an instance process that exits is started again on the same ports."""
        while not self._stopping:
            for handle in self.instances:
                proc = handle.process
                if proc is not None and proc.returncode is not None and not self._stopping:
                    log.warning("%s exited with %s; restarting", handle.name, proc.returncode)
                    handle.restarts += 1
                    try:
                        await self._launch(handle)
                    except FleetError as exc:
                        log.error("restart of %s failed: %s", handle.name, exc)
                        await asyncio.sleep(1.0)
            await asyncio.sleep(0.2)

    async def stop(self, drop: bool = True) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._supervisor
        for handle in self.instances:
            if handle.process is not None and handle.process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    handle.process.terminate()
        for handle in self.instances:
            if handle.process is not None:
                try:
                    await asyncio.wait_for(handle.process.wait(), 10)
                except asyncio.TimeoutError:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(handle.process.pid, 9)
        if self._template is not None:  # every zygote it forked has exited with its env server
            self._template.kill()
            await asyncio.to_thread(self._template.wait)
            self._template = None
        if self._provisioner_server is not None:
            await asyncio.to_thread(self._provisioner_server.close)
        if self.provisioner is not None:  # drops every database it made
            await asyncio.to_thread(self.provisioner.close)
        if drop and self.database is not None and self.binding == "pinned":
            for handle in self.instances:
                with contextlib.suppress(Exception):
                    await asyncio.to_thread(provision.drop_instance, self.database.admin_dsn, handle.name)
        if self._workdir is not None:  # every env server that read it has exited
            shutil.rmtree(self._workdir, ignore_errors=True)
            self._workdir = None


async def _drain(stream: asyncio.StreamReader | None, name: str) -> None:
    """Forward an instance's stderr to our log, so a crash explains itself."""
    if stream is None:
        return
    while line := await stream.readline():
        log.warning("[%s] %s", name, line.decode(errors="replace").rstrip())
