"""Bytes at rest, read raw: the broker's log segment files and Redis's RDB dump (issue 33's acceptance tests)."""

from __future__ import annotations

import time
from pathlib import Path

from runjournal.core import redis_client
from runjournal.core.settings import Settings

__all__ = ["rdb_dump", "segment_bytes"]


def segment_bytes(stack_dir: Path, prefix: str) -> dict[str, bytes]:
    """Every file of the broker's log directories of the prefix's topics (``<topic>-<partition>/…``)."""
    out = {}
    for directory in stack_dir.rglob(f"{prefix}.*-*"):
        if directory.is_dir():
            for path in directory.iterdir():
                if path.is_file():
                    out[str(path.relative_to(stack_dir))] = path.read_bytes()
    return out


def rdb_dump(settings: Settings) -> bytes:
    """Redis's RDB snapshot, written now by BGSAVE (uncompressed strings: LZF would hide plain text too)."""
    r = redis_client.client(settings)
    directory, name = r.config_get("dir")["dir"], r.config_get("dbfilename")["dbfilename"]
    compression = r.config_get("rdbcompression")["rdbcompression"]
    r.config_set("rdbcompression", "no")
    try:
        before = int(r.info("persistence").get("rdb_saves", -1))
        started = r.lastsave()
        deadline = time.monotonic() + 60
        while True:
            try:
                r.bgsave()
                break
            except Exception as exc:  # noqa: BLE001 - "already in progress": wait for it, then ours
                if time.monotonic() > deadline:
                    raise AssertionError(f"BGSAVE refused: {exc}") from exc
                time.sleep(0.2)
        while time.monotonic() < deadline:
            info = r.info("persistence")
            done = int(info.get("rdb_saves", -1)) > before if before >= 0 else r.lastsave() != started
            if done and not int(info["rdb_bgsave_in_progress"]):
                assert info["rdb_last_bgsave_status"] == "ok", info
                return (Path(directory) / name).read_bytes()
            time.sleep(0.1)
        raise AssertionError("BGSAVE did not finish within 60 s")
    finally:
        r.config_set("rdbcompression", compression)
