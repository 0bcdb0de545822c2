"""The compatibility gate (``schemas check``), the published ledger and the upcaster registry."""

from __future__ import annotations

import copy
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from runjournal.cli.schemas import app
from runjournal.schemas import UnsupportedSchemaError, load_versions
from runjournal.schemas.compat import POLICY, check_all
from runjournal.schemas.published import SCHEMAS_DIR, publish, read_ledger, verify_published
from runjournal.schemas.upcasters import UPCASTERS, upcast

V2_RAW = json.loads((SCHEMAS_DIR / "avro" / "envelope" / "v2.avsc").read_text())
CURRENT = load_versions()[-1]
CURRENT_RAW = json.loads(CURRENT.path.read_text())
NEXT = f"v{CURRENT.version + 1}.avsc"
"""The file name of a candidate: the version after the newest published one."""
CANDIDATE = f"candidate:{NEXT}"
PUBLISHED = [v.label for v in load_versions()]


def _field(record: dict[str, Any], name: str) -> dict[str, Any]:
    return next(f for f in record["fields"] if f["name"] == name)


def _payload(schema: dict[str, Any], name: str) -> dict[str, Any]:
    return next(b for b in _field(schema, "payload")["type"] if b["name"] == name)


def _candidate(tmp_path: Path, edit: Callable[[dict[str, Any]], None]) -> Path:
    schema = copy.deepcopy(CURRENT_RAW)
    edit(schema)
    path = tmp_path / NEXT
    path.write_text(json.dumps(schema))
    return path


def _new_required_field(s: dict[str, Any]) -> None:
    _payload(s, "ToolCallIntendedPayload")["fields"].append({"name": "deadline_ms", "type": "long"})


def _seq_as_string(s: dict[str, Any]) -> None:
    _field(s, "seq")["type"] = "string"


def _enum_without_default(s: dict[str, Any]) -> None:
    del _field(s, "type")["type"]["default"]


def _branch_hijack(s: dict[str, Any]) -> None:
    # RunSucceeded's only field is optional, so fastavro would silently read RUN_CANCELLED into it.
    _payload(s, "RunSucceededPayload")["aliases"] = ["RunCancelledPayload"]


def _renamed_branch(s: dict[str, Any]) -> None:
    _payload(s, "NodeStartedPayload")["name"] = "NodeBegunPayload"


def _good_evolution(s: dict[str, Any]) -> None:
    _field(s, "type")["type"]["symbols"].append("RUN_PAUSED")
    _field(s, "payload")["type"].append(
        {"type": "record", "name": "RunPausedPayload", "fields": [{"name": "reason", "type": "string"}]}
    )
    _payload(s, "ToolCallIntendedPayload")["fields"].append(
        {"name": "deadline_ms", "type": ["null", "long"], "default": None}
    )


def test_shipped_schemas_pass() -> None:
    assert POLICY == "FULL_TRANSITIVE"
    assert check_all() == []


@pytest.mark.parametrize(
    ("edit", "field", "words"),
    [
        pytest.param(
            _new_required_field, "Event.payload<ToolCallIntendedPayload>.deadline_ms", "no default", id="req"
        ),
        pytest.param(_seq_as_string, "Event.seq", "cannot be read as string", id="type-change"),
        pytest.param(_enum_without_default, "Event.type", "no default symbol", id="enum-default"),
        pytest.param(
            _branch_hijack, "Event.payload<RunCancelledPayload>", "several reader union branches", id="hijack"
        ),
        pytest.param(_renamed_branch, "Event.payload<NodeStartedPayload>", "matches no branch", id="renamed"),
    ],
)
def test_incompatible_candidate_fails_naming_the_field(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], field: str, words: str
) -> None:
    problems = check_all(candidates=[_candidate(tmp_path, edit)])
    assert any(p.field == field and words in p.message for p in problems), problems
    assert all(CANDIDATE in (p.reader, p.writer) for p in problems)


