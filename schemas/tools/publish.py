"""Publish new schema versions: ``python -m runjournal.schemas.tools.publish``.

Appends the sha256 of every not-yet-published ``schemas/avro/**/*.avsc`` to
``schemas/published.sha256``. Refuses (exit 1, nothing written) when a published file was
edited or removed. Run it once, after ``schemas check`` passes, and commit both files.
"""

from __future__ import annotations

import sys

from runjournal.schemas.errors import SchemaError
from runjournal.schemas.published import LEDGER, publish


def main() -> int:
    """Publish; returns the process exit code (0 ok, 1 refused)."""
    try:
        new = publish()
    except SchemaError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    for rel in new:
        print(f"published {rel}")
    if not new:
        print(f"nothing new; {LEDGER.name} is up to date")
    return 0


if __name__ == "__main__":
    sys.exit(main())
