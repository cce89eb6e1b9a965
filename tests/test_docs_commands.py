"""Every command block of README.md and docs/ says whether the tests run it, and which.

A shell block (```bash) is preceded by one HTML comment, invisible on the rendered page:

    <!-- commands run by tests/test_cli.py::test_serve_prints_urls_serves_and_cleans_up (other sizes) -->
    <!-- commands run by .ci/run -->
    <!-- commands not run by the tests: they need GPUs and Qwen3's weights -->

``run by`` names the tests (``file::function``, or ``.ci/run``) that run the block's commands,
with what they do differently in parentheses; each must exist. ``not run by the tests`` gives the
reason. So a new block cannot land without saying how it is covered, and a renamed test cannot
leave a page claiming coverage it lost.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?:bash|sh|shell|console)\s*$")
DECLARED = re.compile(r"^<!-- commands (run by (?P<refs>.+?)|not run by the tests: (?P<why>.{12,}?)) -->$")
REF = re.compile(r"(?P<path>(?:tests/[\w/]+\.py|\.ci/run))(?:::(?P<func>\w+))?")


def blocks() -> list[tuple[str, int, str]]:
    """(page, line of the fence, the line before it) for every shell block."""
    out = []
    for page in PAGES:
        lines = page.read_text().splitlines()
        inside = False
        for n, line in enumerate(lines):
            if line.startswith("```"):
                if not inside and FENCE.match(line):
                    out.append((str(page.relative_to(ROOT)), n + 1, lines[n - 1].strip() if n else ""))
                inside = not inside
    return out


def functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree) if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))}


def test_every_command_block_says_how_the_tests_cover_it() -> None:
    found = blocks()
    assert len(found) > 30  # the pages have their blocks (a broken fence pattern would find none)
    problems = []
    for page, line, before in found:
        declared = DECLARED.match(before)
        if declared is None:
            problems.append(f"{page}:{line}: no `<!-- commands run by ... -->` or `<!-- commands not run by the "
                            f"tests: why -->` line before the block")
            continue
        if declared.group("why"):
            continue
        refs = list(REF.finditer(declared.group("refs")))
        if not refs:
            problems.append(f"{page}:{line}: `run by` names no test (tests/x.py::function or .ci/run)")
        for ref in refs:
            path = ROOT / ref.group("path")
            if not path.is_file():
                problems.append(f"{page}:{line}: {ref.group('path')} does not exist")
            elif ref.group("func") and ref.group("func") not in functions(path):
                problems.append(f"{page}:{line}: {ref.group('path')} has no {ref.group('func')}")
    assert not problems, "\n".join(problems)


def test_a_block_without_a_declaration_or_with_a_lost_test_is_caught(tmp_path, monkeypatch) -> None:
    page = tmp_path / "page.md"
    page.write_text("text\n```bash\nawm x\n```\n<!-- commands run by tests/test_cli.py::no_such_test -->\n"
                    "```bash\nawm y\n```\n" + "<!-- commands not run by the tests: a reason long enough -->\n```bash\nz\n```\n"
                    * 30)
    monkeypatch.setattr(sys.modules[__name__], "PAGES", [page])
    monkeypatch.setattr(sys.modules[__name__], "ROOT", tmp_path)
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "test_cli.py").write_text("def test_other():\n    pass\n")
    try:
        test_every_command_block_says_how_the_tests_cover_it()
    except AssertionError as exc:
        assert "page.md:2: no `<!-- commands" in str(exc) and "has no no_such_test" in str(exc)
    else:
        raise AssertionError("an undeclared block and a lost test passed")
