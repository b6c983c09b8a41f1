"""The generated wire types match the committed JSON Schemas."""

import json
import typing
from pathlib import Path

import trainstate
from trainstate import _wire

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_every_object_schema_has_a_typed_dict_with_its_keys():
    checked = 0
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        schema = json.loads(path.read_text())
        name = path.name[: -len(".schema.json")]
        if "properties" not in schema:
            continue
        typed = getattr(_wire, name)
        hints = typing.get_type_hints(typed)
        assert set(hints) == set(schema["properties"]), name
        assert typed.__required_keys__ == frozenset(schema.get("required", [])), name
        checked += 1
    assert checked >= 15


def test_enumerations_are_literals_of_the_wire_spellings():
    assert typing.get_args(_wire.RunStatus)[:8] == (
        "INITIALIZING", "SCHEDULING", "RUNNING", "RESTARTING", "RESIZING",
        "FINISHED", "ERRORED", "ABORTED",
    )
    assert typing.get_args(_wire.AttemptStatus) == ("PENDING", "RUNNING", "FINISHED", "ERRORED", "ABORTED")
    assert "USER_INTERRUPT" in typing.get_args(_wire.CauseKind)


def test_the_package_is_typed():
    assert (Path(trainstate.__file__).parent / "py.typed").exists()
