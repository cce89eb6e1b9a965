"""The file view shows every read path wherever it lives, ``/tmp`` included.

The view's tmpfs used to be mounted on ``/tmp`` before the read paths were bound into it, so a read
path under ``/tmp`` (a virtualenv or a checkout there) was hidden by then and silently left out:
the workers could not import from it, and ``awm catalog import`` skipped every AWM-1K environment
with ``ModuleNotFoundError``. Here a confined process reads and imports from ``/tmp``, the whole
AWM-app path (import, serve, MCP call, verify) runs from a virtualenv and a checkout under ``/tmp``,
and a read path the view cannot show is named in the report instead of being skipped.

Every process is real: its own interpreter, confined by the kernel; Postgres is the session's.
"""

from __future__ import annotations

import importlib.metadata as metadata
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
import tomllib
import venv
from pathlib import Path
from typing import Any, Iterator

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from awm.sandbox import confine
from tests.conftest import FIXTURES, require

ROOT = Path(__file__).resolve().parent.parent
VIEW_ROOT = confine.VIEW_ROOTS[0]  # /tmp: where the view used to be built, whatever it held
PROJECT = "awm-fleet"
EXTRAS = ("envserver", "awm1k")  # what `awm catalog import` and an env server need
TIMEOUT_S = 300  # a hang guard only: nothing is measured


def _under(path: Path, directory: str) -> bool:
    return str(path) == directory or str(path).startswith(directory.rstrip("/") + "/")


@pytest.fixture(scope="module")
def tmp_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A directory under /tmp: pytest's own where it lives there (the default, and CI's basetemp
    under AWM_HOME), else a fresh one (a TMPDIR elsewhere would make these tests prove nothing)."""
    problem = confine.fsview_problem()
    require(problem is None, f"no file view on this machine: {problem}")
    own = tmp_path_factory.mktemp("tmp-view").resolve()
    if _under(own, VIEW_ROOT):
        yield own
        return
    made = Path(tempfile.mkdtemp(prefix="awm-tmp-view-", dir=VIEW_ROOT))
    try:
        yield made
    finally:
        shutil.rmtree(made, ignore_errors=True)


def _run(python: str | Path, script: str, args: dict[str, Any], cwd: Path) -> dict[str, Any]:
    """Run ``script`` in a fresh isolated interpreter (``-I``: no PYTHONPATH, no current directory
    on its path) and return the JSON it prints last."""
    env = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "AWM_HOME") if k in os.environ}
    done = subprocess.run([str(python), "-I", "-c", script, json.dumps(args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- a confined process reads and imports from /tmp ------------------------------------------------

_READ_MODULE = r'''
import json, sys
from awm.sandbox import confine
from awm.sandbox.pool import read_paths

args = json.loads(sys.argv[1])
sys.path.insert(0, args["lib"])
report = confine.confine([*read_paths(False), args["lib"], args["missing"]], confine.Limits(), tuple(args["layers"]))
out = {"report": report.as_dict()}
try:
    import tmp_view_module
    out["imported"] = tmp_view_module.VALUE
except Exception as exc:
    out["imported"] = f"{type(exc).__name__}: {exc}"
for key in ("data", "neighbour"):
    try:
        with open(args[key]) as f:
            out[key] = f.read()
    except OSError as exc:
        out[key] = type(exc).__name__
print(json.dumps(out))
'''


@pytest.mark.parametrize("layers", ["namespaces,fsview,rlimits,seccomp", ",".join(confine.LAYERS)])
def test_a_confined_process_imports_and_reads_from_a_read_path_under_tmp(tmp_dir: Path, layers: str) -> None:
    """With the file view as the only file rule (as under gVisor) and beside Landlock: a read path
    under /tmp is in the view (a module imports from it, a file reads), a read path this host
    lacks is left out without harm, and a file beside the read path stays out of reach."""
    base = tmp_dir / f"read-module-{len(layers)}"
    lib = base / "lib"
    lib.mkdir(parents=True)
    (lib / "tmp_view_module.py").write_text("VALUE = 'imported from under /tmp'\n")
    (lib / "data.txt").write_text("read from under /tmp")
    (base / "neighbour.txt").write_text("not a read path")
    args = {"lib": str(lib), "missing": str(base / "absent"), "layers": layers.split(","),
            "data": str(lib / "data.txt"), "neighbour": str(base / "neighbour.txt")}
    out = _run(sys.executable, _READ_MODULE, args, cwd=tmp_dir)
    assert out["report"]["strong"] is True and "fsview" in out["report"]["applied"], out["report"]
    assert out["imported"] == "imported from under /tmp", out
    assert out["data"] == "read from under /tmp", out
    assert out["neighbour"] in ("FileNotFoundError", "PermissionError"), out


_NO_ROOT = r'''
import json, sys
from awm.sandbox import confine

args = json.loads(sys.argv[1])
report = confine.Report()
confine.enter_namespaces(report, [args["lib"], *confine.VIEW_ROOTS[1:]])
with open(args["data"]) as f:  # the failed view left nothing half-mounted over the host's files
    data = f.read()
print(json.dumps({"report": report.as_dict(), "data": data}))
'''


def test_a_read_path_the_view_cannot_show_is_named_in_the_report(tmp_dir: Path) -> None:
    """Read paths under every directory the view could be built on: no view can show them all, so
    none is built, the report says which read path stood in the way (it used to be skipped), and
    the process still sees the host's files (Landlock, where present, is then the file rule)."""
    lib = tmp_dir / "no-root" / "lib"
    lib.mkdir(parents=True)
    (lib / "data.txt").write_text("still the host's")
    out = _run(sys.executable, _NO_ROOT, {"lib": str(lib), "data": str(lib / "data.txt")}, cwd=tmp_dir)
    assert "fsview" not in out["report"]["applied"], out
    assert f"{VIEW_ROOT} holds {lib}" in out["report"]["missing"]["fsview"], out
    assert out["data"] == "still the host's"


