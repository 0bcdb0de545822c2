"""TEST DOUBLE: a feature-hashing embedder, for tests that exercise the memory plane's plumbing
(Kafka, Qdrant, supersession, isolation) without paying for the real model on every test.

It is not a model: similarity here is word overlap, nothing more. Production code never uses it —
the default embedder is ``runjournal.consumers.memory.embed.MiniLMEmbedder`` (tested in test_memory_embedder.py).
Its ``embedder_id`` starts with ``TEST-DOUBLE`` so its vectors can never share a collection with real ones.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence

import numpy as np

from runjournal.consumers.memory.embed import Embedder


class HashingEmbedder:
    """TEST DOUBLE. Words and character trigrams hashed (blake2b) into ``dimension`` signed buckets, L2-normalised."""

    embedder_id = "TEST-DOUBLE-hashing@1"

    def __init__(self, dimension: int = 64, fail_on: str | None = None) -> None:
        self.dimension = dimension
        self.fail_on = fail_on
        """Raise EmbedderError for any batch holding a text containing this string (to test dead-lettering)."""
        self.calls = 0

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        from runjournal.consumers.memory.errors import EmbedderError

        self.calls += 1
        if self.fail_on is not None and any(self.fail_on in t for t in texts):
            raise EmbedderError(f"test double refuses texts containing {self.fail_on!r}")
        out = np.zeros((len(texts), self.dimension), dtype=np.float32)
        for row, text in enumerate(texts):
            words = re.findall(r"[a-z0-9]+", text.lower())
            grams = [w[i:i + 3] for w in words for i in range(max(1, len(w) - 2))]
            for feature in [*words, *grams] or [text]:
                digest = hashlib.blake2b(feature.encode(), digest_size=8).digest()
                bucket = int.from_bytes(digest[:4], "little") % self.dimension
                out[row, bucket] += 1.0 if digest[4] & 1 else -1.0
            norm = float(np.linalg.norm(out[row]))
            if norm == 0.0:
                out[row, 0], norm = 1.0, 1.0
            out[row] /= norm
        return out


def test_the_double_satisfies_the_embedder_port_and_is_labelled() -> None:
    double = HashingEmbedder()
    assert isinstance(double, Embedder)
    assert double.embedder_id.startswith("TEST-DOUBLE")


def test_the_double_is_deterministic_and_normalised() -> None:
    double = HashingEmbedder()
    a = double.embed(["I prefer window seats", "", "x"])
    b = double.embed(["I prefer window seats", "", "x"])
    assert a.shape == (3, 64) and np.array_equal(a, b)
    assert np.allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
