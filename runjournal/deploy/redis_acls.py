"""Least privilege on Redis: the ACL rules each runjournal role needs, for one topic prefix.

The Redis half of ``runjournal.deploy.acls`` (Kafka). The table is the documentation
(docs/operations/cluster-and-least-privilege.md § Least privilege; ``runjournal acls show --redis``) and the
configuration: ``runjournal stack up --secure`` writes these users into every Redis node's ACL file, and
:func:`grant` adds a prefix's rules to existing users on every node of any Redis ≥ 7 (ACLs are per node, also in a
cluster). Keys are the families of ``runjournal.core.redis_keys`` (globs exact to one prefix); ``R`` = read only
(``%R~``), ``RW`` = read and write (``~``; a Lua script's declared keys need ``RW``). Commands: the roles that
write get ``+@read +@write``, the reader ``+@read`` — minus ``@dangerous`` (no FLUSHALL, KEYS, CONFIG, ACL, DEBUG,
MIGRATE …) — plus the cluster-discovery commands every client uses, and for the writers the scripting and
transaction (MULTI/EXEC/ DISCARD/WATCH/UNWATCH) commands. Nobody but the administrator gets more.

* ``agent`` — the Journal: its instance's lease, owned set, assignment list and incarnation counter (RW; with
  an agent name, that name's instances only — else every instance: a fleet sharing one user, as agents
  share the Kafka role), run-id claims and large results (RW), the pending-approvals hint set (RW),
  recovery plans and approval decisions (R), the projection (R, the ContextManager's execution facts), the
  framework adapters' checkpoint projection (RW) and its ``/metrics`` announcement (RW).
* ``projector`` — the projection, the topic identity and its lag samples (RW), its ``/metrics`` announcement.
* ``recovery`` — leases and effect windows (R: who is alive, how long its requests may act), owned sets and
  assignment lists (RW: hand-over), plans, run-id claims (frees one after ``no_facts``) and the parked set (RW), the
  projection (R) and the topic identity (RW: stored when no projector has yet).
* ``memory`` — the projection (R: a run's owner for memory scopes). Read-only on purpose: under Redis ACLs its
  ``/metrics`` endpoint is not announced (the announcement fails quietly); give the console ``--scrape URL``.
* ``operator`` — everything of the prefix (R); ``erase`` (the projection, plans, approvals, owned sets,
  assignment lists, the parked set, the framework adapters' checkpoint projection) and ``approve``/``deny``
  (approval decisions) (RW). Not leases, run-id
  claims, results, the topic identity or the lag samples.
* ``archiver`` — the archive unit ``rj:{P:arc}:*`` (RW: the due set and scopes, finished runs by Redis's ``TIME`` in
  one MULTI; its claim on a run, released by a script; erase marks, read and expired — decision 0057) and, for a run
  once archived, what ``erase``'s Redis step removes (RW: the projection, plans, approval
  decisions and the pending set, signals, the adapters' checkpoint projection, large results, the parked set, the
  run's entries in owned / incoming sets, assignment lists and surrendered hashes, operators' requests and timers);
  leases (R: a run whose owner holds one is never archived); the run-id claim (RW: its expiry once the run is
  archived) (``runjournal.consumers.archive``, decision 0056).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from runjournal.core import redis_client
from runjournal.core.redis_keys import RedisKeys

__all__ = ["ADMIN_RULES", "ROLES", "RedisGrant", "acl_file", "grant", "grants_for", "rules_for"]

_BASE = ["+ping", "+select", "+cluster|slots", "+cluster|shards", "+cluster|nodes", "+cluster|info", "+command",
         "+readonly", "+readwrite", "+time"]
"""What every client runs besides data commands: PING, the cluster discovery (redis-py's cluster client asks
``CLUSTER SLOTS`` and ``COMMAND``), SELECT (a ``/db`` in the URL), TIME (Redis's clock: the one clock of
operators' requests and durable timers, docs/design/decisions/0050-durable-waits.md; TIME is in neither
``@read`` nor ``@write``). CLIENT SETINFO is optional to redis-py."""
_SCRIPTS = ["+eval", "+evalsha", "+script|load", "+script|exists"]
_TRANSACTIONS = ["+multi", "+exec", "+discard", "+watch", "+unwatch"]
"""A transactional pipeline (redis-py ``pipeline(transaction=True)``: MULTI … EXEC, DISCARD on a failed queue,
WATCH/UNWATCH for check-and-set): none is in ``@read`` or ``@write`` (they are ``@transaction``), so a role that
writes gets them by name — the framework adapters' checkpoint projection changes a thread's kinds in one MULTI."""
ADMIN_RULES = ["~*", "&*", "+@all"]
"""The stack's administrator: every key, channel and command (creates the other users, runs the demo)."""


