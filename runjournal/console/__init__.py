"""``runjournal console``: a web console over the projection, the topic and memory (the ``[console]`` extra).

Server-rendered pages (Starlette + Jinja2, no JavaScript, no build step, no CDN — it works offline): the runs
list, a run's page (timeline with seq/epoch/offset, ownership epochs, execution records by class, approvals,
memory with provenance), projector and recovery lag from the services' ``/metrics``, and approve / deny for an
operator holding the token the console was started with. An apps-layer package beside ``runjournal.demo``.
"""

from runjournal.console.app import ConsoleConfig, build_app
from runjournal.console.queries import ConsoleData

__all__ = ["ConsoleConfig", "ConsoleData", "build_app"]