def _seq_promoted(s: dict[str, Any]) -> None:
    _field(s, "epoch")["type"] = "long"  # int -> long: older writers still read, older readers cannot


def _required_field_dropped(s: dict[str, Any]) -> None:
    _payload(s, "RunFailedPayload")["fields"] = []  # v2 readers need `error` and have no default for it


def _known_type_record_changed(s: dict[str, Any]) -> None:
    _payload(s, "RunFailedPayload")["name"] = "RunFailedPayloadV3"  # a known type's record renamed: no open union


@pytest.mark.parametrize(("edit", "field", "words"), [
    pytest.param(_seq_promoted, "Event.epoch", "long cannot be read as int", id="promotion"),
    pytest.param(_required_field_dropped, "Event.payload<RunFailedPayload>.error", "no default", id="dropped"),
    pytest.param(_known_type_record_changed, "Event.payload<RunFailedPayloadV3>", "matches no branch",
                 id="known-type-record"),
])
def test_forward_break_is_refused_reading_the_newer_writer_with_older_readers(
    tmp_path: Path, edit: Callable[[dict[str, Any]], None], field: str, words: str
) -> None:
    """FULL_TRANSITIVE's forward half: every published reader from v2 must read the candidate writer."""
    problems = check_all(candidates=[_candidate(tmp_path, edit)])
    forward = [p for p in problems if p.writer == CANDIDATE and p.reader == "v2"]
    assert any(p.field == field and words in p.message for p in forward), problems
    assert not [p for p in problems if p.reader == "v1" and p.writer != "-"]  # forward starts at v2


def test_real_resolution_catches_a_silent_wrong_branch(tmp_path: Path) -> None:
    problems = check_all(candidates=[_candidate(tmp_path, _branch_hijack)])
    dynamic = [p for p in problems if "was read as union branch" in p.message]
    assert {(p.writer, p.field) for p in dynamic} == {(v, "Event.payload<RunCancelledPayload>") for v in PUBLISHED}
    assert "runjournal.RunSucceededPayload" in dynamic[0].message


def test_additive_candidate_passes(tmp_path: Path) -> None:
    assert check_all(candidates=[_candidate(tmp_path, _good_evolution)]) == []


def test_unparseable_candidate_is_a_problem(tmp_path: Path) -> None:
    path = tmp_path / "broken.avsc"
    path.write_text('{"type": "record"')
    problems = check_all(candidates=[path])
    assert len(problems) == 1 and "cannot load Avro schema" in problems[0].message


def test_current_schema_must_match_the_python_contract(tmp_path: Path) -> None:
    directory = tmp_path / "envelope"
    directory.mkdir()
    shutil.copy(SCHEMAS_DIR / "avro" / "envelope" / "v1.avsc", directory / "v1.avsc")
    schema = copy.deepcopy(V2_RAW)
    schema["fields"] = [f for f in schema["fields"] if f["name"] != "traceparent"]
    _payload(schema, "RunFailedPayload")["fields"][0]["type"] = "long"
    (directory / "v2.avsc").write_text(json.dumps(schema))
    fields = {p.field for p in check_all(directory=directory)}
    assert "Event.traceparent" in fields
    assert "Event.payload<RunFailedPayload>.error" in fields


# -- CLI ------------------------------------------------------------------------------------


def test_cli_check_passes() -> None:
    result = CliRunner().invoke(app, ["check"])
    assert result.exit_code == 0, result.output
    assert "FULL_TRANSITIVE" in result.output and "ok" in result.output


def test_cli_check_fails_on_candidate_and_names_field(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["check", "--candidate", str(_candidate(tmp_path, _new_required_field))], env={"COLUMNS": "200"}
    )
    assert result.exit_code == 1
    assert "deadline_ms" in result.output


