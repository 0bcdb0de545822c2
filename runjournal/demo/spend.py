"""The demo's model spend: every model turn of a script (an assistant message, a tool call the model asked for) is
reserved before and settled after, with budgets on (docs/guide/spend.md; docs/design/decisions/0053-spend-ledger.md).

The trajectories carry no token counts, so the amounts are a stated estimate: a turn's **input** is the transcript
before it (the run's instruction and every earlier step's text, tool results included) at 4 characters per token;
its **output** is its own text (the message, or the tool's name and arguments) at 4 characters per token; the
reservation asks for the input and :data:`MAX_OUTPUT_TOKENS` of output (the request's ``max_tokens``), and the
settle reports the turn's actual output. Every agent (plain, graph, asyncio) reserves under the same step names
(``step<i>/model``), so a run started by one and resumed by another meets its recorded spend, never charged twice.
"""

from __future__ import annotations

import json
import math
from typing import Any

from runjournal.demo.workload import RunScript, Step

__all__ = ["BUDGET_USD", "MAX_OUTPUT_TOKENS", "MODEL", "PRICES", "acharge_turn", "charge_turn", "model_turns",
           "spend_step", "with_spend_defaults"]

MODEL = "gpt-4o"
PRICES = {MODEL: {"input_per_mtok": "2.50", "output_per_mtok": "10.00"}}
"""gpt-4o's list price per million tokens, USD (the trajectories' model)."""
MAX_OUTPUT_TOKENS = 1024
"""The output a turn reserves (its request's ``max_tokens``)."""
BUDGET_USD = "50"
"""The demo tenant's default money budget (USD): above what its 200 runs spend (about 15 USD), so no run is
refused; ``RUNJOURNAL_SPEND_BUDGETS`` overrides it."""


def _tokens(text: str) -> int:
    return math.ceil(len(text) / 4)


def _text(step: Step) -> str:
    if step.kind == "message":
        return step.content
    return step.tool + json.dumps(step.args, sort_keys=True) + step.result


def model_turns(script: RunScript) -> dict[int, tuple[int, int]]:
    """Step index → (input tokens, output tokens) for every model turn of ``script`` (assistant messages and tool
    steps), by the module's stated estimate."""
    out: dict[int, tuple[int, int]] = {}
    seen = _tokens(script.instruction)
    for i, step in enumerate(script.steps):
        if step.kind == "tool":
            out[i] = (seen, _tokens(step.tool + json.dumps(step.args, sort_keys=True)))
        elif step.role == "assistant":
            out[i] = (seen, _tokens(step.content))
        seen += _tokens(_text(step))
    return out


def spend_step(i: int) -> str:
    """The stable step name of step ``i``'s model turn (the same in every agent)."""
    return f"step{i}/model"


def charge_turn(handle: Any, script: RunScript, i: int, turns: dict[int, tuple[int, int]] | None = None) -> None:
    """Reserve step ``i``'s model turn (its input, :data:`MAX_OUTPUT_TOKENS`) and settle its actual output; nothing
    for a step that is not a model turn. Raises as ``RunHandle.reserve`` (``BudgetExceededError`` …)."""
    amounts = (turns if turns is not None else model_turns(script)).get(i)
    if amounts is None:
        return
    with handle.reserve(MODEL, input_tokens=amounts[0], output_tokens=MAX_OUTPUT_TOKENS, user_id=script.user_id,
                        step=spend_step(i)) as r:
        r.settle(input_tokens=amounts[0], output_tokens=amounts[1])


async def acharge_turn(handle: Any, script: RunScript, i: int,
                       turns: dict[int, tuple[int, int]] | None = None) -> None:
    """:func:`charge_turn` from asyncio (``AsyncRunHandle.reserve``): the same steps, under the same names."""
    amounts = (turns if turns is not None else model_turns(script)).get(i)
    if amounts is None:
        return
    async with await handle.reserve(MODEL, input_tokens=amounts[0], output_tokens=MAX_OUTPUT_TOKENS,
                                    user_id=script.user_id, step=spend_step(i)) as r:
        await r.settle(input_tokens=amounts[0], output_tokens=amounts[1])


def with_spend_defaults(settings: Any) -> Any:
    """``settings`` with the demo's prices and tenant budget where none are set (the user's own win)."""
    update: dict[str, Any] = {}
    if not settings.spend_prices:
        update["spend_prices"] = PRICES
    if not settings.spend_budgets:
        update["spend_budgets"] = {"tenant": {"cost": BUDGET_USD}}
    return settings.model_copy(update=update) if update else settings