# -- the whole AWM-app path from a virtualenv and a checkout under /tmp ------------------------------


def _distributions(name: str, extras: tuple[str, ...]) -> dict[str, metadata.Distribution]:
    """``name[extras]`` and everything it requires, as installed in this interpreter."""
    found: dict[str, tuple[metadata.Distribution, frozenset[str]]] = {}
    todo = [(name, frozenset(extras))]
    while todo:
        wanted, wanted_extras = todo.pop()
        key = canonicalize_name(wanted)
        if key in found and wanted_extras <= found[key][1]:
            continue
        try:
            dist = metadata.distribution(wanted)
        except metadata.PackageNotFoundError:
            require(False, f"{wanted} is not installed (needed by {name}[{','.join(extras)}])")
            raise  # not reached: require() skipped, or failed under CI=true
        wanted_extras |= found[key][1] if key in found else frozenset()
        found[key] = (dist, wanted_extras)
        for line in dist.requires or []:
            req = Requirement(line)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in wanted_extras or {""}):
                todo.append((req.name, frozenset(req.extras)))
    return {key: dist for key, (dist, _) in found.items()}


def _place(source: Path, target: Path) -> None:
    """A hard link where both are on one file system (cheap; its real path is ``target``, and
    Python replaces files rather than writing into them, so the original stays as it is), else a
    copy. Never a symlink: its real path would be the original, outside /tmp."""
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(source, target)
    except OSError:
        shutil.copy2(source, target)


def _install(dist: metadata.Distribution, site: Path) -> None:
    """``dist``'s files (its RECORD) into ``site``; scripts and data outside site-packages are not
    needed here."""
    for file in dist.files or []:
        if file.parts and file.parts[0] == "..":
            continue
        source = Path(dist.locate_file(file))
        if source.is_file():
            _place(source, site / file)