@dataclass(frozen=True)
class RedisGrant:
    """One key family a role may use."""

    family: str
    """A key family (:func:`family_globs`)."""
    access: str
    """``R`` (read only) or ``RW``."""
    why: str
    """What needs it."""


ROLES: dict[str, tuple[RedisGrant, ...]] = {
    "agent": (
        RedisGrant("instance", "RW", "its lease (CAS), owned set, assignment list, incarnation counter"),
        RedisGrant("claim", "RW", "start_run claims the run id (SET NX); frees it if never published"),
        RedisGrant("result", "RW", "results over inline_result_bytes, by digest"),
        RedisGrant("pending", "RW", "note an awaited approval (a hint for approvers)"),
        RedisGrant("plan", "R", "resume a run from its recovery plan"),
        RedisGrant("approvals", "R", "read a human's decision"),
        RedisGrant("projection", "R", "the ContextManager's execution facts"),
        RedisGrant("checkpoints", "RW", "framework adapters: the LangGraph checkpoint / Agents SDK session projection"),
        RedisGrant("metrics", "RW", "announce its /metrics endpoint (opt-in journal metrics)"),
        RedisGrant("topic", "R", "refuse to start when the topic's partition count is not the journal's"),
        RedisGrant("control", "RW", "operators' cancel / pause requests on its runs; removed once carried out"),
        RedisGrant("signals", "R", "run.wait_signal reads a run's delivered signals"),
        RedisGrant("spend", "RW", "reserve and settle model spend against its tenant's budgets (one script)"),
        RedisGrant("streams", "RW", "run.stream(): its open stream segments; the next owner's gap record"),
        RedisGrant("archive_claims", "RW", "continue_run claims the run it reopens and steps back from an archive's "
                                           "claim (decision 0057)"),
    ),
    "projector": (
        RedisGrant("projection", "RW", "fold the journal: states, run sets, applied offsets (one script)"),
        RedisGrant("topic", "RW", "store and check the topic identity"),
        RedisGrant("lag", "RW", "lag samples for dashboards and the demo"),
        RedisGrant("metrics", "RW", "announce its /metrics endpoint for the console (--metrics-port)"),
    ),
    "recovery": (
        RedisGrant("lease", "R", "which instances are alive"),
        RedisGrant("window", "R", "how long a dead instance's requests may still act (its effect window's PTTL)"),
        RedisGrant("owned", "RW", "runs of dead instances; hand-over"),
        RedisGrant("assign", "RW", "hand a run to a live instance"),
        RedisGrant("incoming", "RW", "name a run's assignee before its RUN_RESUMED commits; cleared by the hand-over"),
        RedisGrant("surrendered", "RW", "runs a live instance gave up (Journal.surrender); cleared once resumed"),
        RedisGrant("plan", "RW", "store the recovery plan"),
        RedisGrant("claim", "RW", "who started a run; free a run id with no fact"),
        RedisGrant("parked", "RW", "park a run with a gap or an undecodable record"),
        RedisGrant("projection", "R", "the snapshot a tail is folded onto"),
        RedisGrant("topic", "RW", "check the topic identity; store it when no projector has yet"),
        RedisGrant("metrics", "RW", "announce its /metrics endpoint for the console (--metrics-port)"),
        RedisGrant("control", "RW", "carry out a cancel or pause of a run nobody live owns; remove the request"),
        RedisGrant("spend", "R", "a spend reservation's state for a resumed run's plan"),
    ),
    "memory": (
        RedisGrant("projection", "R", "a run's owner (user, agent) for memory scopes"),
    ),
    "operator": (
        RedisGrant("everything", "R", "inspect, replay (results), approvals pending, leases"),
        RedisGrant("projection", "RW", "erase: the run's state and its run-set entry"),
        RedisGrant("plan", "RW", "erase"),
        RedisGrant("approvals", "RW", "approve / deny; erase"),
        RedisGrant("pending", "RW", "erase"),
        RedisGrant("parked", "RW", "erase"),
        RedisGrant("owned", "RW", "erase: the run's entry in owned sets"),
        RedisGrant("assign", "RW", "erase: the run's entry in assignment lists"),
        RedisGrant("incoming", "RW", "erase: the run's entry in incoming sets"),
        RedisGrant("surrendered", "RW", "erase: the run's entry in surrendered hashes"),
        RedisGrant("checkpoints", "RW", "erase: the run's framework checkpoint projection and thread-list entry"),
        RedisGrant("control", "RW", "cancel / pause a run (a request its owner carries out), withdraw a pause"),
        RedisGrant("signals", "RW", "runjournal signal delivers a signal to a run (once); erase"),
        RedisGrant("spend", "RW", "runjournal spend: set a budget; erase a run's reservations"),
        RedisGrant("erased", "RW", "erase: mark the run before removing it, for an archive in flight (decision 0057)"),
        RedisGrant("archive_claims", "RW", "continue_run from an operator's shell: claim the run it reopens"),
    ),
    "archiver": (
        RedisGrant("archive", "RW", "the archive unit: the due set and scopes (by Redis's clock), its claim on a run "
                                    "(steps back from a continue_run's), erase marks (checked, expired)"),
        RedisGrant("projection", "RW", "a run's owner and scope; once archived: its state, run-set and index entries"),
        RedisGrant("lease", "R", "a run whose owner holds a live lease is never archived (erase's check)"),
        RedisGrant("plan", "RW", "once archived: the run's recovery plan (erase's step)"),
        RedisGrant("approvals", "RW", "once archived: the run's approval decisions (erase's step)"),
        RedisGrant("pending", "RW", "once archived: the run's entries in the pending-approvals set"),
        RedisGrant("signals", "RW", "once archived: the run's delivered signals"),
        RedisGrant("checkpoints", "RW", "once archived: the run's framework checkpoint projection and thread entry"),
        RedisGrant("result", "RW", "once archived: the run's cached large results"),
        RedisGrant("parked", "RW", "once archived: the run's entry in the parked set"),
        RedisGrant("owned", "RW", "once archived: the run's entry in owned sets (and a view of its owner)"),
        RedisGrant("incoming", "RW", "once archived: the run's entry in incoming sets (and a view of its owner)"),
        RedisGrant("assign", "RW", "once archived: the run's entry in assignment lists"),
        RedisGrant("surrendered", "RW", "once archived: the run's entry in surrendered hashes"),
        RedisGrant("control", "RW", "once archived: an operator's request on the run and its wake-up time"),
        RedisGrant("claim", "RW", "once archived: the run-id claim gets its expiry (RUNJOURNAL_RUN_ID_MEMORY_S)"),
    ),
}
"""Role → the key families it may use (see the module docstring)."""

