"""Catalogs: where bundles come from.

A catalog is a directory (or a ``.tar.gz``/``.tgz``/``.zip`` archive of one) holding bundles as
``*.json`` files or as source directories (see :mod:`awm.authoring`), at most one level deep.
The starter catalog ships inside the package; ``"starter"`` names it.
"""

from __future__ import annotations

import atexit
import random
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from awm import settings
from awm.authoring import compile_source_dir, is_source_dir
from awm.bundle import EnvBundle

STARTER = Path(__file__).with_name("starter")


def cache_root() -> Path:
    """Where built and imported catalogs are kept by content (``AWM_CATALOG_CACHE``, default
    ``~/.cache/awm/catalogs``): generated ones (awm.synth.varied), AWM-1K imports
    (awm.importers.awm1k.import_cached)."""
    return settings.AWM_CATALOG_CACHE


class CatalogError(ValueError):
    pass


@dataclass
class Entry:
    name: str
    source: Path
    bundle: EnvBundle | None
    error: str | None = None


def resolve(catalog: str | Path | None) -> Path:
    if catalog in (None, "", "starter"):
        return STARTER
    path = Path(catalog).expanduser()
    if not path.exists():
        raise CatalogError(f"catalog {path} does not exist")
    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".zip")):
        return _extract(path)
    return path


def _extract(archive: Path) -> Path:
    target = Path(tempfile.mkdtemp(prefix="awm-catalog-"))
    atexit.register(shutil.rmtree, target, True)  # the bundles' files are read while the process runs
    if archive.name.endswith(".zip"):
        with zipfile.ZipFile(archive) as zf:
            for member in zf.namelist():
                if member.startswith("/") or ".." in Path(member).parts:
                    raise CatalogError(f"{archive}: unsafe path {member!r}")
            zf.extractall(target)
    else:
        with tarfile.open(archive) as tf:
            tf.extractall(target, filter="data")
    children = [p for p in target.iterdir() if not p.name.startswith(".")]
    return children[0] if len(children) == 1 and children[0].is_dir() and not _is_bundle(children[0]) else target


REPORT = "report.json"  # written next to the bundles by `awm catalog import`; not a bundle
INDEX = "index.json"    # written next to the bundles by `awm catalog export`; not a bundle either
SELECTION = "selection.json"  # written next to the bundles by `awm catalog select`: what it chose, and why


def _is_bundle(path: Path) -> bool:
    return is_source_dir(path) or (path.is_file() and path.suffix == ".json" and path.name not in (REPORT, INDEX, SELECTION))


def index(bundles: list[EnvBundle]) -> dict[str, Any]:
    """The catalog's table of contents: what an EnvFleet's environmentSelector chooses from
    (served next to the bundles, or held in a ConfigMap; docs/kubernetes.md)."""
    return {"environments": [{"name": b.name, "tasks": len(b.tasks), "tools": len(b.tools)}
                             for b in sorted(bundles, key=lambda b: b.name)]}


def load_bundle(path: Path) -> EnvBundle:
    try:
        if is_source_dir(path):
            return compile_source_dir(path)
        return EnvBundle.model_validate_json(path.read_text())
    except ValidationError as exc:
        raise CatalogError(f"{path.name}: invalid bundle:\n{exc}") from exc
    except (OSError, ValueError, KeyError, SyntaxError) as exc:
        raise CatalogError(f"{path.name}: {type(exc).__name__}: {exc}") from exc


def entries(catalog: str | Path | None = None) -> list[Entry]:
    """Every bundle of a catalog, loaded; a broken one is listed with its error, not skipped."""
    root = resolve(catalog)
    if _is_bundle(root):
        candidates = [root]
    else:
        candidates = sorted(p for p in root.iterdir() if _is_bundle(p) and not p.name.startswith("."))
    found = []
    for path in candidates:
        try:
            bundle = load_bundle(path)
            found.append(Entry(bundle.name, path, bundle))
        except CatalogError as exc:
            found.append(Entry(path.stem, path, None, str(exc)))
    return found


_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,199}$")


def find(root: Path, name: str) -> EnvBundle:
    """One environment of a resolved catalog directory by name: ``<name>.json`` or the source
    directory ``<name>/`` (how ``awm catalog export`` and a local fleet lay bundles out), else the
    bundle of that name among all of them. ``KeyError`` if there is none; a name that is not a
    plain file name is never looked up as a path."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise KeyError(name)
    for path in (root / f"{name}.json", root / name):
        if path.exists() and _is_bundle(path):
            bundle = load_bundle(path)
            if bundle.name == name:
                return bundle
    for entry in entries(root):
        if entry.bundle is not None and entry.name == name:
            return entry.bundle
    raise KeyError(name)


def load(catalog: str | Path | None = None, names: list[str] | None = None) -> list[EnvBundle]:
    """Bundles of a catalog (optionally only ``names``); any broken bundle is an error."""
    all_entries = entries(catalog)
    broken = [e for e in all_entries if e.bundle is None and (not names or e.name in names)]
    if broken:
        raise CatalogError("\n".join(e.error or e.name for e in broken))
    bundles = {e.name: e.bundle for e in all_entries if e.bundle is not None}
    if names:
        missing = [n for n in names if n not in bundles]
        if missing:
            raise CatalogError(f"not in the catalog: {', '.join(missing)} (have: {', '.join(sorted(bundles))})")
        return [bundles[n] for n in names]  # type: ignore[misc]
    return list(bundles.values())  # type: ignore[arg-type]


def split(names: list[str], test_fraction: float = 0.1, seed: int = 0,
          test_count: int | None = None) -> tuple[list[str], list[str]]:
    """The paper's train/test protocol: environments (never tasks) held out whole. A seeded
    shuffle of the sorted names, the first ``test_count`` (or ``round(n * test_fraction)``, at
    least one when the fraction is above 0) for test, the rest for training; both sorted. The
    same names, fraction and seed give the same split on any machine (``random.Random`` is
    deterministic across platforms and Python versions for ``shuffle`` of a list)."""
    unique = sorted(set(names))
    if len(unique) != len(names):
        raise CatalogError("the catalog names an environment twice")
    n = len(unique)
    if test_count is None:
        if not 0.0 <= test_fraction < 1.0:
            raise CatalogError(f"the test fraction must be in [0, 1), not {test_fraction}")
        test_count = max(1, round(n * test_fraction)) if test_fraction > 0 else 0
    if not 0 <= test_count < n:
        raise CatalogError(f"cannot hold out {test_count} of {n} environments and train on the rest")
    order = unique[:]
    random.Random(seed).shuffle(order)
    test = sorted(order[:test_count])
    return sorted(set(unique) - set(test)), test
