"""Pair 16 (``bench/encryption.py``, issue 33) runs end to end at tiny sizes: its rows come out with both sides
measured, the encrypted side really encrypted (its keys were made, the projector's input carries tokens) and the
plain side did not. The figures themselves are ``make bench``'s (bench/README.md), never a timed unit test's."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench._env import BenchEnv
from bench.encryption import EncryptionConfig, _sealer, encrypted_settings, run_encryption
from bench.runner import _sizes
from runjournal.core.crypto.token import is_encrypted
from runjournal.core.settings import Settings
from runjournal.schemas import Event, EventType, utcnow

pytestmark = pytest.mark.integration


def test_pair_16_runs_and_its_encrypted_side_encrypts(settings: Settings, tmp_path: Path) -> None:
    env = BenchEnv(base=settings.model_copy(update={"partitions": 3}), work_dir=tmp_path)
    try:
        rows = run_encryption(env, EncryptionConfig(events=200, calls=5, runs=10, rounds=1, warmup=0))
    finally:
        env.cleanup()
    assert [(r.side, r.metric) for r in rows] == [
        ("emit, encryption on", "events/s"), ("call, encryption on", "ms p50"), ("call, encryption on", "ms p99"),
        ("projector, encrypted events", "events/s")]
    assert all(r.ours.value > 0 and r.anchor is not None and r.anchor.value > 0 and r.ratio for r in rows)
    projector = rows[-1]
    assert projector.goal == "≥ 0.8" and projector.met is not None
    assert len(projector.ours.rounds) == len(projector.anchor.rounds) == 1  # type: ignore[union-attr]
    assert any(tmp_path.glob("keys-*/kek/*.json")), "the encrypted side made no key: it did not encrypt"


def test_the_projector_input_of_the_encrypted_side_carries_tokens(settings: Settings, tmp_path: Path) -> None:
    seal = _sealer(encrypted_settings(settings, tmp_path / "keys"))
    event = Event(event_id="e" * 36, run_id="r" * 36, tenant_id="acme", seq=2, epoch=1, producer_id="p",
                  type=EventType.MESSAGE, occurred_at=utcnow(), payload={"role": "user", "content": "my card 4111"})
    assert is_encrypted(seal(event).payload["content"])
    with pytest.raises(RuntimeError, match="not on"):
        _sealer(settings)


def test_the_runner_knows_pair_16() -> None:
    assert _sizes(True, None)["encryption_runs"] > 0
