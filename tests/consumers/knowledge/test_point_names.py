"""Knowledge section keys and point ids are injective (issue 28, case 2), and unchanged for the documents whose
paths and headings hold none of the characters that made them ambiguous."""

from __future__ import annotations

import uuid

from hypothesis import given
from hypothesis import strategies as st

from runjournal.consumers.knowledge.sections import Section
from runjournal.consumers.knowledge.store import _NS, point_name


def _section(*heading_path: str, ordinal: int = 0) -> Section:
    return Section(heading=heading_path[-1], heading_path=heading_path, level=len(heading_path), text="t",
                   ordinal=ordinal)


def test_plain_headings_and_paths_keep_their_keys_and_ids() -> None:
    section = _section("Airline Agent Policy", "Book flight", "C# and F# tips")
    assert section.key == "Airline Agent Policy / Book flight / C# and F# tips#0"
    name = point_name("/docs/policy.md", section.key, "ab" * 32, 3)
    assert name == f"/docs/policy.md#{section.key}#{'ab' * 32}#3"  # the name ids were derived from before
    assert str(uuid.uuid5(_NS, name)) == str(uuid.uuid5(_NS, f"/docs/policy.md#{section.key}#{'ab' * 32}#3"))


def test_a_slash_inside_a_heading_no_longer_joins_two_paths() -> None:
    assert _section("In / out").key != _section("In", "out").key
    assert _section("In", "out").key == "In / out#0"


def test_a_hash_in_a_path_no_longer_joins_two_documents() -> None:
    sha = "0" * 64
    a = point_name("/d/a.md", _section("x#y").key, sha, 0)
    b = point_name("/d/a.md#x", _section("y").key, sha, 0)
    before = f"/d/a.md#{_section('x#y').key}#{sha}#0"
    assert before == f"/d/a.md#x#{_section('y').key}#{sha}#0"  # the two documents' passages shared one point id
    assert a != b and b.startswith("runjournal.knowledge.v2:9:/d/a.md#x#")


headings = st.lists(st.text(st.sampled_from(["a", " ", "/", "\\", "#"]), min_size=1, max_size=4), min_size=1,
                    max_size=3)


@given(headings, headings, st.integers(0, 2), st.integers(0, 2))
def test_section_keys_are_injective(a: list[str], b: list[str], oa: int, ob: int) -> None:
    if (a, oa) != (b, ob):
        assert _section(*a, ordinal=oa).key != _section(*b, ordinal=ob).key


paths = st.text(st.sampled_from(["/", "d", "#", "\\", ":"]), min_size=1, max_size=5).map(lambda p: "/" + p)


@given(paths, headings, paths, headings, st.integers(0, 1), st.integers(0, 1))
def test_point_names_are_injective(pa: str, ha: list[str], pb: str, hb: list[str], ia: int, ib: int) -> None:
    sha = "f" * 64
    if (pa, ha, ia) != (pb, hb, ib):
        assert point_name(pa, _section(*ha).key, sha, ia) != point_name(pb, _section(*hb).key, sha, ib)
