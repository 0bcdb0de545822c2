"""What enters a digest or a key is canonical or refused (``runjournal.producers._digest``; issue 28, case 2).

* the idempotency key's preimage is injective on what validation accepts (property over arbitrary Unicode), and
  the key of a valid input is the one the first build derived (runs in flight across the upgrade keep their keys);
* call arguments and run inputs have exactly one canonical JSON text, or ``NonCanonicalValueError`` names why.
"""

from __future__ import annotations

import hashlib
import json
import math
from datetime import UTC, datetime
from decimal import Decimal
from enum import IntEnum, StrEnum
from typing import Any

import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from runjournal.core.ids import InvalidIdError
from runjournal.producers import NonCanonicalValueError, canonical_json, enter_node, idempotency_key
from runjournal.producers._digest import canonical_value, key_preimage


def first_build_key(run_id: str, node_path: str, call_index: int) -> str:
    """The key as the first build wrote it (``runjournal.call.v1``), kept here as the reference."""
    raw = f"runjournal.call.v1\x1f{run_id}\x1f{node_path}\x1f{call_index}"
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()[:32]


def decode_preimage(raw: bytes) -> tuple[str, str, int]:
    """The left inverse of ``key_preimage``: its existence on accepted inputs is the injectivity argument."""
    head, run_id, node_path, index = raw.decode("utf-8").split("\x1f")
    assert head == "runjournal.call.v1" and index == str(int(index))
    return run_id, node_path, int(index)


def test_valid_inputs_keep_the_first_builds_keys() -> None:
    assert idempotency_key("run-1", "trip/book#2", 3) == "29c48b8b2759142a429c7148e9ab59ef"
    for args in (("run-1", "trip/book#2", 3), ("a:b", "", 1), ("Ünï 🚀", "#toolu_01", 1), ("r", "x/y#9", 10**9)):
        assert idempotency_key(*args) == first_build_key(*args)


def test_the_reproduced_collision_is_refused_on_both_sides() -> None:
    assert first_build_key("k\x1fn", "x", 1) == first_build_key("k", "n\x1fx", 1)  # the bug, as it was
    for args in (("k\x1fn", "x", 1), ("k", "n\x1fx", 1)):
        with pytest.raises(InvalidIdError) as exc:
            key_preimage(*args)
        assert exc.value.rule == "control character"


@pytest.mark.parametrize("index", [0, -1, True, 1.0, "1"])
def test_a_call_index_is_an_int_from_one(index: Any) -> None:
    with pytest.raises(ValueError, match="call_index"):
        key_preimage("r", "", index)


def test_an_int_subclass_index_is_written_as_its_number() -> None:
    class Index(IntEnum):
        FIRST = 1

    assert key_preimage("r", "", Index.FIRST) == key_preimage("r", "", 1)


# --------------------------------------------------------------------------- the property (issue 28, item 5)

indexes = st.integers(min_value=-3, max_value=2**70)


def _preimage_or_refusal(run_id: str, node_path: str, index: int) -> bytes | None:
    try:
        return key_preimage(run_id, node_path, index)
    except InvalidIdError:
        return None
    except ValueError as exc:
        assert "call_index" in str(exc) and index < 1
        return None


@given(st.text(), st.text(), indexes)
def test_any_input_is_refused_by_name_or_decodes_back_to_itself(run_id: str, node_path: str, index: int) -> None:
    raw = _preimage_or_refusal(run_id, node_path, index)
    if raw is not None:
        assert decode_preimage(raw) == (run_id, node_path, index)
        assert idempotency_key(run_id, node_path, index) == first_build_key(run_id, node_path, index)


_SEPARATED = st.text(alphabet=st.sampled_from(["k", "n", "x", "/", "#", "\x1f", ":", "é"]), max_size=6)


@given(st.tuples(_SEPARATED, _SEPARATED, st.integers(1, 3)), st.tuples(_SEPARATED, _SEPARATED, st.integers(1, 3)))
def test_distinct_accepted_inputs_never_share_a_preimage(a: tuple[str, str, int], b: tuple[str, str, int]) -> None:
    """Pairs drawn from a small alphabet rich in separators (so near-collisions like the bug's are common): when
    both are accepted, distinct inputs give distinct preimages. Where the first build's join collided, at least
    one of the two is refused now."""
    assume(a != b)
    pa, pb = _preimage_or_refusal(*a), _preimage_or_refusal(*b)
    if pa is not None and pb is not None:
        assert pa != pb
    if first_build_key(*a) == first_build_key(*b):
        assert pa is None or pb is None


