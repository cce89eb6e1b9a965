"""The bundle format, its published JSON Schema, and the authoring compiler."""

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from awm import catalog
from awm.bundle import EnvBundle, bundle_json_schema

SCHEMA_FILE = Path(__file__).parents[1] / "awm" / "schema" / "bundle-v1.json"


def test_published_schema_matches_the_models():
    assert json.loads(SCHEMA_FILE.read_text()) == bundle_json_schema(), \
        "run `awm catalog schema -o awm/schema/bundle-v1.json`"


def test_compiled_tool_schema_comes_from_the_signature(notes_bundle):
    add = notes_bundle.tool("add_note")
    assert add.input_schema["required"] == ["title"]
    assert add.input_schema["properties"]["title"] == {"type": "string", "description": "Title, unique among my notes."}
    assert add.input_schema["additionalProperties"] is False
    assert add.description == "Add a note."
    assert "def add_note(db" in add.code
    assert "USER_ID = 1" in notes_bundle.tool_prelude


def test_bundle_round_trips_through_json(notes_bundle):
    again = EnvBundle.model_validate_json(notes_bundle.model_dump_json())
    assert again == notes_bundle
    assert again.database_hash() == notes_bundle.database_hash()


def _raw(bundle: EnvBundle) -> dict:
    return json.loads(bundle.model_dump_json())


@pytest.mark.parametrize("mutate, message", [
    (lambda d: d["tools"].append(dict(d["tools"][0])), "duplicate tool"),
    (lambda d: d["tasks"].append(dict(d["tasks"][0])), "duplicate task"),
    (lambda d: d["tasks"][0]["solution"].append({"tool": "nope", "arguments": {}}), "unknown tool 'nope'"),
    (lambda d: d["tasks"][0]["verifier"].update(entrypoint="missing"), "does not define missing()"),
    (lambda d: d["tools"][0].update(input_schema={"type": "array"}), "type 'object'"),
    (lambda d: d.update(format="awm.bundle/v0"), "awm.bundle/v1"),
    (lambda d: d["scenario"].update(name="Bad Name"), "pattern"),
])
def test_invalid_bundles_are_rejected_with_a_reason(notes_bundle, mutate, message):
    data = _raw(notes_bundle)
    mutate(data)
    with pytest.raises(ValidationError, match=message):
        EnvBundle.model_validate(data)


def test_catalog_lists_broken_bundles_instead_of_hiding_them(tmp_path, notes_bundle):
    (tmp_path / "notes.json").write_text(notes_bundle.model_dump_json())
    (tmp_path / "broken.json").write_text('{"format": "awm.bundle/v1"}')
    entries = {e.name: e for e in catalog.entries(tmp_path)}
    assert entries["notes"].bundle is not None
    assert entries["broken"].bundle is None and "invalid bundle" in entries["broken"].error
    with pytest.raises(catalog.CatalogError, match="broken"):
        catalog.load(tmp_path)
    assert [b.name for b in catalog.load(tmp_path, ["notes"])] == ["notes"]


def test_catalog_archive(tmp_path, notes_bundle):
    import tarfile
    src = tmp_path / "cat"
    src.mkdir()
    (src / "notes.json").write_text(notes_bundle.model_dump_json())
    archive = tmp_path / "cat.tar.gz"
    with tarfile.open(archive, "w:gz") as tf:
        tf.add(src, arcname="cat")
    assert [b.name for b in catalog.load(archive)] == ["notes"]


def test_starter_catalog_size():
    bundles = catalog.load("starter")
    assert len(bundles) >= 3
    for b in bundles:
        assert len(b.tools) >= 20, b.name
        assert len(b.tasks) >= 10, b.name
        assert sum(len(t.rows) for t in b.database.seed) >= 100, b.name
        assert all(t.solution for t in b.tasks), b.name
