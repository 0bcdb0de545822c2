"""Spend from the frameworks' own reports: what the LangGraph and Agents SDK adapters share (issue 32,
docs/guide/spend.md § Frameworks).

The adapters reserve before each model call the framework makes and settle after it with the usage the framework
reports (``RunHandle.reserve`` / ``AsyncRunHandle.reserve``: the ledger's own steps, nothing written twice).

**When.** Automatic when the journal's settings configure spend (``Settings.spend_prices`` or
``Settings.spend_budgets`` non-empty), off otherwise; an explicit ``spend=True`` / ``spend=False`` overrides. Why
automatic: a budget in the settings says this deployment's runs must stay within it, and a framework-driven agent
that silently skipped its reservations would make the budget a fiction. Why not always: with no prices and no
budgets a reservation enforces nothing and costs four events per model call. An operator's budget set only in
Redis (``runjournal spend budget``) is not visible in the settings: pass ``spend=True`` for it.

**The estimate** (a reservation needs one before the call): input tokens ``ceil(characters of the prompt / 4)``
(about four characters per token for English text: an estimate, replaced by the reported usage at the settle);
output tokens the request's own output limit (``max_tokens`` and its spellings) when the framework shows it, else
``output_tokens`` (default :data:`DEFAULT_OUTPUT_TOKENS`). With the output estimate at the request's limit a budget
is exact (decision 0053 § Overshoot bound).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

__all__ = ["DEFAULT_OUTPUT_TOKENS", "OUTPUT_LIMIT_KEYS", "estimate_input_tokens", "output_limit", "spend_enabled"]

DEFAULT_OUTPUT_TOKENS = 1024
"""Output tokens reserved for a model call whose request shows no output limit (tokens)."""

OUTPUT_LIMIT_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "max_new_tokens", "num_predict")
"""Where providers put a request's output limit (OpenAI, Anthropic, Google, Hugging Face, Ollama)."""


def spend_enabled(settings: Any, flag: bool | None) -> bool:
    """``flag`` when given, else whether ``settings`` configure spend (prices or budgets): the module's rule."""
    if flag is not None:
        return bool(flag)
    return bool(getattr(settings, "spend_prices", None) or getattr(settings, "spend_budgets", None))


def estimate_input_tokens(chars: int) -> int:
    """Input tokens estimated from the prompt's length in characters: ``ceil(chars / 4)``."""
    return math.ceil(max(0, chars) / 4)


def output_limit(params: Mapping[str, Any] | None, default: int) -> int:
    """The request's output limit from its parameters (:data:`OUTPUT_LIMIT_KEYS`, the first whole positive one),
    else ``default`` (tokens)."""
    for key in OUTPUT_LIMIT_KEYS:
        value = (params or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return default
