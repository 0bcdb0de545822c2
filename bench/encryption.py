"""Pair 16 — encryption at rest (issue 33): emit, call and the projector with ``RUNJOURNAL_ENCRYPTION`` on vs off.

Both sides of every row run in the same process, on the same broker and Redis, interleaved round by round with the
order alternating (A B, B A …); the ratio is **on / off**. Encryption on means ``Settings(encryption="on")`` with a
local key directory of the pair's own (``keys_dir`` in the bench's scratch directory: decision 0059,
docs/guide/encryption.md); off is the same settings without it.

* **emit** — pair 1's workload: ``RunHandle.emit`` of MESSAGE / NODE_STARTED / MESSAGE / NODE_SUCCEEDED over 100
  runs, ``flush()`` at the end, one :class:`~runjournal.producers.Journal` per side on the same topic. With
  encryption on every MESSAGE's ``content`` (~200 B, half the events) is sealed (AES-256-GCM under the user's data
  key) before it is encoded. Events/s.
* **call** — pair 2's ``run.call`` of a no-op tool with ``reconcile()`` (group commit, the default), one Journal per
  side: with encryption on the call's ``args_json`` and ``result_json`` are sealed (the digests are taken of the
  plain text first). ms p50 and p99, pooled over rounds.
* **projector** — pair 3's workload (complete runs of 50 events: RUN_STARTED of user ``u1``, messages, tool calls),
  published twice to two topics: once as written by a journal with encryption on (every content field a token,
  sealed by the journal's own :class:`~runjournal.producers.encryption.ContentCrypto`), once plain. The projector
  holds no key: it folds and stores the tokens as they are, so its work changes only by the tokens' longer strings.
  ``Projector.run(until_caught_up=True)`` from nothing each round; records/s as in pair 3.

Goals: projector ≥ 0.8 (issue 33). Call p50 ≤ 1.1: two seals (~tens of µs each here) on a call that waits for a
broker round trip (~2-3 ms). Emit is CPU-bound (~10 µs an event), so a seal of half its events shows at full size:
reported with the sealing cost per sealed field in the note, no goal (bench/README.md § Results).
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from bench._env import BenchEnv
from bench._model import Row, goal_met, paired_ratios, percentile, summarise
from bench._rounds import Side, interleave
from bench.boundary import NoopTool
from bench.projection import projector_rate, publish_workload
from bench.publish import RUNS
from bench.publish import _emit_round as emit_round
from runjournal.core.settings import Settings
from runjournal.producers import Journal
from runjournal.producers.encryption import ContentCrypto
from runjournal.schemas import Event

__all__ = ["EncryptionConfig", "encrypted_settings", "run_encryption"]

PAIR = "16 encryption"
ON, OFF = "encryption on", "encryption off"
GOALS = {"projector": "≥ 0.8", "call p50": "≤ 1.1"}
"""Goals on the on/off ratio (see the module docstring)."""


@dataclass(frozen=True)
class EncryptionConfig:
    """Sizes of pair 16."""

    events: int
    """Events emitted per side per round."""
    calls: int
    """Calls per side per round."""
    runs: int
    """Runs (of 50 events) on each projector topic."""
    rounds: int
    """Measured rounds (after the warm-up)."""
    warmup: int = 1
    """Warm-up rounds, discarded (0 only in the test that the pair runs)."""


def encrypted_settings(settings: Settings, keys_dir: Any) -> Settings:
    """``settings`` with ``encryption="on"`` and the local key directory ``keys_dir`` (created by the first write)."""
    return settings.model_copy(update={"encryption": "on", "keys_dir": keys_dir})


def _calls(journal: Journal, n: int) -> list[float]:
    tool, out = NoopTool(), []
    run = journal.start_run("acme", "bench", {"pair": 16}, user_id="u1")
    with run.node("work"):
        for i in range(n):
            t0 = time.perf_counter_ns()
            run.call(tool, {"i": i, "card": "4111 1111 1111 1111"})
            out.append((time.perf_counter_ns() - t0) / 1e6)
    run.succeed()
    return out


def _sealer(settings: Settings) -> Any:
    """The journal's own sealing of an event (the run's user is ``u1``, as its RUN_STARTED says)."""
    crypto = ContentCrypto(settings)
    if not crypto.encrypting:
        raise RuntimeError("encryption is not on: the projector's input would be plain")

    def seal(event: Event) -> Event:
        return crypto.seal(event, "u1")
    return seal


def _seal_cost_us(settings: Settings, samples: int = 2000) -> float:
    """µs per sealed MESSAGE ``content`` (the emit workload's field), in this process."""
    from bench.publish import _CYCLE
    from runjournal.schemas import new_event_id, utcnow

    crypto = ContentCrypto(settings)
    etype, payload = _CYCLE[0]
    events = [Event(event_id=new_event_id(), run_id="r", tenant_id="acme", seq=i + 1, epoch=1, producer_id="p",
                    type=etype, occurred_at=utcnow(), payload=payload) for i in range(samples)]
    crypto.seal(events[0], "u1")
    t0 = time.perf_counter()
    for e in events:
        crypto.seal(e, "u1")
    return (time.perf_counter() - t0) / samples * 1e6


def run_encryption(env: BenchEnv, cfg: EncryptionConfig) -> list[Row]:
    """Run pair 16; returns its rows (see the module docstring).

    Raises:
        RuntimeError: the encrypted side did not encrypt (its journal or sealer reports plain), or a projector
            handled fewer records than were published.
    """
    off = env.pair_settings("encryption")
    on = encrypted_settings(off, env.work_dir / f"keys-{off.topic_prefix}")
    tag = uuid.uuid4().hex[:6]
    with Journal(on, producer_id=f"bench-{tag}-on") as j_on, Journal(off, producer_id=f"bench-{tag}-off") as j_off:
        if not j_on.content.encrypting or j_off.content.encrypting:
            raise RuntimeError("the encryption on/off journals are not what they claim")
        h_on = [j_on.start_run("acme", "bench", {"i": i}) for i in range(RUNS)]
        h_off = [j_off.start_run("acme", "bench", {"i": i}) for i in range(RUNS)]
        j_on.flush()
        j_off.flush()
        emit = interleave(f"{PAIR} (emit)", [Side(ON, lambda: emit_round(j_on, h_on, cfg.events)),
                                             Side(OFF, lambda: emit_round(j_off, h_off, cfg.events))],
                          rounds=cfg.rounds, warmup=cfg.warmup, rotate=True)
        call = interleave(f"{PAIR} (call)", [Side(ON, lambda: _calls(j_on, cfg.calls)),
                                             Side(OFF, lambda: _calls(j_off, cfg.calls))],
                          rounds=cfg.rounds, warmup=cfg.warmup, rotate=True)
    seal_us = _seal_cost_us(on)
    p_on, p_off = env.pair_settings("encryption-proj-on"), env.pair_settings("encryption-proj-off")
    n_on = publish_workload(p_on, cfg.runs, 50, seal=_sealer(encrypted_settings(p_on, on.keys_dir)))
    n_off = publish_workload(p_off, cfg.runs, 50)
    proj = interleave(f"{PAIR} (projector)", [Side(ON, lambda: projector_rate(p_on, n_on)),
                                              Side(OFF, lambda: projector_rate(p_off, n_off))],
                      rounds=cfg.rounds, warmup=cfg.warmup, rotate=True)
    rows = [Row(PAIR, "events/s", "emit, encryption on", summarise(emit[ON]), "emit, encryption off",
                summarise(emit[OFF]), ratio_rounds=paired_ratios(emit[ON], emit[OFF]),
                note=f"pair 1's workload, {cfg.events} events/round over {RUNS} runs; half are MESSAGEs whose content "
                     f"is sealed: {seal_us:.0f} µs per sealed field here (measured apart); no goal (CPU-bound)")]
    for q in (50, 99):
        per = {s: [percentile(r, q) for r in call[s]] for s in (ON, OFF)}
        pooled = {s: percentile([x for r in call[s] for x in r], q) for s in (ON, OFF)}
        o, a = summarise(per[ON], pooled[ON]), summarise(per[OFF], pooled[OFF])
        goal = GOALS.get(f"call p{q}")
        rows.append(Row(PAIR, f"ms p{q}", "call, encryption on", o, "call, encryption off", a, goal=goal,
                        met=goal_met(o.value / a.value, goal) if goal else None,
                        ratio_rounds=paired_ratios(per[ON], per[OFF]),
                        note=(f"run.call of a no-op tool (group commit), {cfg.calls * cfg.rounds} samples per side; "
                              "args_json and result_json sealed") if q == 50 else ""))
    ours, anchor = summarise(proj[ON]), summarise(proj[OFF])
    rows.append(Row(PAIR, "events/s", "projector, encrypted events", ours, "projector, plain events", anchor,
                    goal=GOALS["projector"], met=goal_met(ours.value / anchor.value, GOALS["projector"]),
                    ratio_rounds=paired_ratios(proj[ON], proj[OFF]),
                    note=f"{n_on} events over {cfg.runs} runs per topic, rebuilt from nothing each round; the "
                         "projector holds no key and stores the tokens"))
    return rows
