"""Pure parts of "after the effect": recordable results round-trip, and which tool failures are unknown."""

from __future__ import annotations

import datetime as dt
import decimal
import http.client
import json
from typing import Any

import httpx
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from runjournal.producers import ToolOutcomeUnknownError
from runjournal.producers._recorded import record_value
from runjournal.producers._unknown import outcome_unknown

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.tuples(inner, inner)
    | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)


def _listify(value: Any) -> Any:
    if isinstance(value, list | tuple):
        return [_listify(v) for v in value]
    if isinstance(value, dict):
        return {k: _listify(v) for k, v in value.items()}
    return value


@settings(max_examples=400, deadline=None)
@given(json_values)
def test_a_recordable_value_reads_back_as_what_the_caller_receives(value: Any) -> None:
    recorded = record_value(value)
    assert recorded.problem is None and recorded.text is not None
    assert json.loads(recorded.text) == recorded.value == _listify(value)
    assert record_value(recorded.value).text == recorded.text  # a resumed run records the same text
    recorded.text.encode("utf-8")


@pytest.mark.parametrize(("value", "where"), [
    ({1: "x", "total": 2}, "result: key 1"),
    ({1: "x"}, "result: key 1"),
    ("caf\udce9", "result: text with a lone surrogate"),
    ({"a": ["ok", "\udc80"]}, "result['a'][1]"),
    (float("nan"), "result: nan"),
    ([1.0, float("inf")], "result[1]: inf"),
    (dt.datetime(2026, 1, 1), "result: a datetime"),
    ({"n": decimal.Decimal("1.5")}, "result['n']: a Decimal"),
    ({"s": {1, 2}}, "result['s']: a set"),
    (b"bytes", "result: a bytes"),
])
def test_a_value_json_cannot_carry_exactly_is_refused_with_its_place(value: Any, where: str) -> None:
    recorded = record_value(value)
    assert recorded.text is None and recorded.problem is not None and recorded.problem.startswith(where)


class Definite(RuntimeError):
    outcome_unknown = False


def _chained(outer: BaseException, inner: BaseException) -> BaseException:
    try:
        try:
            raise inner
        except BaseException as exc:
            raise outer from exc
    except BaseException as caught:
        return caught


@pytest.mark.parametrize(("exc", "unknown"), [
    (ToolOutcomeUnknownError("no answer"), True),
    (TimeoutError("read timed out"), True),
    (TimeoutError("timed out"), True),  # socket.timeout, asyncio.TimeoutError
    (ConnectionResetError("reset by peer"), True),
    (BrokenPipeError(), True),
    (http.client.RemoteDisconnected("closed"), True),
    (httpx.ReadTimeout("read"), True),
    (httpx.RemoteProtocolError("bad"), True),
    (httpx.ConnectTimeout("connect"), False),
    (httpx.ConnectError("refused"), False),
    (ConnectionRefusedError(), False),
    (RuntimeError("seat unavailable"), False),
    (ValueError("bad args"), False),
    (_chained(RuntimeError("booking failed"), TimeoutError("read timed out")), True),
    (_chained(Definite("rejected, nothing done"), TimeoutError("slow")), False),
])
def test_which_tool_failures_leave_the_outcome_unknown(exc: BaseException, unknown: bool) -> None:
    assert outcome_unknown(exc) is unknown
