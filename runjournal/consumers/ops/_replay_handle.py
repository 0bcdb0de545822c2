"""``ReplayHandle``: a ``RunHandle`` look-alike that re-executes agent code against a recorded run.

docs/design/protocol.md § Replay is not resume: side-effecting tools are *replaced by their recorded results*,
so the real provider's call count never changes. The handle has no journal and no producer:
nothing it does can publish, and ``call`` never invokes the tool (nor its ``reconcile``).

How each method answers (``RunHandle`` semantics, recorded facts instead of effects):

* ``node(name)`` derives paths exactly as ``RunHandle.node`` does (``outer/inner``, ``name#n``),
  so ``call`` derives the same idempotency keys (``runjournal.producers.idempotency_key``).
* ``call(tool, args)`` looks the step's key up in the folded execution records: a committed (or
  reconciled-as-committed) call returns its recorded result; a FAILED one raises
  :class:`ReplayedToolError` with the recorded error. A record for another tool, other arguments
  (``strict_args``) or, in a finished recording, no record at all raises :class:`ReplayDivergedError`.
  A step the recording does not reach — cut by ``until_seq``, run unfinished, outcome never
  recorded — raises :class:`ReplayEndReachedError` (a ``ReplayDivergedError``).
* ``message`` / ``correction`` / ``emit`` / ``succeed`` / ``fail`` publish nothing; they are
  compared with the recorded events and a difference is noted in :attr:`ReplayHandle.mismatches`
  (transcript and node events are non-durable: a crash may have lost some, so they never raise).
* ``request_approval`` and ``runjournal.producers.approvals.await_approval`` see the journal's decisions
  through :attr:`ReplayHandle.plan`; an approval still pending at the replay point ends the replay
  (:class:`ReplayEndReachedError`) before any inbox is touched.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING, Any

from runjournal.core.errors import RunjournalError
from runjournal.model.reducer import CallStatus, Decision, ExecutionRecord, ReconciledOutcome, RunState, RunStatus
from runjournal.producers import canonical_json, digest, enter_node, idempotency_key
from runjournal.producers.encryption import ContentCrypto, address_of, call_address, payload_address
from runjournal.producers.errors import ResultUnavailableError
from runjournal.producers.plan import ApprovalStatus, RecoveryPlan
from runjournal.producers.results import ResultStore, unavailable_reason
from runjournal.producers.tools import Tool
from runjournal.schemas import Event, EventType

if TYPE_CHECKING:
    from runjournal.consumers.ops._replay_state import ReplayedState

__all__ = [
    "ReplayDivergedError",
    "ReplayEndReachedError",
    "ReplayError",
    "ReplayHandle",
    "ReplayedCall",
    "ReplayedToolError",
    "RunNotFoundError",
]

#: ``producer_id`` a replay handle reports (it never writes).
REPLAY_PRODUCER_ID = "replay"

_RESERVED = frozenset({EventType.RUN_STARTED, EventType.RUN_RESUMED, EventType.RUN_SUCCEEDED, EventType.RUN_FAILED})


class ReplayError(RunjournalError):
    """Base of the replay errors."""


class RunNotFoundError(ReplayError):
    """The events topic holds no decodable event of the run (never started, or erased)."""


class ReplayDivergedError(ReplayError):
    """The re-executed code asked for something the recording does not have at that step.

    Attributes:
        node_path: the node path of the step (``""`` at the top level).
        index: the call index at that node (1-based).
        idempotency_key: the key the step derives.
        tool: the tool the code called.
    """

    def __init__(self, message: str, *, node_path: str = "", index: int = 0, idempotency_key: str = "",
                 tool: str = "") -> None:
        self.node_path = node_path
        self.index = index
        self.idempotency_key = idempotency_key
        self.tool = tool
        super().__init__(message)


class ReplayEndReachedError(ReplayDivergedError):
    """The code went past what the recording holds: a cut by ``until_seq``, an unfinished run, a
    call whose outcome was never recorded, or an approval still pending. ``replay_run`` stops there."""


class ReplayedToolError(ReplayError):
    """The recorded call failed (TOOL_CALL_FAILED, or reconciled as FAILED); raised in its place.

    Attributes:
        error: the recorded error text.
        retryable: the recorded ``retryable`` flag.
        call_id: the recorded call's id.
    """

    def __init__(self, error: str, *, retryable: bool, call_id: str) -> None:
        self.error = error
        self.retryable = retryable
        self.call_id = call_id
        super().__init__(f"recorded failure of call {call_id}: {error}")


@dataclass(frozen=True)
class ReplayedCall:
    """One ``call`` the replayed code made, answered from the recording."""

    node_path: str
    """Node path of the step (``""`` at the top level)."""
    index: int
    """Call index at that node, 1-based."""
    idempotency_key: str
    """The step's key (also the recorded ``call_id``)."""
    tool: str
    """Tool name."""
    status: str
    """The execution record's status (``COMMITTED``, ``RECONCILED``, ``FAILED``)."""
    result: Any
    """The recorded result as parsed JSON (None for a failed call)."""