_WRITERS = {"agent", "projector", "recovery", "operator", "archiver"}


def family_globs(family: str, prefix: str, *, agent_name: str | None = None) -> list[str]:
    """The key globs of ``family`` for ``prefix`` (``instance`` with ``agent_name``: that name's instances only).

    Raises:
        KeyError: an unknown family.
    """
    keys = RedisKeys(prefix)
    by_family: dict[str, list[str]] = {
        "projection": keys.partition_globs(),
        "topic": [keys.topic_identity()],
        "lag": [keys.projector_lag()],
        "parked": [keys.parked()],
        "pending": [keys.approvals_pending()],
        "lease": [keys.instance_glob("lease")],
        "owned": [keys.instance_glob("owned")],
        "assign": [keys.instance_glob("assign")],
        "incoming": [keys.instance_glob("incoming")],
        "surrendered": [keys.instance_glob("surrendered")],
        "window": [keys.instance_glob("window")],
        "plan": [keys.run_glob("plan")],
        "approvals": [keys.run_glob("approvals")],
        "claim": [keys.run_glob("claim")],
        "result": [keys.result("*")],
        "checkpoints": keys.checkpoint_globs(),
        "metrics": [keys.metrics_endpoints()],
        "control": [keys.control_requests(), keys.control_version(), keys.control_timers()],
        "signals": [keys.run_glob("signals")],
        "streams": [keys.run_glob("streams")],
        "spend": [keys.spend_glob()],
        "erased": [keys.archive_erased()],
        "archive_claims": [keys.archive_claim("archiving", "*"), keys.archive_claim("reopening", "*")],
        "archive": [keys.archive_glob()],
        "everything": keys.patterns(),
    }
    if family == "instance":
        if agent_name is None:
            return [keys.instance_glob()]
        return [keys.instance_glob(instance=agent_name), _incarnations_glob(keys, agent_name)]
    return by_family[family]


