"""The published-schema ledger ``schemas/published.sha256``.

Every published ``.avsc`` is kept forever and never edited.

Format: one line per file, ``sha256sum`` style: ``<64 hex>  <path relative to schemas/>``.
Lines are only ever appended (``python -m runjournal.schemas.tools.publish``); a published file that
changes or disappears is a problem for :func:`verify_published` and fails CI.
"""

from __future__ import annotations

import hashlib
from pathlib import Path

from runjournal.schemas.errors import SchemaError

__all__ = ["LEDGER", "SCHEMAS_DIR", "publish", "read_ledger", "sha256_of", "verify_published"]

SCHEMAS_DIR = Path(__file__).resolve().parent
#: The ledger file.
LEDGER = SCHEMAS_DIR / "published.sha256"


def sha256_of(path: Path) -> str:
    """Hex sha256 of a file's bytes (exact bytes: whitespace counts)."""
    return hashlib.sha256(path.read_bytes()).hexdigest()


def read_ledger(ledger: Path = LEDGER) -> dict[str, str]:
    """``relative path → sha256 hex`` from the ledger (empty when the file does not exist).

    Raises:
        SchemaError: a malformed line or a path listed twice.
    """
    if not ledger.exists():
        return {}
    entries: dict[str, str] = {}
    for number, line in enumerate(ledger.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip() or line.startswith("#"):
            continue
        digest, sep, rel = line.partition("  ")
        if not sep or len(digest) != 64 or not rel:
            raise SchemaError(f"{ledger}:{number}: expected '<sha256>  <path>', got {line!r}")
        if rel in entries:
            raise SchemaError(f"{ledger}:{number}: {rel} is listed twice")
        entries[rel] = digest
    return entries


def _avsc_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in (root / "avro").rglob("*.avsc"))


def verify_published(root: Path = SCHEMAS_DIR, ledger: Path | None = None) -> list[str]:
    """Problems with the published schemas, as messages (empty list: all good).

    Reported: a published file that is missing or whose bytes changed, and a ``.avsc`` under
    ``avro/`` that is not published yet (the codec would load it, so it must be frozen first).
    """
    entries = read_ledger(ledger or root / "published.sha256")
    problems = []
    for rel, digest in entries.items():
        path = root / rel
        if not path.exists():
            problems.append(f"published schema {rel} is missing: published versions are kept forever")
        elif sha256_of(path) != digest:
            problems.append(f"published schema {rel} was edited: add a new version instead")
    for rel in _avsc_files(root):
        if rel not in entries:
            problems.append(f"schema {rel} is not published: run `python -m runjournal.schemas.tools.publish`")
    return problems


def publish(root: Path = SCHEMAS_DIR, ledger: Path | None = None) -> list[str]:
    """Append every unpublished ``.avsc`` under ``avro/`` to the ledger.

    Returns:
        The relative paths newly published (empty when nothing was new).

    Raises:
        SchemaError: a published file changed or disappeared (nothing is written then).
    """
    ledger = ledger or root / "published.sha256"
    entries = read_ledger(ledger)
    broken = [p for p in verify_published(root, ledger) if "is not published" not in p]
    if broken:
        raise SchemaError("; ".join(broken))
    new = [rel for rel in _avsc_files(root) if rel not in entries]
    if new:
        with ledger.open("a", encoding="utf-8") as out:
            for rel in new:
                out.write(f"{sha256_of(root / rel)}  {rel}\n")
    return new
