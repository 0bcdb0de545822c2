"""The identifier rules (``runjournal.core.ids``), one test per rule and kind: docs/reference/identifiers.md."""

from __future__ import annotations

import unicodedata
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from runjournal.core import ids
from runjournal.core.errors import RunjournalError
from runjournal.core.ids import (
    CALL_ID,
    NODE_NAME,
    NODE_PATH,
    PRODUCER_ID,
    RULES,
    RUN_ID,
    STEP,
    THREAD_ID,
    USER_ID,
    IdRule,
    InvalidIdError,
)

KINDS = [pytest.param(rule, id=rule.kind.replace(" ", "-")) for rule in RULES]
#: One of every kind of character the control-character rule refuses: C0, C1 (Cc), format (Cf), Zl, Zp.
REFUSED = ["\x00", "\x1f", "\t", "\n", "\r", "\x7f", "\x85", "\x9f", "\u00ad", "\u200b", "\u200d", "\u202e", "\u2066",
           "\ufeff", "\u2028", "\u2029", "\U000e0001"]


def _refused(rule: IdRule, value: object) -> InvalidIdError:
    with pytest.raises(InvalidIdError) as exc:
        rule.check(value)
    return exc.value


@pytest.mark.parametrize("rule", KINDS)
def test_a_valid_id_passes_unchanged(rule: IdRule) -> None:
    for value in ("run-1", "a b", "Ünïcødé-名前", "emoji-🚀", "x" * rule.max_bytes):
        assert rule.check(value) is value


@pytest.mark.parametrize("rule", KINDS)
def test_rule_text_a_non_str_is_refused(rule: IdRule) -> None:
    for value in (b"run-1", 7, None, ["a"]):
        err = _refused(rule, value)
        assert err.rule == "text" and err.kind == rule.kind and "pass the" in str(err)


@pytest.mark.parametrize("rule", KINDS)
def test_rule_empty(rule: IdRule) -> None:
    if rule.empty_ok:
        assert rule.check("") == ""
    else:
        err = _refused(rule, "")
        assert err.rule == "empty" and "non-empty" in str(err)


@pytest.mark.parametrize("rule", KINDS)
def test_rule_lone_surrogate(rule: IdRule) -> None:
    err = _refused(rule, "ab\udcff")  # what os.fsdecode gives a non-UTF-8 byte of a command line
    assert err.rule == "lone surrogate" and "U+DCFF" in str(err) and "index 2" in str(err)


@pytest.mark.parametrize("rule", KINDS)
def test_rule_too_long_counts_utf8_bytes(rule: IdRule) -> None:
    assert rule.check("é" * (rule.max_bytes // 2)) is not None  # 2 bytes each: exactly at the limit
    err = _refused(rule, "é" * (rule.max_bytes // 2) + "x")
    assert err.rule == "too long" and f"at most {rule.max_bytes}" in str(err)
    long = _refused(rule, "x" * (rule.max_bytes + 1))
    assert "x" * 77 + "..." in str(long) and "x" * 78 not in str(long)  # a long value is shown cut, not whole


@pytest.mark.parametrize("rule", KINDS)
@pytest.mark.parametrize("ch", REFUSED, ids=[f"U+{ord(c):04X}" for c in REFUSED])
def test_rule_control_characters(rule: IdRule, ch: str) -> None:
    for value in (f"a{ch}b", ch, f"ab{ch}"):
        err = _refused(rule, value)
        assert err.rule == "control character" and f"U+{ord(ch):04X}" in str(err)
        assert "remove control" in str(err)


@pytest.mark.parametrize(("rule", "chars"), [
    (RUN_ID, "{}"), (THREAD_ID, "{}"), (NODE_NAME, "/#"), (PRODUCER_ID, "#{}"), (CALL_ID, "|/"),
])
def test_rule_reserved_characters(rule: IdRule, chars: str) -> None:
    for ch in chars:
        err = _refused(rule, f"a{ch}b")
        assert err.rule == "reserved character" and repr(ch) in str(err)
        assert rule.why_reserved.split(" ")[0] in str(err)  # the reason is in the message


def test_what_each_kind_allows_that_others_reserve() -> None:
    assert RUN_ID.check("tenant/run:1#2|x") == "tenant/run:1#2|x"  # ':' parses from the right in record keys
    assert STEP.check("call/#1") == "call/#1"  # its key path "#call/#1" never equals a node path
    assert NODE_PATH.check("outer/inner#2") == "outer/inner#2" and NODE_PATH.check("#step") == "#step"
    assert USER_ID.check("ana@example.com") == "ana@example.com"
    assert PRODUCER_ID.check("agent-7.eu") == "agent-7.eu"


def test_the_error_is_a_named_runjournal_error_and_a_value_error() -> None:
    err = _refused(RUN_ID, "k\x1fn")
    assert isinstance(err, RunjournalError) and isinstance(err, ValueError)
    assert err.kind == "run id" and err.value == "k\x1fn" and err.rule == "control character"
    text = str(err)
    assert text.startswith("run id 'k\\x1fn' is refused (control character: U+001F (Cc) at index 1)")
    assert "docs/reference/identifiers.md" in text


def test_the_optional_check_takes_none() -> None:
    assert USER_ID.check_optional(None) is None
    assert USER_ID.check_optional("u1") == "u1"
    with pytest.raises(InvalidIdError):
        USER_ID.check_optional("")


def test_a_lookup_reaches_data_written_before_the_rules() -> None:
    """Inspect, replay, approve and erase look up any id a run was started with: only not-text is refused."""
    for legacy in ("k\x1fn", "r{1}", "x" * 10_000, "a\nb"):
        assert RUN_ID.check_lookup(legacy) == legacy
    for rule_name, value in (("empty", ""), ("lone surrogate", "\udc80"), ("text", 3)):
        with pytest.raises(InvalidIdError) as exc:
            RUN_ID.check_lookup(value)
        assert exc.value.rule == rule_name


def test_every_kind_is_documented() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "reference" / "identifiers.md").read_text()
    for rule in RULES:
        assert f"| {rule.kind} |" in page, rule.kind
        assert f"| {rule.max_bytes} |" in page or f"| {rule.max_bytes:,} |" in page, rule.kind
    assert set(ids.__all__) >= {"InvalidIdError", "IdRule", "RULES"}


@given(st.text())
def test_any_text_is_either_refused_by_name_or_free_of_every_refused_character(value: str) -> None:
    """The property the key derivations rest on: an accepted id holds no U+001F, no control, format or separator
    character, and encodes to UTF-8."""
    for rule in RULES:
        try:
            rule.check(value)
        except InvalidIdError as exc:
            assert exc.rule in {"empty", "lone surrogate", "too long", "control character", "reserved character"}
            continue
        value.encode("utf-8")
        assert "\x1f" not in value
        assert not any(unicodedata.category(c) in {"Cc", "Cf", "Zl", "Zp"} for c in value)
        assert not any(c in rule.reserved for c in value)
