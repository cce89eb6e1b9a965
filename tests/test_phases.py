"""The operator's status words live in awm_operator/phases.py and nowhere else.

A phase, a condition type or a reason spelled as a literal in another module is one that a
rename or a new member misses (the CRD's schema, the metrics, the readers): this test reads every
module of the operator and fails on such a literal. Kubernetes' own words that happen to be
spelled the same (a Pod's phase, a Job's condition types, metav1's status "Unknown", a printer
column's title) are listed below with the reason they are not ours.
"""

from __future__ import annotations

import ast
import enum
from pathlib import Path

from awm_operator import conditions, phases
from awm_operator.crds import CampaignStatus, EnvClaimStatus, ShardStatus

OPERATOR = Path(__file__).resolve().parent.parent / "operator" / "awm_operator"

# (module, word): why the literal is Kubernetes', not the operator's
KUBERNETES_WORDS = {
    ("pods.py", "Ready"): "a Pod's Ready condition",
    ("pods.py", "Pending"): "a Pod's phase",
    ("pods.py", "Failed"): "a Pod's phase",
    ("pods.py", "Succeeded"): "a Pod's phase",
    ("campaign_manifests.py", "Complete"): "a Job's condition type",
    ("campaign_manifests.py", "Failed"): "a Job's condition type",
    ("conditions.py", "Unknown"): "metav1.ConditionStatus",
    ("crds.py", "Unknown"): "metav1.ConditionStatus",
    ("crds.py", "Ready"): "the title of a printer column (kubectl get envfleets)",
}


def _words() -> set[str]:
    return {m.value for v in vars(phases).values()
            if isinstance(v, type) and issubclass(v, enum.Enum) and v.__module__ == phases.__name__ for m in v}


def _literals(path: Path) -> list[tuple[int, str]]:
    """String constants of a module, docstrings left out."""
    tree = ast.parse(path.read_text())
    docstrings = {id(node.body[0].value) for node in ast.walk(tree)
                  if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef))
                  and node.body and isinstance(node.body[0], ast.Expr) and isinstance(node.body[0].value, ast.Constant)}
    return [(node.lineno, node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docstrings]


def test_no_status_word_is_spelled_outside_phases() -> None:
    words = _words()
    assert {"Bound", "Degraded", "Succeeded", "DatabaseAvailable", "InstancesLost", "ShardLost"} <= words
    found = [f"{path.name}:{line}: {value!r}" for path in sorted(OPERATOR.glob("*.py")) if path.name != "phases.py"
             for line, value in _literals(path) if value in words and (path.name, value) not in KUBERNETES_WORDS]
    assert not found, "use the member of awm_operator.phases instead: " + "; ".join(found)


def test_the_status_models_take_their_phases_from_phases() -> None:
    """The CRDs' schemas enumerate exactly the enums' members: a member added is a phase the API
    server accepts."""
    for model, field, kind in ((EnvClaimStatus, "phase", phases.ClaimPhase), (CampaignStatus, "phase", phases.CampaignPhase),
                               (ShardStatus, "state", phases.ShardState)):
        schema = model.model_json_schema(by_alias=True)
        prop = schema["properties"][field]
        enum_of = prop.get("enum") or schema["$defs"][prop["$ref"].rsplit("/", 1)[1]]["enum"]
        assert enum_of == [m.value for m in kind], (model.__name__, field)


def test_every_claim_phase_has_its_conditions() -> None:
    """conditions.claim_conditions maps each phase of an EnvClaim (a phase left out would raise
    KeyError the first time a claim reached it)."""
    for phase in phases.ClaimPhase:
        bound, degraded = conditions.claim_conditions(phase, "m")
        assert (bound.type, degraded.type) == (phases.ConditionType.BOUND, phases.ConditionType.DEGRADED)
        assert bound.reason in set(phases.ClaimReason) and degraded.reason in set(phases.ClaimReason)
