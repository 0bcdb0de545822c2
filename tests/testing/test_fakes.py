"""The test-double embedder of ``runjournal.testing`` is a faithful stand-in for the port: labelled, deterministic,
normalised, and a word-overlap similarity (it is not a model; production uses ``MiniLMEmbedder``)."""

from __future__ import annotations

import numpy as np

from runjournal.consumers.vectors.embed import Embedder
from runjournal.testing import HashingEmbedder


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
