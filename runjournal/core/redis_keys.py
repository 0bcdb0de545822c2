"""Every Redis key runjournal uses, for one topic prefix ``P`` — and the one rule their hash tags follow.

**The rule.** The keys one Lua script or one MULTI/EXEC touches share a hash tag, because a Redis Cluster
runs a script or a transaction only within one slot (redis-py refuses it before sending). The tag names the
unit of atomicity; a key used alone needs no tag and is spread over the cluster by its full name:

* partition ``{P.p<n>}``: ``rj:{P.p<n>}:offset``, ``:runs``, ``:run:<run_id>``, ``:index`` — the projector's
  batch script;
* instance ``{P:i:<instance>}``: ``rj:{P:i:<instance>}:lease``, ``:owned``, ``:assign`` and
  ``rj:{P:i:<name>}:incarnation`` — own a run while the lease is ours (lease + owned set); hand a run over
  (owned set + assignment list);
* thread ``{P:t:<thread_id>}``: ``rj:{P:t:<thread_id>}:lg:<kind>`` — a framework adapter's checkpoint
  projection (one MULTI per thread); the thread list ``rj:P:lg:threads`` stands alone;
* run ``{P:r:<run_id>}``: ``rj:{P:r:<run_id>}:plan``, ``:approvals``, ``:signals``, ``:claim`` — one node holds a run's
  keys;
* no tag: single keys of the whole prefix — ``rj:P:topic``, ``rj:P:parked``, ``rj:P:approvals:pending``,
  ``rj:P:projector:lag_ms``, ``rj:P:metrics:endpoints`` — and ``rj:P:result:<sha256>`` (results spread over the nodes);
* demo ``{P:demo}``: ``rj:{P:demo}:queue``, ``:claimed:<instance>``, … — LMOVE from the queue to a claimed list;
* spend ``{P:s:<tenant digest>}``: ``rj:{P:s:<h>}:tenant``, ``:run:<run_id>``, ``:user:<user_id>`` — one tenant's
  budgets, spent and reserved amounts and reservations, checked and charged by one script
  (``runjournal.producers.spend``; docs/design/decisions/0053-spend-ledger.md). ``<h>`` is the first 32 hex digits of
  the tenant id's SHA-256: a tenant id may hold ``{`` or ``}``, which would end the tag early;
* archive ``{P:arc}``: ``rj:{P:arc}:due``, ``:runs`` — finished runs waiting for their retention, and each one's
  tenant and agent, written together by the archiver (``runjournal.consumers.archive``; decision 0056); ``:erased``
  — runs an ``erase`` began, by Redis's clock, which an archive in flight checks after its write; ``:archiving:<run>``,
  ``:reopening:<run>`` — an archive's and a ``continue_run``'s claims on a run, each checked by the other (0057);
* control ``{P:ctl}``: ``rj:{P:ctl}:requests``, ``:version``, ``:timers`` — an operator's (or a waiting run's own)
  request, the version counter heartbeat readers watch, and held runs' wake-up times (``runjournal.producers.control``).

No operation spans two units: the recovery hand-over writes the plan (run unit), then the assignee's owned
set and assignment list in one script (the assignee's instance unit), then removes the run from the dead
owner's owned set (its instance unit) — each step idempotent, a crash between them completed by the next
pass (``runjournal.consumers.recovery.job``). The partition tag ``{P.p<n>}`` is the projector's from the
first build and stays as it is.

``P`` holds only letters, digits, ``.``, ``_`` and ``-`` (``Settings.topic_prefix``), so the ``:`` after it
ends every family's glob exactly; the partition globs spell the digits out (``rj:{P.p[0-9]}:*`` …), so
they match no key of a prefix ``P.p1`` (whose tags are ``{P.p1:…}``, never ``{P.p1}``: that is why no key of
a whole prefix is tagged ``{P}``; the issue-14 topic identity ``rj:{P}:topic`` moved to ``rj:P:topic``, and a
projector adopts the identity again once after the upgrade). Redis ACL key patterns (``runjournal.deploy.redis_acls``)
and scans (erase, wipe, demo cleanup) use the same globs (:meth:`RedisKeys.patterns`).

**Ids inside a tag** — a run id, an instance id, a thread id — hold no ``{`` or ``}`` (``runjournal.core.ids``:
``RUN_ID``, ``PRODUCER_ID``, ``THREAD_ID``, checked where the ids enter: ``start_run``, ``resume``, ``Journal``, the
adapters). Redis hashes the text between the first ``{`` and the first ``}`` after it, so a ``}`` in an id would end
the tag early: the unit's keys would still share a slot (they share the text up to the id), but the slot would be
chosen by a prefix of the id — every run ``x}…`` on one node. The key names themselves are unambiguous for any id:
each family is a constant head, the id, and a constant tail (or none), and no two families share a head and a tail,
so one name is never two keys (docs/design/protocol.md § Identifiers and keys).
"""

