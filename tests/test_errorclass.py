"""The error classes are defined once (awm/errorclass.py) and every layer derives from it: a class
added there and missed anywhere fails here."""

from __future__ import annotations

import re
from pathlib import Path

from awm.episode.reward import AGENT_TOOL_ERRORS, INFRA_TOOL_ERRORS, RewardConfig, score
from awm.errorclass import AGENT_FAULTS, CLASSES, ENVIRONMENT_FAULTS, ErrorClass, parse

ROOT = Path(__file__).resolve().parent.parent
# The product's code (not tests, not the definition itself), where a class must never be spelled
# as a string: it is read from awm.errorclass.
PRODUCT = [p for d in ("awm", "envserver", "integrations", "trainer", "operator", "ui") for p in (ROOT / d).rglob("*")
           if p.suffix in (".py", ".js") and p.name != "errorclass.py"]


def test_every_class_has_its_meaning_and_mappings():
    assert set(CLASSES) == set(ErrorClass)
    assert AGENT_FAULTS | ENVIRONMENT_FAULTS == set(ErrorClass) and not AGENT_FAULTS & ENVIRONMENT_FAULTS
    for cls, info in CLASSES.items():
        assert info.meaning and info.openenv and info.mcp_error_type, cls
        assert parse(f"{cls.value}: something went wrong") is cls and parse(cls.value) is cls
    assert parse("not_a_class: x") is None and parse(None) is None


def test_the_reward_charges_or_masks_every_class():
    """Each class the server raises is charged to the agent or masks the episode; none is ignored
    (a class missing from the reward's lists was neither, silently corrupting the signal)."""
    for cls, info in CLASSES.items():
        if info.raised_by != "server":
            continue
        masked = score({"verdict": "complete"}, [cls.value], 0, cfg=RewardConfig(tool_error_penalty=0.25))
        if info.fault == "environment":
            assert cls.value in INFRA_TOOL_ERRORS and masked.masked, cls
        else:
            assert cls.value in AGENT_TOOL_ERRORS and not masked.masked and masked.reward == 0.75, cls


def test_no_product_code_spells_a_class():
    """Every use reads the enum: a literal would be a second definition that nothing keeps in step.
    (``timeout`` is also a verdict's and a worker's word, ``malformed`` a parsed call's flag; the
    worker's own reply kinds are its protocol, which the tool runtime maps to classes.)"""
    common = (ErrorClass.TIMEOUT, ErrorClass.MALFORMED)
    spelled = re.compile(r"""["'](%s)["']""" % "|".join(re.escape(c.value) for c in ErrorClass if c not in common))
    product = [p for p in PRODUCT if p.relative_to(ROOT).as_posix() != "awm/sandbox/worker.py"]
    found = [f"{p.relative_to(ROOT)}:{n}: {line.strip()}" for p in product
             for n, line in enumerate(p.read_text(errors="replace").splitlines(), 1) if spelled.search(line)]
    assert not found, "error classes spelled outside awm/errorclass.py:\n" + "\n".join(found)


def test_the_docs_name_every_class():
    docs = (ROOT / "docs" / "serving.md").read_text() + (ROOT / "docs" / "integrations.md").read_text()
    missing = [c.value for c in ErrorClass if f"`{c.value}`" not in docs]
    assert not missing, f"docs/serving.md and docs/integrations.md do not name: {missing}"
