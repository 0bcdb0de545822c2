"""``QdrantKnowledgeBase``: the :class:`~runjournal.stores.Retriever` on a Qdrant knowledge collection, and
its ingest (the corpus's only writer).

One collection per vector space, ``{prefix}_knowledge__{embedder_id}_{dimension}`` (cosine), beside — never
inside — the memory collection. One point per passage (:mod:`~runjournal.consumers.knowledge.sections`);
payload::

    store="knowledge", authority="advisory", corpus, text (the passage), passage_index,
    section_id, section, heading_path [..], section_text, path, content_sha256, document_version,
    ingested_at, status ("active" | "superseded"), superseded_by (sha256 | null), valid_until, embedder_id

No tenant, user or agent key exists: the corpus is shared and holds no tenant-private data.

Ingest of a document (its absolute path is its identity), per section (identity: heading path + ordinal):

1. same content sha256 as the active version → nothing is written (re-ingesting is a no-op);
2. new content → its passages are embedded and written (ids ``uuid5(path#key#sha#i)``), then the old
   version's points are marked superseded (``superseded_by`` = the new sha256, ``valid_until`` = now);
3. a section no longer in the document → its points are marked superseded (``superseded_by`` null).

``retrieve`` reads active points only, groups passages by section (Qdrant ``query_points_groups``) and
returns each section once, ranked by its best passage. It never writes.
"""

from __future__ import annotations

import contextlib
import hashlib
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from qdrant_client import QdrantClient, models

from runjournal.consumers.knowledge.errors import DocumentError
from runjournal.consumers.knowledge.sections import Section, passages, split_markdown
from runjournal.consumers.vectors.embed import Embedder
from runjournal.consumers.vectors.errors import VectorSpaceError
from runjournal.consumers.vectors.qdrant import iso, mapped, open_client
from runjournal.stores import Authority, Evidence, KnowledgeScope, Plane, PlaneError, ProvenanceError, ScopeError

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["DEFAULT_CORPUS", "PROVENANCE_KEYS", "STORE", "IngestReport", "QdrantKnowledgeBase",
           "knowledge_collection"]

#: Every knowledge point's ``store``: a knowledge search that meets another value is a cross-use.
STORE = "knowledge"
#: Corpus of documents ingested without ``--corpus``.
DEFAULT_CORPUS = "default"
#: Payload keys every evidence must carry (a point missing one is refused at query time).
PROVENANCE_KEYS = ("path", "section", "heading_path", "content_sha256", "ingested_at", "document_version")
_NS = uuid.UUID("0b7f3c59-31a4-5d2e-8a0c-6d1e2f4b5a69")  # never change: point ids derive from it
_V2 = "runjournal.knowledge.v2:"


def point_name(path: str, key: str, sha256: str, index: int | None = None) -> str:
    """The uuid5 name of a section (``index`` None: its ``section_id``) or of its ``index``-th passage (its point id).

    ``<path>#<key>#<sha256>[#<index>]`` as always when the path holds no ``#``: the first ``#`` ends the path, and
    from the right the index is decimal, the sha256 is hex, and the key (``Section.key``) is what is left — so a
    document keeps its point ids. A path holding ``#`` would make two splits one name (``/d/a.md`` with heading
    ``x#y`` and ``/d/a.md#x`` with heading ``y``), so it is written length-prefixed, ``runjournal.knowledge.v2:<len
    path>:<path>#…``, a name no v1 name equals: a v1 name starts with an absolute path
    (docs/design/protocol.md § Identifiers and keys).
    """
    tail = "#".join([key, sha256, *([] if index is None else [str(index)])])
    return f"{path}#{tail}" if "#" not in path else f"{_V2}{len(path)}:{path}#{tail}"
_IDENTITY_KEYS = ("scope", "tenant_id", "user_id", "agent_id")
_PAGE = 256


def knowledge_collection(prefix: str, embedder_id: str, dimension: int) -> str:
    """``{prefix}_knowledge__{embedder_id}_{dimension}``, non ``[a-z0-9]`` runs turned into ``_``."""
    def clean(text: str) -> str:
        return "".join(c if c.isalnum() else "_" for c in text.lower()).strip("_")
    return f"{clean(prefix)}_knowledge__{clean(embedder_id)}_{dimension}"


