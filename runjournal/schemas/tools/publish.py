"""Publish new schema versions: ``python -m runjournal.schemas.tools.publish [--registry URL --subject S]``.

1. Appends the sha256 of every not-yet-published ``schemas/avro/**/*.avsc`` to
   ``schemas/published.sha256``. Refuses (exit 1, nothing written) when a published file was
   edited or removed. Run it once, after ``schemas check`` passes, and commit both files.
2. With ``--registry`` (default ``RUNJOURNAL_SCHEMA_REGISTRY_URL``): registers every published
   version from v2 under ``--subject`` (default ``{RUNJOURNAL_TOPIC_PREFIX}.events-value``) and sets
   the subject to the policy's level, FULL_TRANSITIVE (:mod:`runjournal.schemas.registration`).
   Exit 1 when the registry refuses a version. Producers never register: this is the only writer.

``runjournal schemas publish`` is the same with the CLI's output options.
"""

from __future__ import annotations

import argparse
import os
import sys

from runjournal.schemas.errors import SchemaError
from runjournal.schemas.published import LEDGER, publish


def main(argv: list[str] | None = None) -> int:
    """Publish (and register); returns the process exit code (0 ok, 1 refused or failed)."""
    parser = argparse.ArgumentParser(prog="python -m runjournal.schemas.tools.publish", description=__doc__)
    parser.add_argument("--registry", default=os.environ.get("RUNJOURNAL_SCHEMA_REGISTRY_URL"),
                        help="schema registry base URL (default RUNJOURNAL_SCHEMA_REGISTRY_URL; unset: ledger only)")
    prefix = os.environ.get("RUNJOURNAL_TOPIC_PREFIX", "runjournal")
    parser.add_argument("--subject", default=f"{prefix}.events-value", help="registry subject")
    args = parser.parse_args(argv)
    try:
        new = publish()
    except SchemaError as exc:
        print(f"refused: {exc}", file=sys.stderr)
        return 1
    for rel in new:
        print(f"published {rel}")
    if not new:
        print(f"nothing new; {LEDGER.name} is up to date")
    if not args.registry:
        return 0
    from runjournal.schemas.registration import register_versions  # needs the [registry] extra

    try:
        rows = register_versions(args.registry, args.subject)
    except SchemaError as exc:
        print(f"registry: {exc}", file=sys.stderr)
        return 1
    for row in rows:
        print(f"{args.subject}: {row.version} {row.action} (id {row.schema_id}) {row.detail}".rstrip())
    return 1 if any(r.action == "refused" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