def _checkout(target: Path) -> Path:
    """This checkout's packages laid out as installed (envserver/ as awm/envserver/, ..., as
    pyproject's package-dir maps them)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    package_dir = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    shutil.copytree(ROOT / "awm", target / "awm", ignore=ignore)
    for name, folder in package_dir.items():
        if name and name != "awm":
            shutil.copytree(ROOT / folder, target.joinpath(*name.split(".")), ignore=ignore, dirs_exist_ok=True)
    return target


@pytest.fixture(scope="module")
def tmp_venv(tmp_dir: Path) -> Path:
    """A virtualenv under /tmp holding the project's dependencies (their installed files, placed
    there) and this checkout, copied under /tmp, on its path the way an editable install puts it
    (a .pth file). Its interpreter is the base Python's, as any virtualenv's is."""
    env = tmp_dir / "venv"
    venv.EnvBuilder(with_pip=False, symlinks=True).create(env)
    python = env / "bin" / "python"
    site = Path(subprocess.run([str(python), "-I", "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                               capture_output=True, text=True, check=True).stdout.strip())
    for key, dist in _distributions(PROJECT, EXTRAS).items():
        if key != canonicalize_name(PROJECT):  # the project itself is the checkout below
            _install(dist, site)
    checkout = _checkout(tmp_dir / "checkout")
    (site / "awm_checkout.pth").write_text(f"{checkout}\n")
    return python


_AWM_APP = r'''
import asyncio, datetime as dt, json, os, sys, sysconfig
from pathlib import Path

import awm
from awm import catalog
from awm.client import ControlClient, McpSession
from awm.fleet import Database, LocalFleet
from awm.importers.awm1k import import_awm_dir

args = json.loads(sys.argv[1])
out = Path(args["out"])
import_awm_dir(Path(args["fixture"]), out, admin_dsn=args["dsn"], now=dt.datetime(2025, 6, 1),
               envs=["library_loans_1"], jobs=1)


async def serve():
    fleet = LocalFleet(catalog.load(out), replicas=1, database=Database(args["dsn"]), allow_ungated=True)
    await fleet.start()
    try:
        handle = fleet.instances[0]
        control = ControlClient(handle.control_url)
        try:
            await control.reset("task_0")
            async with McpSession(handle.mcp_url) as mcp:
                loan = await mcp.call_tool("borrow_book", {"book_id": 1})
            verdict = await control.verify("Borrowed.")
            info = await control.info()
        finally:
            await control.close()
    finally:
        await fleet.stop()
    return {"loan": [loan.is_error, loan.text], "verdict": verdict.get("verdict"), "isolation": info.get("isolation")}


report = json.loads((out / "report.json").read_text())["environments"]
served = asyncio.run(serve()) if catalog.load(out) else {}  # nothing to serve: the report says why
print(json.dumps({"awm": os.path.realpath(awm.__file__), "site": os.path.realpath(sysconfig.get_path("purelib")),
                  "report": report, **served}))
'''


def test_the_awm_app_path_runs_from_a_virtualenv_and_a_checkout_under_tmp(tmp_venv: Path, tmp_dir: Path,
                                                                        admin_dsn: str) -> None:
    """`awm catalog import` of an AWM-1K environment (its app probed in a confined process), the
    environment served by a local fleet (its app in confined workers), a tool called over MCP and
    the task verified: all from an interpreter whose site-packages and project code live under
    /tmp, the directory the file view used to hide."""
    out = _run(tmp_venv, _AWM_APP, {"fixture": str(FIXTURES / "awm1k"), "out": str(tmp_dir / "catalog"),
                                    "dsn": admin_dsn}, cwd=tmp_dir)
    # what this test is about: the code, and the packages the confined app imports, are under /tmp
    assert _under(Path(out["site"]), VIEW_ROOT) and _under(Path(out["awm"]), VIEW_ROOT), out
    assert Path(out["site"]) != Path(sysconfig.get_path("purelib")).resolve()
    (env,) = out["report"]
    assert (env["name"], env["status"], env["tools_served"]) == ("library_loans_1", "imported", 5), env
    assert env["verifier_errors_on_untouched"] == [], env
    assert out["loan"][0] is False, out["loan"]
    assert out["verdict"] == "complete", out
    assert out["isolation"]["strong"] is True and "fsview" in out["isolation"]["applied"], out["isolation"]
