"""awm/settings.py declares every ``AWM_*`` environment variable once (issue 47): docs/settings.md
is generated from it, no other module of the product reads one itself, every declared one is
read somewhere, and a read sees the environment as it is at that moment."""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from awm import settings

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("awm", "envserver", "trainer", "integrations", "ui", "operator")
SETTINGS_MODULES = {"awm/settings.py"}
DOCS = ROOT / "docs" / "settings.md"

# Files that may read AWM_* variables themselves: none (kept, empty, so that an exception is a
# visible, reviewed line here rather than a silent gap in the scan).
ALLOWED_TO_READ: set[str] = set()
# Variables read under a name held in data rather than spelled in code.
READ_BY_NAME = {
    "AWM_JUDGE_API_KEY": "JudgeSettings.api_key_env's default: awm/judge.py, awm/fleet.py and the env "
                         "server read the variable that field names",
}
# What a declaration is asked that is not its value (a dataclass default, a name for a manifest).
DESCRIPTIVE = {"default", "default_value", "name", "why", "kind", "shown", "shown_default", "empty_is_unset",
               "factory"}
READS = {"get", "pop", "setdefault", "getenv", "__getitem__", "__contains__"}
FULL_NAME = re.compile(r"AWM_[A-Z0-9_]+")


@dataclass
class Scan:
    """What one file does with AWM_* names."""

    path: str
    raw_reads: list[tuple[int, str]] = field(default_factory=list)       # os.environ-style reads
    declared_twice: list[tuple[int, str]] = field(default_factory=list)  # X = "AWM_..." constants
    reads: set[str] = field(default_factory=set)                         # through awm.settings
    undeclared: list[tuple[int, str]] = field(default_factory=list)      # settings.AWM_X not declared


def product_files() -> list[Path]:
    return sorted(p for top in PRODUCT for p in (ROOT / top).rglob("*.py") if "__pycache__" not in p.parts)


def _module_constants(tree: ast.Module) -> dict[str, str]:
    """Module-level ``X = "AWM_Y"`` or ``X = settings.names.AWM_Y``: X names AWM_Y."""
    found = {}
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        for target in targets:
            if not isinstance(target, ast.Name) or value is None:
                continue
            if isinstance(value, ast.Constant) and isinstance(value.value, str) and FULL_NAME.fullmatch(value.value):
                found[target.id] = value.value
            elif isinstance(value, ast.Attribute) and FULL_NAME.fullmatch(value.attr) and \
                    isinstance(value.value, ast.Attribute) and value.value.attr == "names":
                found[target.id] = value.attr
    return found


def _constants() -> dict[str, str]:
    """Every product module's name constants (``SOCKET_ENV``, ``hostguard.HOSTS_ENV``...)."""
    found: dict[str, str] = {}
    for path in product_files():
        found.update(_module_constants(ast.parse(path.read_text(), str(path))))
    return found


def scan(path: Path, constants: dict[str, str]) -> Scan:
    rel = path.relative_to(ROOT).as_posix()
    tree = ast.parse(path.read_text(), rel)
    out = Scan(rel)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    modules, aliases = {"awm.settings"}, {"var": set(), "names": set()}  # who is awm.settings here
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "awm":
            modules |= {a.asname or a.name for a in node.names if a.name == "settings"}
        elif isinstance(node, ast.ImportFrom) and node.module == "awm.settings":
            for a in node.names:
                if a.name in aliases:
                    aliases[a.name].add(a.asname or a.name)

    def dotted(node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return node.id
        if isinstance(node, ast.Attribute):
            head = dotted(node.value)
            return f"{head}.{node.attr}" if head else None
        return None

    def namespace(node: ast.AST) -> str | None:
        """'module', 'var' or 'names' when ``node`` is awm.settings or one of its namespaces."""
        name = dotted(node)
        if name in modules:
            return "module"
        for kind in ("var", "names"):
            if name in aliases[kind] or (isinstance(node, ast.Attribute) and node.attr == kind
                                         and dotted(node.value) in modules):
                return kind
        return None

    for node in tree.body:  # X = awm_settings.var / .names: an alias of the namespace
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            kind = namespace(node.value)
            if kind in aliases:
                aliases[kind].add(node.targets[0].id)

    def key(node: ast.AST | None) -> str | None:
        """The AWM_* variable an expression used as a key names."""
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and FULL_NAME.fullmatch(node.value):
            return node.value
        if isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) \
                and str(node.values[0].value).startswith("AWM_"):
            return f"{node.values[0].value}*"
        if isinstance(node, ast.Name) and node.id in constants:
            return constants[node.id]
        if isinstance(node, ast.Attribute):
            if node.attr in constants:
                return constants[node.attr]
            if FULL_NAME.fullmatch(node.attr) and namespace(node.value) == "names":
                return node.attr
        return None

    for node in ast.walk(tree):
        hit: str | None = None
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            hit = key(node.slice)
        elif isinstance(node, ast.Call):
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", None)
            if name in READS and node.args:
                hit = key(node.args[0])
            for kw in node.keywords:
                if kw.arg == "envvar" and isinstance(kw.value, ast.Constant) and key(kw.value):
                    out.raw_reads.append((node.lineno, f"envvar={kw.value.value}"))
        elif isinstance(node, ast.Compare) and isinstance(node.ops[0], (ast.In, ast.NotIn)):
            hit = key(node.left)
        if hit:
            out.raw_reads.append((node.lineno, hit))
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str) and FULL_NAME.fullmatch(node.value.value):
            out.declared_twice.append((node.lineno, node.value.value))
        if isinstance(node, ast.Attribute) and FULL_NAME.fullmatch(node.attr):
            kind = namespace(node.value)
            if kind is None:
                continue
            if node.attr not in settings.environment_variables:
                out.undeclared.append((node.lineno, node.attr))
                continue
            parent = parents.get(node)
            if kind == "module":
                out.reads.add(node.attr)
            elif kind == "var" and not (isinstance(parent, ast.Attribute) and parent.attr in DESCRIPTIVE):
                out.reads.add(node.attr)
            elif kind == "names" and isinstance(parent, ast.keyword) and parent.arg == "envvar":
                out.reads.add(node.attr)  # typer reads it
    return out


