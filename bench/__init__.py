"""``python -m bench``: each figure of runjournal next to an anchor measured in the same run (bench/README.md).

One module per pair — :mod:`bench.publish`, :mod:`bench.boundary`, :mod:`bench.projection`,
:mod:`bench.recovery`, :mod:`bench.memory`, :mod:`bench.footprint` — run by :func:`bench.runner.run_bench`
and printed by :mod:`bench.report`.
"""

__all__: list[str] = []