@given(st.text(), st.text())
def test_a_node_path_built_by_enter_node_is_accepted_by_the_key(parent: str, name: str) -> None:
    """Every path ``enter_node`` hands out is a node path the key accepts; a name it refuses is not counted."""
    entries: dict[str, dict[str, int]] = {}
    try:
        first = enter_node(entries, "", "outer")
        path = enter_node(entries, first, name)
    except InvalidIdError:
        assert entries == {"": {"outer": 1}}
        return
    assert path == f"outer/{name}" and "/" not in name and "#" not in name
    assert decode_preimage(key_preimage("run", path, 1))[1] == path
    assert enter_node(entries, first, name) == f"outer/{name}#2"


def test_enter_node_refuses_by_name_and_counts_nothing() -> None:
    entries: dict[str, dict[str, int]] = {}
    for bad in ("", "a/b", "a#2", "n\x1fx", "tab\t", "x" * 129):
        with pytest.raises(InvalidIdError, match="node name"):
            enter_node(entries, "", bad)
    assert entries == {}
    deep = ""
    with pytest.raises(InvalidIdError, match="node path"):
        for _ in range(40):
            deep = enter_node(entries, deep, "n" * 100)
    assert enter_node({}, "", "book") == "book"


# --------------------------------------------------------------------------- values entering a digest (item 4)

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(st.characters(blacklist_categories=("Cs",))),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_a_json_value_has_the_text_the_first_build_wrote(value: Any) -> None:
    """Canonical by construction: the digest of valid arguments is unchanged across the upgrade, and the text reads
    back to an equal value in any process (json, orjson)."""
    import orjson

    text = canonical_value(value, "args")
    assert text == canonical_json(value)
    assert json.loads(text) == value
    assert orjson.loads(text) == json.loads(text)


class Colour(StrEnum):
    RED = "red"


@pytest.mark.parametrize(("value", "where"), [
    ({"x": float("nan")}, "args['x']: nan"),
    ({"x": [1, math.inf]}, "args['x'][1]: inf"),
    ({"when": {1, 2}}, "args['when']: a set"),
    ({"b": b"\x00"}, "args['b']: a bytes"),
    ({"t": datetime(2026, 1, 1, tzinfo=UTC)}, "args['t']: a datetime"),
    ({"d": Decimal("1.1")}, "args['d']: a Decimal"),
    ({"o": object()}, "args['o']: a object"),
    ({1: "one"}, "args: key 1 (int) is not a string"),
    ({"n": 2**64}, "args['n']: the integer 18446744073709551616 is outside"),
    ({"n": -(2**63) - 1}, "args['n']: the integer"),
    ({"n": 10**5000}, "of 16610 bits"),  # beyond int_max_str_digits: named, not a ValueError from json
    ({"s": "a\udcff"}, "args['s']: text with a lone surrogate"),
    ({"k\udcff": 1}, "args key: text with a lone surrogate"),
])
def test_a_value_without_one_canonical_text_is_refused_by_name(value: Any, where: str) -> None:
    with pytest.raises(NonCanonicalValueError) as exc:
        canonical_value(value, "args")
    assert where in str(exc.value) and exc.value.what == "args" and where.split(": ")[0] in exc.value.problem
    assert isinstance(exc.value, ValueError)


def test_what_canonicalises_by_construction() -> None:
    """A tuple is a JSON array (as a recorded result reads back), dict key order does not matter, str and int
    enums are their values, the 64-bit bounds are accepted."""
    assert canonical_value({"xs": (1, 2)}, "args") == canonical_value({"xs": [1, 2]}, "args") == '{"xs":[1,2]}'
    assert canonical_value({"b": 1, "a": 2}, "args") == '{"a":2,"b":1}'
    assert canonical_value({"c": Colour.RED}, "args") == '{"c":"red"}'
    assert canonical_value([-(2**63), 2**64 - 1, 0.1, -0.0, 1e300], "input") == \
        "[-9223372036854775808,18446744073709551615,0.1,-0.0,1e+300]"
    assert canonical_value({"é": "名前"}, "input") == '{"é":"名前"}'