from __future__ import annotations

import re

__all__ = ["MAX_PARTITION_DIGITS", "RedisKeys", "glob_escape", "partition_tag"]

MAX_PARTITION_DIGITS = 5
"""Partition numbers have at most 5 digits (``Settings.partitions`` <= 10,000)."""
_GLOB = re.compile(r"([*?\[\]\\])")


def glob_escape(text: str) -> str:
    """``text`` with Redis glob metacharacters (``* ? [ ] \\``) escaped, for a literal match in a pattern."""
    return _GLOB.sub(r"\\\1", text)


def partition_tag(prefix: str, partition: int) -> str:
    """The hash tag shared by all keys of one partition: ``{<prefix>.p<partition>}``."""
    return f"{{{prefix}.p{partition}}}"


class RedisKeys:
    """The key names of one topic prefix (``Settings.topic_prefix``); see the module docstring for the units.

    Args:
        prefix: the topic prefix ``P``.
    """

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix

    # -- partition unit: the projection (written by the projector only) --------------------------------
    def offset(self, partition: int) -> str:
        """``rj:{P.p<n>}:offset`` — the partition's applied offset."""
        return f"rj:{partition_tag(self.prefix, partition)}:offset"

    def runs(self, partition: int) -> str:
        """``rj:{P.p<n>}:runs`` — set of the partition's projected run ids."""
        return f"rj:{partition_tag(self.prefix, partition)}:runs"

    def run(self, partition: int, run_id: str) -> str:
        """``rj:{P.p<n>}:run:<run_id>`` — the run's projected state (a hash: ``runjournal.model.stored``)."""
        return f"rj:{partition_tag(self.prefix, partition)}:run:{run_id}"

    def index(self, partition: int) -> str:
        """``rj:{P.p<n>}:index`` — hash run_id → the run's summary JSON, for lists (``consumers.projector.index``)."""
        return f"rj:{partition_tag(self.prefix, partition)}:index"

    def live(self, partition: int) -> str:
        """``rj:{P.p<n>}:live`` — hash run_id → ``<epoch>:<owner>`` of the partition's runs that are neither ended
        nor parked: where recovery finds a run whose owner holds no lease even when every Redis set that named it
        was lost (the projection is rebuilt from the topic; the sets are not)."""
        return f"rj:{partition_tag(self.prefix, partition)}:live"

    # -- instance unit: leases, owned runs, assignments ----------------------------------------------
    def _instance(self, instance: str) -> str:
        return f"rj:{{{self.prefix}:i:{instance}}}"

    def lease(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:lease`` — the instance's lease (TTL'd, compare-and-set)."""
        return f"{self._instance(instance)}:lease"

    def owned(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:owned`` — set of the run ids the instance writes."""
        return f"{self._instance(instance)}:owned"

    def incoming(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:incoming`` — set of runs a recovery pass is handing to the instance: written before
        their RUN_RESUMED commits, cleared by the hand-over's assignment, so a pass killed between the two leaves
        the run findable (``consumers.recovery``)."""
        return f"{self._instance(instance)}:incoming"

    def surrendered(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:surrendered`` — hash run_id → epoch of the runs a live instance gave up (a handle
        that lost an event and must stop): the recovery job resumes them without fencing the instance
        (``producers.journal``, docs/design/protocol.md § Surrender)."""
        return f"{self._instance(instance)}:surrendered"

    def window(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:window`` — the instance's effect window: value the longest tool timeout (ms) it may
        have sent a request under, TTL how much longer such a request may still act (``producers._lease``)."""
        return f"{self._instance(instance)}:window"

    def control_seen(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:ctlseen`` — the control version the instance last read the requests of its runs at
        (``producers.control``): an operator's request counts as seen by an instance once this reaches its
        version."""
        return f"{self._instance(instance)}:ctlseen"

    def assign(self, instance: str) -> str:
        """``rj:{P:i:<instance>}:assign`` — list of recovered runs handed to the instance."""
        return f"{self._instance(instance)}:assign"

    def incarnation(self, name: str) -> str:
        """``rj:{P:i:<name>}:incarnation`` — counter of the Journals started under producer_id ``name``."""
        return f"{self._instance(name)}:incarnation"

    # -- run unit: recovery plan, approval inbox, run-id claim ------------------------------------------
    def _run(self, run_id: str) -> str:
        return f"rj:{{{self.prefix}:r:{run_id}}}"

    def plan(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:plan`` — the recovery plan (JSON) a resumed run continues from."""
        return f"{self._run(run_id)}:plan"

    def approvals(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:approvals`` — hash call_id → a human's decision, for the run's owner."""
        return f"{self._run(run_id)}:approvals"

    def signals(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:signals`` — hash signal name → its delivery (JSON, HSETNX: delivered once), read by
        ``run.wait_signal`` (``producers.waits``)."""
        return f"{self._run(run_id)}:signals"

    def streams(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:streams`` — hash segment → epoch of the run's open stream segments (``run.stream()``,
        ``runjournal.producers.streams``): set at open, removed at end; the next owner's gap names what is left."""
        return f"{self._run(run_id)}:streams"

    def claim(self, run_id: str) -> str:
        """``rj:{P:r:<run_id>}:claim`` — the instance that started the run (SET NX: a run id is used once)."""
        return f"{self._run(run_id)}:claim"

    # -- spend unit: one tenant's budgets and reservations (runjournal.producers.spend) -------------------
    def _spend(self, tenant_id: str) -> str:
        import hashlib

        return f"rj:{{{self.prefix}:s:{hashlib.sha256(tenant_id.encode('utf-8')).hexdigest()[:32]}}}"

    def spend_tenant(self, tenant_id: str) -> str:
        """``rj:{P:s:<h>}:tenant`` — hash: the tenant's ``used:<dim>``, ``open:<dim>``, ``limit:<dim>`` (an
        operator's budget) and ``id`` (the tenant id itself, for listing)."""
        return f"{self._spend(tenant_id)}:tenant"

    def spend_run(self, tenant_id: str, run_id: str) -> str:
        """``rj:{P:s:<h>}:run:<run_id>`` — hash: the run's ``used/open/limit:<dim>``, its reservations
        (``k:<reservation key>`` → JSON) and settles (``s:<settle key>`` → reservation key)."""
        return f"{self._spend(tenant_id)}:run:{run_id}"

    def spend_user(self, tenant_id: str, user_id: str) -> str:
        """``rj:{P:s:<h>}:user:<user_id>`` — hash: the user's ``used/open/limit:<dim>`` within the tenant."""
        return f"{self._spend(tenant_id)}:user:{user_id}"

    def spend_glob(self) -> str:
        """``rj:{P:s:*`` — every spend key of the prefix (ACL patterns, listing tenants)."""
        return f"rj:{{{self.prefix}:s:*"

    # -- untagged single keys -------------------------------------------------------------------------
    def checkpoint(self, thread_id: str, kind: str) -> str:
        """``rj:{P:t:<thread_id>}:lg:<kind>`` — a framework thread's projected records of one kind (hash field → data;
        ``runjournal.adapters._checkpoints``). One tag per thread: a thread's kinds change in one MULTI."""
        return f"rj:{{{self.prefix}:t:{thread_id}}}:lg:{kind}"

    def checkpoint_threads(self) -> str:
        """``rj:P:lg:threads`` — every thread with a checkpoint projection (``list(None)``)."""
        return f"rj:{self.prefix}:lg:threads"

    def topic_identity(self) -> str:
        """``rj:P:topic`` — the topic id and partition count the projection was built from."""
        return f"rj:{self.prefix}:topic"

    def metrics_endpoints(self) -> str:
        """``rj:P:metrics:endpoints`` — hash of the ``/metrics`` endpoints services announce (``core.metrics``)."""
        return f"rj:{self.prefix}:metrics:endpoints"

    def parked(self) -> str:
        """``rj:P:parked`` — set of runs recovery parked (a gap or an undecodable record)."""
        return f"rj:{self.prefix}:parked"

    def approvals_pending(self) -> str:
        """``rj:P:approvals:pending`` — set of ``run_id|call_id`` awaiting a decision (a hint for approvers)."""
        return f"rj:{self.prefix}:approvals:pending"

    def result(self, hexdigest: str) -> str:
        """``rj:P:result:<sha256 hex>`` — a large tool result, content-addressed (no tag: spread over the nodes)."""
        return f"rj:{self.prefix}:result:{hexdigest}"

    def projector_lag(self) -> str:
        """``rj:P:projector:lag_ms`` — list of the projector's last lag samples ``"<unix ms>:<lag ms>"``."""
        return f"rj:{self.prefix}:projector:lag_ms"

    # -- control unit: operators' requests on runs (runjournal.producers.control) -------------------------
    def control_requests(self) -> str:
        """``rj:{P:ctl}:requests`` — hash run_id → an operator's pending cancel or pause request (JSON)."""
        return f"rj:{{{self.prefix}:ctl}}:requests"

    def control_timers(self) -> str:
        """``rj:{P:ctl}:timers`` — sorted set run_id → when a held run wakes (ms by Redis's clock): durable sleeps and
        signal waits' timeouts, resumed by the recovery service (``producers.control``)."""
        return f"rj:{{{self.prefix}:ctl}}:timers"

    def control_version(self) -> str:
        """``rj:{P:ctl}:version`` — counter raised by every change of the requests (agents' heartbeats watch it)."""
        return f"rj:{{{self.prefix}:ctl}}:version"

    # -- archive unit: finished runs waiting for their retention (runjournal.consumers.archive) ----------
    def archive_due(self) -> str:
        """``rj:{P:arc}:due`` — sorted set run_id → when the archiver saw the run finish (ms by Redis's clock)."""
        return f"rj:{{{self.prefix}:arc}}:due"

    def archive_runs(self) -> str:
        """``rj:{P:arc}:runs`` — hash run_id → ``{"tenant_id", "agent"}`` (JSON) of each run in the due set: its
        retention's scope. Written with the due set in one MULTI (same tag)."""
        return f"rj:{{{self.prefix}:arc}}:runs"

    def archive_glob(self) -> str:
        """``rj:{P:arc}:*`` — every key of the archive unit (due set, scopes, claims, erase marks): the archiver's Redis
        ACL rule (``runjournal.deploy.redis_acls``)."""
        return f"rj:{{{self.prefix}:arc}}:*"

    def archive_claim(self, kind: str, run_id: str) -> str:
        """``rj:{P:arc}:<kind>:<run_id>`` (kind ``archiving`` or ``reopening``) — sorted set token → expiry (ms by
        Redis's clock): the claims of archives or of ``continue_run`` calls on a run, each kind checked by the other
        (``runjournal.consumers.runtime.archive_claims``; decision 0057)."""
        return f"rj:{{{self.prefix}:arc}}:{kind}:{run_id}"

    def archive_erased(self) -> str:
        """``rj:{P:arc}:erased`` — sorted set run_id → when an ``erase`` of the run began (ms by Redis's clock), kept
        for ``runjournal.consumers.ops.erase.ERASE_MARK_MS``: an archive that wrote the run while it was erased finds
        the mark after its write and deletes its copy (decision 0057)."""
        return f"rj:{{{self.prefix}:arc}}:erased"

    # -- demo unit: the demo's work queue (runjournal.demo) -----------------------------------------------
    def demo(self, name: str) -> str:
        """``rj:{P:demo}:<name>`` — the demo's queue, done flag, context counters and claimed lists."""
        return f"rj:{{{self.prefix}:demo}}:{name}"

    # -- globs: scans and ACL key patterns ------------------------------------------------------------
    def partition_globs(self) -> list[str]:
        """``rj:{P.p[0-9]}:*`` … (1 to 5 digits): every projection key of this prefix and of no other."""
        return [f"rj:{{{self.prefix}.p{'[0-9]' * n}}}:*" for n in range(1, MAX_PARTITION_DIGITS + 1)]

    def instance_glob(self, family: str = "*", instance: str | None = None) -> str:
        """``rj:{P:i:<instance>}:<family>``: ``instance`` None (default) matches every instance; a given instance
        name is always escaped and matched literally (``*`` too: it comes from a user, e.g. ``--agent-name``).
        ``family`` ``*`` (default) matches every family (families are code constants); another is escaped."""
        inst = "*" if instance is None else glob_escape(instance)
        fam = family if family == "*" else glob_escape(family)
        return f"rj:{{{self.prefix}:i:{inst}}}:{fam}"

    def checkpoint_globs(self) -> list[str]:
        """``rj:{P:t:*}:lg:*`` and ``rj:P:lg:threads`` — every key of the adapters' checkpoint projection."""
        return [f"rj:{{{self.prefix}:t:*}}:lg:*", self.checkpoint_threads()]

    def run_glob(self, family: str = "*") -> str:
        """``rj:{P:r:*}:<family>`` — every run's key of one family (``*``: all run-unit keys)."""
        return f"rj:{{{self.prefix}:r:*}}:{family}"

    def instance_of(self, key: bytes | str, family: str) -> str | None:
        """The instance id in an instance-unit key of ``family`` (``rj:{P:i:agent-7#2}:lease`` → ``agent-7#2``)."""
        text = key.decode() if isinstance(key, bytes) else key
        head, tail = f"rj:{{{self.prefix}:i:", f"}}:{family}"
        if text.startswith(head) and text.endswith(tail):
            return text[len(head):-len(tail)]
        return None

    def patterns(self) -> list[str]:
        """Globs covering every key of this prefix (and none of another): cleanup of a whole prefix."""
        return [*self.partition_globs(), f"rj:{{{self.prefix}:i:*", f"rj:{{{self.prefix}:r:*",
                f"rj:{{{self.prefix}:t:*", f"rj:{{{self.prefix}:s:*", f"rj:{{{self.prefix}:demo}}:*",
                f"rj:{{{self.prefix}:ctl}}:*", f"rj:{{{self.prefix}:arc}}:*", f"rj:{self.prefix}:*"]
