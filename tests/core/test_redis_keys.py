"""The Redis key rule (``runjournal.core.redis_keys``): keys one script or MULTI touches share a hash slot;
globs (scans, ACL key patterns) match one prefix's keys and no other's; no key name is spelled elsewhere.

On the old layout ``{prefix}:lease:{instance}`` and ``{prefix}:owned:{instance}`` hashed to different slots, so
the compare-and-set that owns a run while the lease is ours — and the hand-over MULTI — were refused by a
Redis Cluster (redis-py: "all keys must map to the same key slot"). The real-cluster runs are in
``tests/cluster/test_redis_cluster.py``.
"""

from __future__ import annotations

import re
import uuid
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from redis.crc import key_slot

from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys, glob_escape
from runjournal.core.settings import Settings

ROOT = Path(__file__).resolve().parents[2]
prefixes = st.from_regex(r"[A-Za-z0-9._-]{1,20}", fullmatch=True)
names = st.text(st.characters(blacklist_categories=("Cs",)), min_size=1, max_size=30)


def _slot(key: str) -> int:
    return int(key_slot(key.encode()))


@given(prefixes, names, st.integers(1, 40))
@settings(max_examples=300, deadline=None)
def test_an_instances_keys_share_one_slot(prefix: str, name: str, incarnation: int) -> None:
    """Own a run while the lease is ours (lease + owned set, one script); hand a run over (owned set + assignment
    list, one script): every key of one instance, any producer_id, maps to one slot."""
    keys = RedisKeys(prefix)
    instance = name if incarnation == 1 else f"{name}#{incarnation}"
    assert len({_slot(keys.lease(instance)), _slot(keys.owned(instance)), _slot(keys.assign(instance))}) == 1


@given(prefixes, names, st.integers(0, 9999))
@settings(max_examples=300, deadline=None)
def test_a_partitions_and_a_runs_keys_share_one_slot(prefix: str, run_id: str, partition: int) -> None:
    keys = RedisKeys(prefix)
    assert len({_slot(keys.offset(partition)), _slot(keys.runs(partition)), _slot(keys.run(partition, run_id))}) == 1
    assert len({_slot(keys.plan(run_id)), _slot(keys.approvals(run_id)), _slot(keys.claim(run_id))}) == 1
    assert _slot(keys.demo("queue")) == _slot(keys.demo(f"claimed:{run_id}"))  # the demo's LMOVE
    assert _slot(keys.control_requests()) == _slot(keys.control_version())  # a request and its version: one script


def test_the_old_layout_was_cross_slot() -> None:
    """What the tags fix (the keys as they were before this change)."""
    assert _slot("runjournal:lease:agent-7") != _slot("runjournal:owned:agent-7")
    keys = RedisKeys("runjournal")
    assert _slot(keys.lease("agent-7")) == _slot(keys.owned("agent-7"))


def test_partition_tags_are_unchanged() -> None:
    """The projector's keys keep the first build's names (``rj:{P.p<n>}``): a projection survives the upgrade."""
    keys = RedisKeys("acme")
    assert (keys.offset(3), keys.runs(3), keys.run(3, "r1")) == ("rj:{acme.p3}:offset", "rj:{acme.p3}:runs",
                                                                 "rj:{acme.p3}:run:r1")


def test_glob_escape_and_instance_of() -> None:
    keys = RedisKeys("acme")
    assert glob_escape("a*b?[c]\\") == "a\\*b\\?\\[c\\]\\\\"
    assert keys.instance_of(keys.lease("agent-7#2").encode(), "lease") == "agent-7#2"
    assert keys.instance_of(keys.owned("agent-7"), "lease") is None


@pytest.mark.integration
def test_globs_match_one_prefix_and_no_neighbour(settings: Settings) -> None:
    """Redis's own SCAN MATCH: each prefix's globs (cleanup, wipe, ACL patterns) find every key of that prefix and
    none of a prefix that extends it (``P.p1`` — whose projection keys begin like ``P``'s — ``P-x``, ``P.x``)."""
    base = f"g{uuid.uuid4().hex[:8]}"
    r = redis_client.client(settings)
    made: dict[str, set[str]] = {}
    for prefix in (base, f"{base}.p1", f"{base}-x", f"{base}.x"):
        keys = RedisKeys(prefix)
        made[prefix] = {keys.offset(1), keys.run(12, "r"), keys.runs(345), keys.topic_identity(), keys.parked(),
                        keys.lease("a*1"), keys.owned("a#2"), keys.incarnation("a"), keys.plan("r"), keys.claim("r"),
                        keys.approvals_pending(), keys.result("ab" * 32), keys.projector_lag(), keys.demo("queue"),
                        keys.control_requests(), keys.control_version(), keys.archive_due(),
                        keys.archive_runs()}
        for key in made[prefix]:
            r.set(key, "1")
    try:
        for prefix, expected in made.items():
            keys = RedisKeys(prefix)
            found = {k.decode() for pattern in keys.patterns() for k in redis_client.scan_keys(r, pattern)}
            assert found == expected, prefix
            partitions = {k.decode() for g in keys.partition_globs() for k in redis_client.scan_keys(r, g)}
            assert partitions == {keys.offset(1), keys.run(12, "r"), keys.runs(345)}
            leases = {k.decode() for k in redis_client.scan_keys(r, keys.instance_glob("lease"))}
            assert leases == {keys.lease("a*1")}
            assert {k.decode() for k in redis_client.scan_keys(r, keys.instance_glob("lease", "a*1"))} == leases
            assert not list(redis_client.scan_keys(r, keys.instance_glob("lease", "a")))  # '*' in a name is literal
    finally:
        assert redis_client.delete_matching(r, [p for prefix in made for p in RedisKeys(prefix).patterns()]) == \
            sum(len(v) for v in made.values())


_KEY_LITERAL = re.compile(r"""(?<![`\w])f?["'](?:rj:|\{[\w.]*prefix\}:)""")


def test_no_redis_key_is_named_outside_redis_keys() -> None:
    """Key names (``"rj:…"``, ``f"{prefix}:…"``) are spelled in ``runjournal.core.redis_keys`` only (product, demo,
    bench): the hash-tag rule lives once."""
    sources = [p for d in ("producers", "consumers", "deploy", "runjournal/core", "runjournal/cli", "runjournal/demo",
                           "runjournal/adapters", "runjournal/console", "bench") for p in (ROOT / d).rglob("*.py")]
    offenders = [f"{p.relative_to(ROOT)}:{i}" for p in sources if p.name != "redis_keys.py"
                 for i, line in enumerate(p.read_text().splitlines(), 1) if _KEY_LITERAL.search(line)]
    assert offenders == []