@dataclass(frozen=True, slots=True)
class IngestReport:
    """What one document's ingest changed (counts are sections unless named passages)."""

    path: str
    """The document's absolute path (its identity)."""
    document_version: str
    """``sha256:<first 16 hex>`` of the document's bytes."""
    sections: int
    """Sections with text in the document."""
    added: int
    """Sections new to the corpus."""
    changed: int
    """Sections whose content changed (the old version is superseded)."""
    removed: int
    """Sections no longer in the document (superseded, no successor)."""
    unchanged: int
    """Sections already ingested with the same content (nothing written)."""
    passages_written: int
    """Points written."""

    def as_dict(self) -> dict[str, Any]:
        """JSON-able dict of every field."""
        return {"path": self.path, "document_version": self.document_version, "sections": self.sections,
                "added": self.added, "changed": self.changed, "removed": self.removed, "unchanged": self.unchanged,
                "passages_written": self.passages_written}


class QdrantKnowledgeBase:
    """The knowledge corpus in one Qdrant collection (see module docstring). Not thread-safe.

    Args:
        client: a connected ``QdrantClient`` (or a :class:`~runjournal.consumers.vectors.qdrant.SerialClient`).
        embedder: names the vector space and embeds passages and queries (the memory plane's MiniLM by default).
        prefix: topic prefix; first part of the collection name.
        mode: ``"local"`` or ``"server"`` (for :meth:`stats`).
    """

    plane = Plane.COGNITION
    authority = Authority.ADVISORY

    def __init__(self, client: QdrantClient, embedder: Embedder, *, prefix: str, mode: str = "server") -> None:
        self.client = client
        self.embedder = embedder
        self.mode = mode
        self.collection = knowledge_collection(prefix, embedder.embedder_id, embedder.dimension)
        self._ready = False

    @classmethod
    def open(cls, settings: Settings, embedder: Embedder, *, timeout_s: int = 5,
             wait_s: float = 0.0) -> QdrantKnowledgeBase:
        """Open the knowledge base ``settings`` name (server or local directory; see
        :func:`runjournal.consumers.vectors.qdrant.open_client`). Other processes than the directory's owner
        read through :func:`runjournal.consumers.cognition.open_retriever`.

        Raises:
            StoreLockedError: local mode and another process holds the directory for longer than ``wait_s``.
        """
        client, mode = open_client(settings, timeout_s=timeout_s, wait_s=wait_s)
        return cls(client, embedder, prefix=settings.topic_prefix, mode=mode)

    def close(self) -> None:
        """Close the client (releases the local directory)."""
        with contextlib.suppress(Exception):
            self.client.close()

    def __enter__(self) -> QdrantKnowledgeBase:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()

    # -- collection ----------------------------------------------------------------------------
    def ensure_collection(self) -> None:
        """Create the collection if missing; check its vector space.

        Raises:
            VectorSpaceError: an existing collection of this name has another size or distance.
        """
        if self._ready:
            return
        dim = self.embedder.dimension
        with mapped("create collection"):
            if not self.client.collection_exists(self.collection):
                self.client.create_collection(self.collection, vectors_config=models.VectorParams(
                    size=dim, distance=models.Distance.COSINE))
            params = self.client.get_collection(self.collection).config.params.vectors
        if not isinstance(params, models.VectorParams) or params.size != dim or \
                params.distance != models.Distance.COSINE:
            raise VectorSpaceError(f"collection {self.collection} holds vectors {params}, not {dim}-d cosine")
        self._ready = True

    # -- ingest (the only writer) ----------------------------------------------------------------
    def ingest(self, path: str | Path, *, corpus: str = DEFAULT_CORPUS, now: datetime | None = None) -> IngestReport:
        """Ingest one Markdown document (steps in the module docstring).

        Args:
            path: the document; its absolute path becomes its identity and provenance.
            corpus: corpus name (default ``default``).
            now: ingest time (default: the current UTC time).

        Raises:
            DocumentError: the file is missing, unreadable, not UTF-8, or has no section with text.
            StoreUnavailableError / StoreWriteError: Qdrant failed.
        """
        doc = Path(path).resolve()
        try:
            raw = doc.read_bytes()
        except OSError as exc:
            raise DocumentError(f"cannot read {doc}: {exc.strerror or exc}") from exc
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise DocumentError(
                f"{doc} is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}): convert it first, e.g. "
                f"`iconv -f latin1 -t utf-8 {doc.name} > {doc.stem}.utf8{doc.suffix}`") from exc
        sections = split_markdown(text, title=doc.stem)
        if not sections:
            raise DocumentError(f"{doc} has no Markdown section with text")
        version = "sha256:" + hashlib.sha256(raw).hexdigest()[:16]
        stamp = iso(now or datetime.now(UTC))
        self.ensure_collection()
        active = self._active_by_section(str(doc))
        previous = dict(active)
        counts = {"added": 0, "changed": 0, "unchanged": 0, "passages": 0}
        fresh: list[tuple[Section, list[str]]] = []
        for section in sections:
            old = active.pop(section.key, None)
            if old is not None and old[0] == section.sha256:
                counts["unchanged"] += 1
                continue
            counts["changed" if old else "added"] += 1
            fresh.append((section, passages(section)))
        counts["passages"] = self._write(str(doc), corpus, version, stamp, fresh)
        for section, _ in fresh:  # supersede after the successor is durable: never a moment with no version
            if section.key in previous:
                self._supersede(previous[section.key][1], section.sha256, stamp)
        for _sha, ids in active.values():  # sections gone from the document
            self._supersede(ids, None, stamp)
        return IngestReport(path=str(doc), document_version=version, sections=len(sections), added=counts["added"],
                            changed=counts["changed"], removed=len(active), unchanged=counts["unchanged"],
                            passages_written=counts["passages"])

    def _active_by_section(self, path: str) -> dict[str, tuple[str, list[str]]]:
        """section key -> (content sha256, point ids) of the document's active points."""
        flt = models.Filter(must=[_eq("store", STORE), _eq("path", path), _eq("status", "active")])
        out: dict[str, tuple[str, list[str]]] = {}
        for pid, payload in self._scroll(flt):
            out.setdefault(payload["section_key"], (payload["content_sha256"], []))[1].append(pid)
        return out

    def _write(self, path: str, corpus: str, version: str, stamp: str,
               fresh: Sequence[tuple[Section, list[str]]]) -> int:
        texts = [p for _, ps in fresh for p in ps]
        if not texts:
            return 0
        vectors = self.embedder.embed(texts)
        points: list[models.PointStruct] = []
        row = 0
        for section, ps in fresh:
            sid = str(uuid.uuid5(_NS, point_name(path, section.key, section.sha256)))
            for index, passage in enumerate(ps):
                payload = {"store": STORE, "authority": "advisory", "corpus": corpus, "text": passage,
                           "passage_index": index, "section_id": sid, "section_key": section.key,
                           "section": section.heading, "heading_path": list(section.heading_path),
                           "section_text": section.text, "path": path, "content_sha256": section.sha256,
                           "document_version": version, "ingested_at": stamp, "status": "active",
                           "superseded_by": None, "valid_until": None, "embedder_id": self.embedder.embedder_id}
                pid = str(uuid.uuid5(_NS, point_name(path, section.key, section.sha256, index)))
                points.append(models.PointStruct(id=pid, vector=vectors[row].tolist(), payload=payload))
                row += 1
        with mapped("upsert"):
            self.client.upsert(self.collection, points=points, wait=True)
        return len(points)

    def _supersede(self, ids: list[str], successor: str | None, stamp: str) -> None:
        with mapped("set_payload"):
            self.client.set_payload(self.collection, payload={"status": "superseded", "superseded_by": successor,
                                                              "valid_until": stamp}, points=ids, wait=True)

    # -- reads (never write) ---------------------------------------------------------------------
    def retrieve(self, query: str, scope: KnowledgeScope | None = None, *, limit: int = 5) -> list[Evidence]:
        """See :meth:`runjournal.stores.Retriever.retrieve`. Scores are cosine similarities of the best passage.

        Raises:
            ScopeError: ``scope`` is not a :class:`KnowledgeScope` (a memory Scope is a cross-use).
            ProvenanceError: a stored point lacks provenance; PlaneError: a point is not knowledge or
                carries a tenant (nothing is returned).
        """
        if scope is not None and not isinstance(scope, KnowledgeScope):
            raise ScopeError(f"knowledge is searched with a KnowledgeScope, not {type(scope).__name__}: the "
                             "corpus is shared and never tenant-scoped")
        must = [_eq("store", STORE), _eq("status", "active")]
        if scope is not None and scope.corpus:
            must.append(_eq("corpus", scope.corpus))
        if scope is not None and scope.document:
            must.append(_eq("path", scope.document))
        vector = self.embedder.embed([query])[0]
        self.ensure_collection()
        with mapped("search"):
            res = self.client.query_points_groups(self.collection, query=vector.tolist(), group_by="section_id",
                                                  limit=limit, group_size=1, query_filter=models.Filter(must=must),
                                                  with_payload=True)
        hits = [(g.hits[0].score, dict(g.hits[0].payload or {})) for g in res.groups if g.hits]
        return [_evidence(score, payload) for score, payload in sorted(hits, key=lambda h: -h[0])]

    def stats(self) -> dict[str, Any]:
        """Collection, embedder, point counts by status, the documents (path → active sections) and the corpora
        (name → active passages)."""
        self.ensure_collection()
        out: dict[str, Any] = {"collection": self.collection, "mode": self.mode,
                               "embedder_id": self.embedder.embedder_id, "dimension": self.embedder.dimension}
        docs: dict[str, set[str]] = {}
        corpora: dict[str, int] = {}
        with mapped("count"):
            for status in ("active", "superseded"):
                flt = models.Filter(must=[_eq("status", status)])
                out[status] = self.client.count(self.collection, count_filter=flt, exact=True).count
        for _pid, payload in self._scroll(models.Filter(must=[_eq("status", "active")])):
            docs.setdefault(payload["path"], set()).add(payload["section_key"])
            name = payload.get("corpus", DEFAULT_CORPUS)
            corpora[name] = corpora.get(name, 0) + 1
        out["documents"] = {path: len(keys) for path, keys in sorted(docs.items())}
        out["corpora"] = dict(sorted(corpora.items()))
        return out

    def _scroll(self, flt: models.Filter) -> list[tuple[str, dict[str, Any]]]:
        out: list[tuple[str, dict[str, Any]]] = []
        offset = None
        with mapped("scroll"):
            while True:
                points, offset = self.client.scroll(self.collection, scroll_filter=flt, limit=_PAGE, offset=offset,
                                                    with_payload=True, with_vectors=False)
                out.extend((str(p.id), dict(p.payload or {})) for p in points)
                if offset is None:
                    return out


def _evidence(score: float, payload: dict[str, Any]) -> Evidence:
    if payload.get("store") != STORE or any(k in payload for k in _IDENTITY_KEYS):
        raise PlaneError("the knowledge collection returned a point that is not shared knowledge (a cross-use)")
    missing = [k for k in PROVENANCE_KEYS if not payload.get(k)]
    if missing:
        raise ProvenanceError(f"knowledge point of section {payload.get('section')!r} lacks provenance {missing}")
    return Evidence(text=payload["text"], score=float(score), section=payload["section"],
                    heading_path=tuple(payload["heading_path"]), path=payload["path"],
                    content_sha256=payload["content_sha256"], document_version=payload["document_version"],
                    ingested_at=payload["ingested_at"], corpus=payload.get("corpus", DEFAULT_CORPUS),
                    section_text=payload.get("section_text", ""))


def _eq(key: str, value: str) -> models.FieldCondition:
    return models.FieldCondition(key=key, match=models.MatchValue(value=value))
