"""Framework adapters: journaled tools, LangGraph and the OpenAI Agents SDK on the journal.

* :mod:`runjournal.adapters.tools` — :class:`JournaledTool`: a plain function, a LangChain tool or an Agents
  SDK function tool under the side-effect protocol (core install; no framework needed).
* :mod:`runjournal.adapters.langgraph` — ``JournalCheckpointSaver`` and ``journaled_tool_node``
  (``pip install 'runjournal[langgraph]'``).
* :mod:`runjournal.adapters.openai_agents` — ``JournalSession``, ``JournalRunHooks``, durable tool approvals
  (``pip install 'runjournal[openai-agents]'``).

The framework modules import their framework at import time; nothing here imports them eagerly.
"""

from runjournal.adapters.tools import JournaledTool, current_idempotency_key, journaled

__all__ = ["JournaledTool", "current_idempotency_key", "journaled"]
