"""The generated wire types match the committed JSON Schemas."""

import json
import time
import typing
from pathlib import Path

import trainstate
from trainstate import types

SCHEMAS = Path(__file__).resolve().parents[2] / "schemas"


def test_every_object_schema_has_a_typed_dict_with_its_keys():
    checked = 0
    for path in sorted(SCHEMAS.glob("*.schema.json")):
        schema = json.loads(path.read_text())
        name = path.name[: -len(".schema.json")]
        if "properties" not in schema:
            continue
        typed = getattr(types, name)
        hints = typing.get_type_hints(typed)
        assert set(hints) == set(schema["properties"]), name
        assert typed.__required_keys__ == frozenset(schema.get("required", [])), name
        checked += 1
    assert checked >= 15


def test_enumerations_are_literals_of_the_wire_spellings():
    assert typing.get_args(types.RunStatus)[:8] == (
        "INITIALIZING", "SCHEDULING", "RUNNING", "RESTARTING", "RESIZING",
        "FINISHED", "ERRORED", "ABORTED",
    )
    assert typing.get_args(types.AttemptStatus) == ("PENDING", "RUNNING", "FINISHED", "ERRORED", "ABORTED")
    assert "USER_INTERRUPT" in typing.get_args(types.CauseKind)


def test_the_package_is_typed():
    assert (Path(trainstate.__file__).parent / "py.typed").exists()


def test_a_registration_preferring_return_minimal_answers_without_the_run(head, name):
    import urllib.request
    import uuid

    run_id = uuid.uuid4().hex
    with open(SCHEMAS.parent / "fixtures" / "ray-v1-run.json") as f:
        run = json.load(f)
    run.update(id=run_id, name=name, start_time_ms=int(time.time() * 1000))
    answers = []
    for _ in range(2):
        req = urllib.request.Request(
            head.url + "/api/train/runs",
            data=json.dumps(run).encode(),
            method="POST",
            headers={"Content-Type": "application/json", "Prefer": "return=minimal"},
        )
        with urllib.request.urlopen(req, timeout=10) as response:
            assert response.headers["Preference-Applied"] == "return=minimal"
            answer: types.RegisterMinimalResponse = json.loads(response.read())
            answers.append((response.status, answer))
    required = types.RegisterMinimalResponse.__required_keys__
    for status, answer in answers:
        assert set(answer) == required, answer
        assert answer["run_id"] == run_id
        assert answer["lease_ms"] > 0
    assert [(s, a["created"]) for s, a in answers] == [(201, True), (200, False)]
    # Stored all the same.
    assert head.get("/api/train/runs/" + run_id)["name"] == name
