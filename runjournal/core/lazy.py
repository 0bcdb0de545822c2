"""Lazy package exports (PEP 562): a package names what it exports and where each lives, and pays for the import
of a module only when one of its names is first used (``runjournal --help`` must not import qdrant-client, numpy
or the framework adapters)."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, homes: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """``__getattr__`` and ``__dir__`` for ``package`` whose names live in the modules ``homes`` maps them to.

    Args:
        package: the package's ``__name__`` (named in the AttributeError).
        homes: exported name → dotted module that defines it.

    Returns:
        ``(__getattr__, __dir__)``: assign both at the package's top level. A resolved name is cached in the
        package's namespace, so the lookup happens once.

    Raises (from the returned ``__getattr__``):
        AttributeError: the name is not exported.
    """
    namespace = importlib.import_module(package).__dict__

    def __getattr__(name: str) -> Any:
        module = homes.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(module), name)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted(set(namespace.get("__all__", ())) | set(homes))

    return __getattr__, __dir__
