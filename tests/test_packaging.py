"""The distribution as a user gets it: the wheel built once from this checkout, installed with
one extra into a clean virtualenv, each component's entry point run there.

* ``envserver``: what the env-server image installs (``awm --help``, ``python -m awm.envserver``);
* ``operator``: what the operator image installs (``python -m awm_operator``, ``awm operator``);
* ``trainer``: not installed here. Its extra is torch, transformers and peft: gigabytes of
  downloads on every clean CI run (even resolving it without installing took 75 s). Instead the
  wheel's metadata must declare them, and the envserver-only environment runs ``awm train
  --help`` and ``awm eval --help`` (the trainer loads torch only when a command runs). The real
  trainer runs in every trainer test, in the project's own environment.

Downloads go through pip's cache (``AWM_PIP_CACHE``, else ``~/.cache/awm/pip``), so a second
run installs from it. The wheel's contents are checked against pyproject's package map.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PIP_CACHE = Path(os.environ.get("AWM_PIP_CACHE") or Path.home() / ".cache" / "awm" / "pip")

pytestmark = pytest.mark.slow


def run(*args: str | Path, timeout: float = 900, **kwargs) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_CACHE_DIR": str(PIP_CACHE), "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    kwargs.setdefault("cwd", Path(args[0]).parent)  # never the checkout: its awm/ would shadow the wheel's
    r = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=timeout, env=env, **kwargs)
    assert r.returncode == 0, f"{' '.join(map(str, args))}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    # from a copy of the checkout: building writes build/ and *.egg-info into the source tree
    source = tmp_path_factory.mktemp("source") / "awm"
    shutil.copytree(ROOT, source, ignore=shutil.ignore_patterns(".git", ".venv", "build", "*.egg-info", "__pycache__",
                                                                "node_modules", ".pytest_cache"))
    run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-w", out, source)
    (built,) = out.glob("awm_fleet-*.whl")
    return built


def clean_venv(path: Path) -> Path:
    venv.EnvBuilder(with_pip=True, clear=True).create(path)
    return path / "bin"


def test_the_wheel_holds_every_package_under_the_awm_namespace(wheel: Path) -> None:
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.startswith("awm_fleet-")}
    assert tops == {"awm", "awm_operator"}  # no generic top-level names (trainer, ui, ...)
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package in cfg["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in names, package
    folders = {p.parent.relative_to(ROOT).as_posix() for p in ROOT.glob("*/**/__init__.py")
               if not any(part in {"tests", "bench", ".venv", "build"} or part.startswith(".")
                          for part in p.relative_to(ROOT).parts)}
    mapped = {cfg["package-dir"].get(pkg) or pkg.replace(".", "/") for pkg in cfg["packages"]}
    mapped |= {f"{cfg['package-dir'][top]}/{pkg[len(top) + 1:].replace('.', '/')}" for pkg in cfg["packages"]
               for top in cfg["package-dir"] if top and pkg.startswith(top + ".")}
    assert folders <= mapped, sorted(folders - mapped)  # a package folder the wheel would leave out


def test_the_envserver_extra_alone_runs_its_entry_points(wheel: Path, tmp_path: Path) -> None:
    bin_ = clean_venv(tmp_path / "envserver")
    run(bin_ / "pip", "install", f"{wheel}[envserver]")
    assert "serve" in run(bin_ / "awm", "--help").stdout
    assert "--control-port" in run(bin_ / "python", "-m", "awm.envserver", "--help").stdout
    # the trainer's commands answer --help without torch (it loads when they run)
    assert "--config" in run(bin_ / "awm", "train", "--help").stdout
    assert "--base-url" in run(bin_ / "awm", "eval", "--help").stdout
    missing = run(bin_ / "python", "-c", "import importlib.util as u; "
                  "print([m for m in ('torch', 'kopf', 'openenv') if u.find_spec(m)])").stdout
    assert missing.strip() == "[]"


def test_the_operator_extra_alone_runs_its_entry_points(wheel: Path, tmp_path: Path) -> None:
    bin_ = clean_venv(tmp_path / "operator")
    run(bin_ / "pip", "install", f"{wheel}[operator]")
    assert "AWM_* environment" in run(bin_ / "python", "-m", "awm_operator", "--help").stdout
    assert "crds" in run(bin_ / "awm", "operator", "--help").stdout
    assert "EnvFleet" in run(bin_ / "awm", "operator", "crds").stdout
    absent = run(bin_ / "python", "-c", "import importlib.util as u; "
                 "print([m for m in ('torch', 'uvicorn') if u.find_spec(m)])").stdout
    assert absent.strip() == "[]"


def test_the_trainer_extra_declares_what_the_trainer_imports(wheel: Path) -> None:
    """Not installed (see the module's docstring): the wheel's metadata is read instead."""
    with zipfile.ZipFile(wheel) as z:
        (meta,) = [n for n in z.namelist() if n.endswith(".dist-info/METADATA")]
        lines = z.read(meta).decode().splitlines()
    trainer = {line.split(":", 1)[1].split(";")[0].strip().split(">")[0].split("=")[0].split("[")[0]
               for line in lines if line.startswith("Requires-Dist:") and 'extra == "trainer"' in line}
    assert {"torch", "transformers", "peft", "awm-fleet"} <= trainer, trainer  # awm-fleet: its eval extra