def _incarnations_glob(keys: RedisKeys, name: str) -> str:
    """``rj:{P:i:<name>#*}:*`` — the later incarnations of ``name`` (``name#2`` …)."""
    exact = keys.instance_glob(instance=name)  # rj:{P:i:<name>}:*
    return exact[: -len("}:*")] + "#*}:*"


def rules_for(role: str, prefix: str, *, agent_name: str | None = None) -> list[str]:
    """The ``ACL SETUSER`` rules (key patterns and commands) of ``role`` for ``prefix`` — without ``on``, the
    password or ``reset*``, so they add to a user's rules for other prefixes.

    Raises:
        KeyError: an unknown role.
        ValueError: an agent name with whitespace (it would split the ACL rule).
    """
    if agent_name is not None and (not agent_name or any(c.isspace() for c in agent_name) or "#" in agent_name):
        raise ValueError(f"agent name {agent_name!r}: non-empty, without whitespace or '#'")
    rules: list[str] = []
    for g in ROLES[role]:
        sign = "%R~" if g.access == "R" else "~"
        rules += [sign + glob for glob in family_globs(g.family, prefix, agent_name=agent_name)]
    rules += ["+@read", "+@write"] if role in _WRITERS else ["+@read"]
    rules += ["-@dangerous", *_BASE, *([*_SCRIPTS, *_TRANSACTIONS] if role in _WRITERS else [])]
    return rules


def grants_for(role: str, prefix: str, *, agent_name: str | None = None) -> list[dict[str, Any]]:
    """The grants of ``role`` for ``prefix`` as plain dicts (``runjournal acls show --redis --json``)."""
    return [{"family": g.family, "access": g.access, "patterns": family_globs(g.family, prefix, agent_name=agent_name),
             "why": g.why} for g in ROLES[role]]


def acl_file(passwords: dict[str, str], prefix: str) -> str:
    """An ACL file: ``default`` off, ``admin`` with every right, one user per role of :data:`ROLES` with its rules
    for ``prefix``. Passwords are stored as SHA-256 (``#<hex>``); ``passwords`` maps user → password.

    Raises:
        KeyError: a role of :data:`ROLES` or ``admin`` has no password.
    """
    import hashlib

    def hashed(user: str) -> str:
        return "#" + hashlib.sha256(passwords[user].encode()).hexdigest()

    lines = ["user default off resetkeys resetchannels -@all",
             " ".join(["user", "admin", "on", hashed("admin"), *ADMIN_RULES])]
    for role in ROLES:
        lines.append(" ".join(["user", role, "on", hashed(role), "resetkeys", "resetchannels", "-@all",
                               *rules_for(role, prefix)]))
    return "\n".join(lines) + "\n"


def grant(admin: Any, users: dict[str, str], prefix: str, *, passwords: dict[str, str] | None = None,
          agent_name: str | None = None) -> int:
    """Add each role's rules for ``prefix`` to its Redis user, on every node (ACLs are per node).

    Args:
        admin: a client from ``runjournal.core.redis_client`` whose user may run ``ACL SETUSER``.
        users: role → Redis user name (created when missing, disabled until it has a password).
        prefix: the topic prefix.
        passwords: user → password to set (``on`` and ``>password``); users not named keep theirs.
        agent_name: restrict the ``agent`` role's instance keys to this producer_id's instances.

    Returns:
        The number of ``ACL SETUSER`` commands run (users × nodes).

    Raises:
        KeyError: an unknown role.
        redis.RedisError: a node refused (e.g. the admin may not run ACL commands).
    """
    count = 0
    for node in redis_client.nodes(admin):
        for role, user in users.items():
            extra: Iterable[str] = ("on", ">" + passwords[user]) if passwords and user in passwords else ()
            node.execute_command("ACL", "SETUSER", user, *extra, *rules_for(role, prefix, agent_name=agent_name))
            count += 1
    return count
