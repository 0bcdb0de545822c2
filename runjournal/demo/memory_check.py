"""Count the demo's memory items in Qdrant and check that each carries provenance (independent of the extractor)."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

__all__ = ["memory_counts"]

_PROVENANCE = ("run_id", "event_id", "partition", "offset")
_KNOWLEDGE_PROVENANCE = ("path", "section", "content_sha256", "ingested_at", "document_version")


def _has_provenance(payload: dict[str, Any]) -> bool:
    prov = payload.get("provenance") if isinstance(payload.get("provenance"), dict) else payload
    return all(prov.get(k) is not None for k in _PROVENANCE) and payload.get("authority", "advisory") == "advisory"


def _knowledge_has_provenance(payload: dict[str, Any]) -> bool:
    return all(payload.get(k) for k in _KNOWLEDGE_PROVENANCE) and "scope" not in payload


def memory_counts(env: dict[str, str], final: subprocess.CompletedProcess[str] | None = None) -> dict[str, Any]:
    """``{"memory_items_written", "memory_items_without_provenance", "memory_collections",
    "knowledge_passages", "knowledge_passages_without_provenance"}`` read from Qdrant (memory and knowledge
    collections apart: each kind is checked for its own provenance).

    Opens the local path (the extractor must be stopped) or the server from ``env``.
    """
    from qdrant_client import QdrantClient

    prefix = env["RUNJOURNAL_TOPIC_PREFIX"]
    url = env.get("RUNJOURNAL_QDRANT_URL")
    client = QdrantClient(url=url) if url else QdrantClient(path=str(Path(env["RUNJOURNAL_QDRANT_PATH"])))
    written = missing = passages = passages_missing = 0
    names = []
    try:
        for coll in client.get_collections().collections:
            sanitised = prefix.replace(".", "_").replace("-", "_")
            if not (coll.name.startswith(sanitised) or coll.name.startswith(prefix)):
                continue
            names.append(coll.name)
            offset = None
            while True:
                points, offset = client.scroll(coll.name, limit=512, offset=offset, with_payload=True,
                                               with_vectors=False)
                for p in points:
                    if "_knowledge__" in coll.name:
                        passages += 1
                        passages_missing += 0 if _knowledge_has_provenance(p.payload or {}) else 1
                        continue
                    written += 1
                    missing += 0 if _has_provenance(p.payload or {}) else 1
                if offset is None:
                    break
    finally:
        client.close()
    out: dict[str, Any] = {"memory_items_written": written, "memory_items_without_provenance": missing,
                           "memory_collections": names, "knowledge_passages": passages,
                           "knowledge_passages_without_provenance": passages_missing}
    if final is not None and final.stdout.strip():
        try:
            out["memory_extractor_final_pass"] = json.loads(final.stdout.strip().splitlines()[-1])
        except ValueError:
            out["memory_extractor_final_pass"] = final.stdout[-500:]
    return out