@pytest.fixture(scope="module")
def scans() -> list[Scan]:
    constants = _constants()
    return [scan(p, constants) for p in product_files() if p.relative_to(ROOT).as_posix() not in SETTINGS_MODULES]


def test_docs_settings_md_is_generated_from_the_declarations() -> None:
    assert DOCS.read_text() == settings.markdown(), \
        "docs/settings.md is out of date: python -m awm.settings --markdown > docs/settings.md"


def test_no_product_module_reads_an_awm_variable_itself(scans: list[Scan]) -> None:
    """os.environ[...], .get/.pop, os.getenv, ``in os.environ``, typer's envvar="AWM_..." and a
    second ``X = "AWM_..."`` constant: outside awm/settings.py (and the allow-list) these are errors."""
    found = [f"{s.path}:{line}: {what}" for s in scans if s.path not in ALLOWED_TO_READ
             for line, what in s.raw_reads]
    found += [f"{s.path}:{line}: {name} spelled as a constant (use settings.names.{name})"
              for s in scans if s.path not in ALLOWED_TO_READ for line, name in s.declared_twice]
    assert not found, "read AWM_* variables through awm.settings (settings.AWM_X):\n" + "\n".join(found)


def test_the_allow_list_names_files_that_exist() -> None:
    assert not [p for p in ALLOWED_TO_READ if not (ROOT / p).is_file()]


def test_every_settings_attribute_used_is_declared(scans: list[Scan]) -> None:
    found = [f"{s.path}:{line}: {name}" for s in scans for line, name in s.undeclared]
    assert not found, "not declared in awm/settings.py:\n" + "\n".join(found)


def test_every_declared_variable_is_read_somewhere(scans: list[Scan]) -> None:
    read = set(READ_BY_NAME)
    for s in scans:
        read |= s.reads
        if s.path in ALLOWED_TO_READ:
            read |= {name for _, name in s.raw_reads}
    unread = sorted(set(settings.environment_variables) - read)
    assert not unread, f"declared in awm/settings.py but read nowhere: {unread}"
    assert set(READ_BY_NAME) <= set(settings.environment_variables)


def test_a_variable_is_read_when_accessed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWM_HEAD_TIMEOUT_S", "2.5")
    assert settings.AWM_HEAD_TIMEOUT_S == 2.5
    monkeypatch.setenv("AWM_HEAD_TIMEOUT_S", "4")
    assert settings.AWM_HEAD_TIMEOUT_S == 4.0
    monkeypatch.delenv("AWM_HEAD_TIMEOUT_S")
    assert settings.AWM_HEAD_TIMEOUT_S == 10.0


def test_unset_empty_and_given_mappings() -> None:
    var = settings.var
    assert var.AWM_FLEET.get({}) == "" and var.AWM_FLEET.get({"AWM_FLEET": "rl"}) == "rl"
    assert var.AWM_PEERING.get({"AWM_PEERING": ""}) is None        # "" counts as unset...
    assert var.AWM_RELEASE.get({"AWM_RELEASE": ""}) == ""           # ...except where "" is a value
    with pytest.raises(ValueError, match="AWM_METRICS_PORT"):        # and a number fails on it
        var.AWM_METRICS_PORT.get({"AWM_METRICS_PORT": ""})
    assert var.AWM_ALLOWED_HOSTS.get({"AWM_ALLOWED_HOSTS": " a, ,b "}) == ["a", "b"]
    assert var.AWM_ALLOW_WEAK_ISOLATION.get({"AWM_ALLOW_WEAK_ISOLATION": "true"}) is False  # only "1"
    assert var.AWM_LLM_BASE_URL.get({"OPENAI_BASE_URL": "http://o/v1"}) == "http://o/v1"
    assert var.AWM_LLM_BASE_URL.raw({"OPENAI_BASE_URL": "http://o/v1"}) is None
    first = var.AWM_ENVSERVER_RESOURCES.get({})
    first["limits"] = {}
    assert var.AWM_ENVSERVER_RESOURCES.get({})["limits"] == {"cpu": "1", "memory": "1Gi"}  # a fresh copy


def test_names_and_undeclared_names() -> None:
    assert settings.names.AWM_PARENT_PID == "AWM_PARENT_PID"
    for namespace in (settings, settings.var, settings.names):
        with pytest.raises(AttributeError):
            namespace.AWM_NOT_DECLARED  # noqa: B018


def test_the_settings_module_imports_only_the_standard_library() -> None:
    """awm.trainer.venvs runs before the extras are installed; the app probe reads it after confinement."""
    tree = ast.parse((ROOT / "awm" / "settings.py").read_text())
    imported = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert imported <= {"__future__", "json", "os", "sys", "dataclasses", "pathlib", "typing"}
