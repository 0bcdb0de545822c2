"""Framework adapters: journaled tools, LangGraph and the OpenAI Agents SDK on the journal.

* :class:`JournaledTool` / :func:`journaled` — a plain function, a LangChain tool or an Agents SDK function tool
  under the side-effect protocol (core install; no framework needed); :func:`current_idempotency_key`.
* :class:`JournalCheckpointSaver`, :class:`JournalRuns`, :func:`journaled_tool_node`, :class:`GraphNodeJournal`,
  :class:`GraphSpendJournal` — LangGraph (``pip install 'runjournal[langgraph]'``).
* :class:`JournalSession`, :class:`JournalRunHooks`, :func:`journal_function_tool`, :func:`run_agent`,
  :func:`resume_agent` — the OpenAI Agents SDK (``pip install 'runjournal[openai-agents]'``).
* :class:`FrameworkRecordStore` — where both keep framework state: records in the journal's transaction,
  projected into Redis.

The framework modules import their framework at import time; names here resolve lazily (PEP 562), so
``import runjournal.adapters`` needs no framework.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from runjournal.adapters.tools import JournaledTool, current_idempotency_key, journaled

_LAZY: dict[str, str] = {
    "FrameworkRecordStore": "runjournal.adapters._checkpoints",
    **dict.fromkeys(["GraphNodeJournal", "GraphSpendJournal", "JournalCheckpointSaver", "JournalRuns",
                     "ThreadNotOwnedError", "journaled_tool_node"], "runjournal.adapters.langgraph"),
    **dict.fromkeys(["JournalRunHooks", "JournalSession", "journal_function_tool", "resume_agent", "run_agent"],
                    "runjournal.adapters.openai_agents"),
}

if TYPE_CHECKING:  # pragma: no cover
    from runjournal.adapters._checkpoints import FrameworkRecordStore
    from runjournal.adapters.langgraph import (
        GraphNodeJournal,
        GraphSpendJournal,
        JournalCheckpointSaver,
        JournalRuns,
        ThreadNotOwnedError,
        journaled_tool_node,
    )
    from runjournal.adapters.openai_agents import (
        JournalRunHooks,
        JournalSession,
        journal_function_tool,
        resume_agent,
        run_agent,
    )

__all__ = [
    "FrameworkRecordStore",
    "GraphNodeJournal",
    "GraphSpendJournal",
    "JournalCheckpointSaver",
    "JournalRunHooks",
    "JournalRuns",
    "JournalSession",
    "JournaledTool",
    "ThreadNotOwnedError",
    "current_idempotency_key",
    "journal_function_tool",
    "journaled",
    "journaled_tool_node",
    "resume_agent",
    "run_agent",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'runjournal.adapters' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return __all__