class ReplayHandle:
    """Answers agent code from a :class:`~runjournal.consumers.ops.replay.ReplayedState`; see the module docstring.

    Args:
        replayed: the folded state and events up to the replay point (``runjournal.consumers.ops.replay.replay_state``).
        results: where results stored by reference (``result_ref``) are read; None: such a result
            raises ``ResultUnavailableError``.
        strict_args: a call whose arguments' digest differs from the recorded ``args_digest``
            diverges (default True).

    Raises:
        RunNotFoundError: ``replayed`` has no state.
    """

    def __init__(self, replayed: ReplayedState, *, results: ResultStore | None = None,
                 strict_args: bool = True, content: ContentCrypto | None = None) -> None:
        state = replayed.state
        if state is None:
            raise RunNotFoundError(f"run {replayed.run_id} has no events to replay")
        self.state: RunState = state
        self.run_id = state.run_id
        self.tenant_id = state.tenant_id or ""
        self.agent = state.agent or ""
        self.epoch = state.epoch
        self.producer_id = REPLAY_PRODUCER_ID
        self.plan = RecoveryPlan(run_id=self.run_id, tenant_id=self.tenant_id, agent=self.agent, epoch=state.epoch,
                                 last_seq=state.last_seq, approvals=_decided(state))
        """Carries the journal's approval decisions, so ``await_approval`` never asks an inbox again."""
        self.calls: list[ReplayedCall] = []
        """Calls answered so far, in order."""
        self.mismatches: list[str] = []
        """Differences between what the code did and the recorded events (never raised)."""
        self._results = results
        self._content = content if content is not None else ContentCrypto()
        """Opens recorded content (decision 0059): without a key, an encrypted result raises EncryptedContentError."""
        self._strict_args = strict_args
        self._open = replayed.until_seq is not None or not state.terminal
        self._records = {r.idempotency_key: r for r in state.records.values()}
        self._by_sig: dict[tuple[Any, ...], list[Event]] = {}  # recorded events not matched yet, by signature
        for event in replayed.events:
            self._by_sig.setdefault(_signature(event), []).append(event)
        self._nodes = {e.payload.get("node_path") for e in replayed.events if e.type is EventType.NODE_STARTED}
        self._requested = {e.payload.get("call_id") for e in replayed.events
                           if e.type is EventType.APPROVAL_REQUESTED}
        self._node_stack: list[str] = []
        self._entries: dict[str, dict[str, int]] = {}
        self._call_counts: dict[str, int] = {}
        self._failed_last: dict[str, tuple[int, str, str]] = {}
        """node path -> (index, tool, args digest) of its last call when that call raised its recorded failure."""
        self._finished: EventType | None = None

    # -- RunHandle's read-only surface ----------------------------------------------------------
    @property
    def last_seq(self) -> int:
        """The seq the recording reached at the replay point."""
        return self.state.last_seq

    @property
    def node_path(self) -> str | None:
        """The innermost open node's path, or None at the top level."""
        return self._node_stack[-1] if self._node_stack else None

    @property
    def finished(self) -> bool:
        """True once the code called ``succeed`` or ``fail``."""
        return self._finished is not None

    @property
    def writable(self) -> bool:
        """True until ``succeed`` / ``fail`` (nothing is ever written, but code may test it)."""
        return self._finished is None

    @property
    def unreached_calls(self) -> list[str]:
        """idempotency keys of recorded calls the code has not asked for (sorted)."""
        asked = {c.idempotency_key for c in self.calls}
        return sorted(k for k in self._records if k not in asked)

    # -- nodes ----------------------------------------------------------------------------------
    @contextmanager
    def node(self, name: str) -> Iterator[str]:
        """Enter a node; yields its path, derived like ``RunHandle.node``. Notes a path the recording lacks.

        Raises:
            ValueError: a name with ``/`` or ``#`` or empty.
        """
        path = enter_node(self._entries, self.node_path or "", name)
        if path not in self._nodes:
            self._note(f"node {path} was never started in the recording")
        self._node_stack.append(path)
        try:
            yield path
        finally:
            self._node_stack.pop()

    # -- the side-effect step ----------------------------------------------------------------------
    def call(self, tool: Tool, args: dict[str, Any], *, side_effect: bool | None = None) -> Any:
        """The recorded result of this step's call; the tool is never invoked.

        Args:
            tool: the tool the code calls (only ``tool.name`` is read).
            args: its arguments (compared by digest with the recorded ``args_digest`` when ``strict_args``).
            side_effect: ignored (accepted for ``RunHandle.call`` compatibility).

        Returns:
            The recorded result as parsed JSON (what ``RunHandle.call`` returns on a resumed run).

        Raises:
            ReplayDivergedError: another tool or other arguments were recorded at this step, or (finished
                recording) nothing was.
            ReplayEndReachedError: the recording does not reach this step's outcome.
            ReplayedToolError: the recorded call failed.
            ResultUnavailableError: the result is stored by reference and cannot be read back.
        """
        node_path = self.node_path or ""
        args_digest = digest(canonical_json(args))
        # The same tool and args again right after a failure is the next attempt of that call (same key), as
        # in RunHandle.call: a retry never gets a new key.
        last = self._failed_last.pop(node_path, None)
        retry = last is not None and last[1:] == (tool.name, args_digest)
        index = last[0] if last is not None and retry else self._call_counts.get(node_path, 0) + 1
        key = idempotency_key(self.run_id, node_path, index)
        where = {"node_path": node_path, "index": index, "idempotency_key": key, "tool": tool.name}
        step = f"call {index} at {node_path or '<top>'} ({tool.name}, key {key})"
        record = self._records.get(key)
        if record is None:
            if self._open:
                raise ReplayEndReachedError(f"{step}: not reached by the recording", **where)
            raise ReplayDivergedError(f"{step}: the finished recording has no such call", **where)
        if record.tool != tool.name:
            raise ReplayDivergedError(f"{step}: the recording has tool {record.tool!r} at this step", **where)
        if self._strict_args and record.args_digest != args_digest:
            raise ReplayDivergedError(f"{step}: arguments differ from the recorded ones", **where)
        self._call_counts[node_path] = max(index, self._call_counts.get(node_path, 0))
        if record.effect_committed:
            result = self._result(record)
            self.calls.append(ReplayedCall(node_path, index, key, tool.name, record.status.value, result))
            return result
        failed = record.status is CallStatus.FAILED or record.reconciled_outcome is ReconciledOutcome.FAILED
        if failed:
            self._failed_last[node_path] = (index, tool.name, args_digest)
            self.calls.append(ReplayedCall(node_path, index, key, tool.name, record.status.value, None))
            error = self._content.reveal(record.error, [self.run_id, *self.state.fork_lineage],
                                         call_address(record.call_id), "error")
            raise ReplayedToolError(error or "reconciled as FAILED", retryable=bool(record.retryable),
                                    call_id=record.call_id)
        raise ReplayEndReachedError(f"{step}: the recording holds no outcome for it ({record.status})", **where)

    def _result(self, record: ExecutionRecord) -> Any:
        runs = [self.run_id, *self.state.fork_lineage]
        if record.result_json is not None:
            return json.loads(self._content.open(record.result_json, runs, call_address(record.call_id),
                                                 "result_json") or "null")
        if record.result_ref is not None:
            text = (self._results.get(record.result_ref, run_id=self.run_id) if self._results is not None
                    else None)
            if text is None:
                raise ResultUnavailableError(f"result {record.result_ref} of call {record.call_id} can no longer "
                                             f"be read: {unavailable_reason(record.result_ref)}")
            return json.loads(self._content.open(text, runs, payload_address(record.call_id), "result_ref") or "null")
        if record.status is CallStatus.RECONCILED:
            return None
        raise ResultUnavailableError(f"call {record.call_id} committed but its result was not recorded")

    # -- other facts: compared, never published ------------------------------------------------------
    def message(self, role: str, content: str, *, user_id: str | None = None) -> Event | None:
        """The recorded MESSAGE with this role and content at this node, or None (noted)."""
        return self._match(EventType.MESSAGE, self.node_path, {"role": role, "content": content})

    def correction(self, subject: str, text: str, *, user_id: str | None = None) -> Event | None:
        """The recorded USER_CORRECTION with this subject and text at this node, or None (noted)."""
        return self._match(EventType.USER_CORRECTION, self.node_path, {"subject": subject, "text": text})

    def emit(self, type: EventType | str, payload: dict[str, Any], *, node_id: str | None = None,
             durable: bool | None = None) -> Event | None:
        """The recorded event of this type and node whose payload has these values, or None (noted).

        Raises:
            ValueError: a type ``RunHandle.emit`` refuses too.
        """
        etype = EventType(type)
        if etype in _RESERVED:
            raise ValueError(f"{etype} is published by start_run/resume/succeed/fail or the recovery job, not emit()")
        return self._match(etype, node_id or self.node_path, payload)

    def request_approval(self, call_id: str, reason: str, tool: str | None = None, *,
                         args: Any = None) -> Event | None:
        """The recorded APPROVAL_REQUESTED of ``call_id`` when it was decided by the replay point.

        Raises:
            ReplayEndReachedError: it is still pending at the replay point, or (unfinished recording) was
                never requested.
            ReplayDivergedError: a finished recording never requested it.
        """
        where = {"node_path": self.node_path or "", "tool": tool or ""}
        if call_id in self.state.pending_approvals:
            raise ReplayEndReachedError(f"approval {call_id} is pending at the replay point", **where)
        if call_id not in self._requested:
            cls = ReplayEndReachedError if self._open else ReplayDivergedError
            raise cls(f"approval {call_id} was never requested in the recording", **where)
        return self._match(EventType.APPROVAL_REQUESTED, None, {"call_id": call_id})

    def succeed(self, output: Any = None) -> Event | None:
        """Compare with the recorded RUN_SUCCEEDED (status and ``output_json``); ends the replayed run."""
        expected = None if output is None else canonical_json(output)
        recorded = self._content.reveal(self.state.output_json, [self.run_id, *self.state.fork_lineage], "run",
                                        "output_json")
        if recorded != expected or self.state.status is not RunStatus.SUCCEEDED:
            self._note(f"succeed({expected}) but the recording shows {self.state.status} with output {recorded}")
        self._finished = EventType.RUN_SUCCEEDED
        return self._match(EventType.RUN_SUCCEEDED, None, {}, note=False)

    def fail(self, error: str | BaseException) -> Event | None:
        """Compare with the recorded RUN_FAILED (status); ends the replayed run."""
        if self.state.status is not RunStatus.FAILED:
            self._note(f"fail({error!s}) but the recording shows {self.state.status}")
        self._finished = EventType.RUN_FAILED
        return self._match(EventType.RUN_FAILED, None, {}, note=False)

    def _match(self, etype: EventType, node_id: str | None, fields: dict[str, Any], *,
               note: bool = True) -> Event | None:
        for sig, queue in self._by_sig.items():  # a queue's events share type, node and payload
            if sig[0] is not etype or sig[1] != node_id or not queue:
                continue
            if all(self._recorded(queue[0], k) == v for k, v in fields.items() if v is not None):
                return queue.pop(0)
        if note:
            self._note(f"{etype} at {node_id or '<top>'} with {fields} is not in the recording")
        return None

    def _recorded(self, event: Event, name: str) -> Any:
        """``event``'s payload field ``name`` as recorded: a content field opened (decision 0059; ``encrypted``
        without the key, which then differs from the code's value and is noted)."""
        value = event.payload.get(name)
        address = address_of(event, name)
        if address is None or not isinstance(value, str):
            return value
        return self._content.reveal(value, [self.run_id, *self.state.fork_lineage], address, name)

    def _note(self, text: str) -> None:
        self.mismatches.append(text)

    def __enter__(self) -> ReplayHandle:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        return None

    def __repr__(self) -> str:
        return f"ReplayHandle(run_id={self.run_id!r}, epoch={self.epoch}, last_seq={self.last_seq})"


def _decided(state: RunState) -> dict[str, ApprovalStatus]:
    """call_id -> GRANTED / DENIED from the journal (pending ones are left out: see request_approval)."""
    return {cid: ApprovalStatus.GRANTED if d.decision is Decision.GRANTED else ApprovalStatus.DENIED
            for cid, d in state.approvals.items()}


def _signature(event: Event) -> tuple[Any, ...]:
    return (event.type, event.node_id, canonical_json(event.payload))
