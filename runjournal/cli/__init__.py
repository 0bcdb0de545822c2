"""The ``runjournal`` command line (typer): the top floor. One module per command group.

Needs the ``[cli]`` extra (typer, rich, prometheus-client, tenacity); :func:`main` names it when missing.
"""

from __future__ import annotations

import sys
from typing import Any

__all__ = ["app", "main"]

#: Modules of the ``[cli]`` extra; a core-only install lacks them.
CLI_EXTRA_MODULES = frozenset({"typer", "rich", "click", "prometheus_client", "tenacity"})


def main() -> None:
    """Console-script entry point (``runjournal``): the typer app; a ConfigError exits 2 with its message.

    Without the ``[cli]`` extra it prints the ``pip install`` that fixes it and exits 2.
    """
    try:
        from runjournal.cli._app import run
    except ModuleNotFoundError as exc:
        if exc.name not in CLI_EXTRA_MODULES:
            raise
        print(f"error: the runjournal command line needs the [cli] extra ({exc.name} is not installed): "
              "pip install 'runjournal[cli]'", file=sys.stderr)
        raise SystemExit(2) from exc
    run()


def __getattr__(name: str) -> Any:
    if name == "app":
        from runjournal.cli._app import app

        return app
    raise AttributeError(f"module 'runjournal.cli' has no attribute {name!r}")
