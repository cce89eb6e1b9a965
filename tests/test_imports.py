"""What may import what (docs/architecture.md), checked over the real import graph by
import-linter's contracts in pyproject.toml ([tool.importlinter]): the components' layers, the
core importing none of them, and no import cycles.

The repository keeps one folder per component (envserver/, trainer/, ...) that installs as a
subpackage of ``awm`` (pyproject's package-dir); import-linter reads packages from the file
system, so the packages are first laid out as installed, in a temporary directory."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
COMPONENTS = ("awm.envserver", "awm.trainer", "awm.integrations", "awm.ui")


@pytest.fixture
def layout(tmp_path: Path) -> Path:
    """The packages as a wheel installs them (copied: import-linter does not follow symlinks),
    the k8s harness beside them, and pyproject.toml with the contracts."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "awm", tmp_path / "awm", ignore=ignore)
    for name, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        if name and name != "awm":
            shutil.copytree(ROOT / folder, tmp_path.joinpath(*name.split(".")), ignore=ignore, dirs_exist_ok=True)
    shutil.copytree(ROOT / "k8s", tmp_path / "k8s", ignore=ignore)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def lint(layout: Path) -> subprocess.CompletedProcess[str]:
    lint_imports = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(lint_imports), "pyproject.toml", "--no-cache"], cwd=layout, text=True,
                          capture_output=True, timeout=120, env={**os.environ, "PYTHONPATH": str(layout)})


def test_the_import_contracts_hold(layout: Path) -> None:
    r = lint(layout)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "3 kept, 0 broken" in r.stdout


def test_the_core_contract_names_every_core_module(layout: Path) -> None:
    """The forbidden contract lists the core's modules by name: a new one must be added there."""
    (core,) = [c for c in PYPROJECT["tool"]["importlinter"]["contracts"] if c["id"] == "core"]
    components = {name.split(".")[1] for name in COMPONENTS}
    present = {f"awm.{p.stem}" for p in (layout / "awm").iterdir()
               if (p.suffix == ".py" and p.stem != "__init__") or (p.is_dir() and (p / "__init__.py").exists()
                                                                   and p.name not in components)}
    assert present == set(core["source_modules"])


@pytest.mark.parametrize("importer, line, broken", [
    ("awm/episode/session.py", "import awm.trainer.agent", "The core"),        # the core reaching up
    ("awm/envserver/control.py", "import awm.integrations.loop", "Components"),  # a component reaching up
    ("awm/bundle.py", "import awm.catalog", "No import cycles"),               # catalog imports bundle
])
def test_a_broken_contract_fails(layout: Path, importer: str, line: str, broken: str) -> None:
    """Each contract catches what it is about (an import added to the laid-out copy)."""
    path = layout / importer  # as installed: envserver/control.py is awm/envserver/control.py
    path.write_text(path.read_text() + f"\n{line}  # added by the test\n")
    r = lint(layout)
    assert r.returncode != 0
    assert broken in r.stdout and "BROKEN" in r.stdout, r.stdout


def test_importing_the_cli_loads_no_component() -> None:
    """`awm` must start in an image that has only the core (and one component): its
    subcommands import their component when they run, never when awm.cli is imported."""
    code = ("import sys, awm.cli\n"
            f"up = sorted(m for m in sys.modules if m.startswith({COMPONENTS + ('awm_operator',)!r}))\n"
            "assert not up, up\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr


def test_the_repository_tools_import_by_name() -> None:
    """bench/, tests/ and k8s/ import each other and the installed packages by module name (run
    from the repository's root: ``python -m bench.fleet``, pytest), never by inserting folders
    into sys.path or loading a file by its path: such a module is a second copy of one that may
    be imported normally too (two registries, two harness singletons), and the import graph above
    cannot see it."""
    import ast

    found = []
    for folder in ("bench", "tests", "k8s", "images"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(), str(path))):
                if isinstance(node, ast.Attribute) and node.attr == "spec_from_file_location":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: spec_from_file_location")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                        and node.func.attr in ("insert", "append") and ast.unparse(node.func.value) == "sys.path":
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno}: sys.path.{node.func.attr}")
    assert not found, "\n".join(found)