def test_cli_json_report(tmp_path: Path) -> None:
    result = CliRunner().invoke(
        app, ["check", "--json", "--candidate", str(_candidate(tmp_path, _seq_as_string))]
    )
    assert result.exit_code == 1
    report = json.loads(result.output)
    assert report["ok"] is False and report["versions"] == [*PUBLISHED, CANDIDATE]
    assert {
        "writer": "v1",
        "reader": CANDIDATE,
        "field": "Event.seq",
        "message": "writer type long cannot be read as string",
    } in report["problems"]


# -- published ledger -----------------------------------------------------------------------


def test_every_published_version_is_intact() -> None:
    assert verify_published() == []
    ledger = read_ledger()
    assert set(ledger) == {f"avro/envelope/{v.label}.avsc" for v in load_versions()}


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    root = tmp_path / "schemas"
    shutil.copytree(SCHEMAS_DIR / "avro", root / "avro")
    shutil.copy(SCHEMAS_DIR / "published.sha256", root / "published.sha256")
    assert verify_published(root) == []
    return root


def test_edited_published_schema_fails(tree: Path) -> None:
    path = tree / "avro" / "envelope" / "v1.avsc"
    path.write_text(path.read_text().replace("0-based", "zero-based"))  # even a doc edit
    assert verify_published(tree) == [
        "published schema avro/envelope/v1.avsc was edited: add a new version instead"
    ]
    with pytest.raises(Exception, match="was edited"):
        publish(tree)


def test_removed_published_schema_fails(tree: Path) -> None:
    (tree / "avro" / "envelope" / "v2.avsc").unlink()
    assert any("v2.avsc is missing" in p for p in verify_published(tree))


def test_new_version_must_be_published_then_is_frozen(tree: Path) -> None:
    new = tree / "avro" / "envelope" / NEXT
    new.write_text(json.dumps(CURRENT_RAW))
    assert any(f"{NEXT} is not published" in p for p in verify_published(tree))
    assert publish(tree) == [f"avro/envelope/{NEXT}"]
    assert verify_published(tree) == []
    assert publish(tree) == []
    assert f"avro/envelope/{NEXT}" in read_ledger(tree / "published.sha256")


# -- upcasters ------------------------------------------------------------------------------


def test_every_version_step_has_an_upcaster() -> None:
    current = load_versions()[-1].version
    assert set(UPCASTERS) == set(range(1, current))


def test_missing_upcaster_step_is_named() -> None:
    n = CURRENT.version
    with pytest.raises(UnsupportedSchemaError, match=f"no upcaster from envelope v{n} to v{n + 1}"):
        upcast({"type": "RUN_FAILED", "payload": {"error": "e"}}, n, n + 1)


def test_upcaster_v1_to_v2_changes_meaning_only_where_it_changed() -> None:
    intended = {"type": "TOOL_CALL_INTENDED", "payload": {"attempt": 0, "timeout_ms": 7}}
    assert upcast(intended, 1, 2)["payload"] == {"attempt": 1, "timeout_ms": 7000}
    failed = {"type": "NODE_FAILED", "payload": {"node_path": "n", "error": "e", "retryable": False}}
    assert upcast(copy.deepcopy(failed), 1, 2) == failed
    assert upcast(copy.deepcopy(intended), 2, 2) == intended


def test_each_problem_is_reported_once(tmp_path: Path) -> None:
    """Issue 35 case 6: the gate reported every problem twice — the static walk's finding and fastavro's failure to
    resolve the generated records, for the same field of the same pair."""
    problems = check_all(candidates=[_candidate(tmp_path, _seq_as_string)])
    assert problems and not [p for p in problems if "could not resolve generated records" in p.message]
    pairs = [(p.writer, p.reader) for p in problems]
    assert len(pairs) == len(set(pairs)), problems  # one field changed: one problem per pair


def test_cli_publish_with_nothing_new_says_so() -> None:
    """Issue 35 case 8: ``schemas publish`` with nothing to do printed nothing."""
    result = CliRunner().invoke(app, ["publish"], env={"RUNJOURNAL_SCHEMA_REGISTRY_URL": ""})
    assert result.exit_code == 0, result.output
    assert "nothing new" in result.output
