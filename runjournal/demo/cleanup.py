"""Remove what one demo created: its topics, consumer groups, Redis keys, Qdrant collections and work folder.

``runjournal demo`` runs under a fresh topic prefix (``demo-<utc time>-<seed>``); unless ``--keep`` is given,
everything under that prefix is removed at the end, so repeated demos leave nothing behind. Each part is
best effort and reported: a part that could not be removed is named in the summary, never hidden.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

from runjournal.core import kafka, redis_client
from runjournal.core.redis_keys import RedisKeys
from runjournal.core.settings import Settings

__all__ = ["remove_demo"]


def remove_demo(settings: Settings, workdir: Path | None = None, *, timeout_s: float = 30.0) -> dict[str, Any]:
    """Delete the demo's topics and consumer groups, Redis keys, Qdrant collection(s) and ``workdir``.

    Returns:
        ``{"topics_deleted": [...], "groups_deleted": [...], "redis_keys_deleted": n,
        "qdrant_collections_deleted": [...], "workdir_deleted": bool, "cleanup_errors": [...]}``.
    """
    out: dict[str, Any] = {"topics_deleted": [], "groups_deleted": [], "redis_keys_deleted": 0,
                           "qdrant_collections_deleted": [], "workdir_deleted": False, "cleanup_errors": []}
    admin = kafka.admin_client(settings)
    topics = list(settings.all_topics)
    for name, fut in admin.delete_topics(topics, operation_timeout=timeout_s).items():
        try:
            fut.result(timeout_s)
            out["topics_deleted"].append(name)
        except Exception as exc:  # noqa: BLE001 - reported, never hidden
            if "UNKNOWN_TOPIC_OR_PART" not in str(exc):  # never created (e.g. no schema ever published): fine
                out["cleanup_errors"].append(f"topic {name}: {exc}")
    groups = [f"{settings.topic_prefix}.projector", f"{settings.topic_prefix}.memory"]
    for name, fut in admin.delete_consumer_groups(groups, request_timeout=timeout_s).items():
        try:
            fut.result(timeout_s)
            out["groups_deleted"].append(name)
        except Exception as exc:  # noqa: BLE001 - a group that never formed is fine to report
            if "GROUP_ID_NOT_FOUND" not in str(exc):
                out["cleanup_errors"].append(f"group {name}: {exc}")
    # every key family of the prefix (RedisKeys.patterns), SCAN and DEL on each primary of a cluster
    out["redis_keys_deleted"] = redis_client.delete_matching(redis_client.client(settings),
                                                             RedisKeys(settings.topic_prefix).patterns())
    out["qdrant_collections_deleted"], errors = _drop_collections(settings)
    out["cleanup_errors"].extend(errors)
    if workdir is not None and workdir.exists():
        shutil.rmtree(workdir, ignore_errors=True)
        out["workdir_deleted"] = not workdir.exists()
    return out


def _drop_collections(settings: Settings) -> tuple[list[str], list[str]]:
    try:
        from qdrant_client import QdrantClient
    except ModuleNotFoundError:  # installed without the [memory] extra: no collection was made
        return [], []
    from runjournal.consumers.memory.payload import collection_name

    clean = collection_name(settings.topic_prefix, "x", 0).rsplit("_memory__", 1)[0]
    heads = (f"{clean}_memory__", f"{clean}_knowledge__")  # memory and the demo's knowledge corpus
    try:
        if settings.qdrant_url:
            key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
            client = QdrantClient(url=settings.qdrant_url, api_key=key, timeout=10, check_compatibility=False)
        else:
            if not Path(settings.effective_qdrant_path).exists():
                return [], []
            client = QdrantClient(path=str(settings.effective_qdrant_path))
        try:
            names = [c.name for c in client.get_collections().collections if c.name.startswith(heads)]
            for name in names:
                client.delete_collection(name)
            return names, []
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - reported (e.g. the local directory held by another process)
        return [], [f"qdrant: {exc}"]
