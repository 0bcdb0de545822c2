"""``runjournal spend``: a run's spend (the journal's fold next to the ledger), a tenant's budgets, and an operator's
budget (``runjournal spend budget``). docs/guide/spend.md § See it; docs/design/decisions/0053-spend-ledger.md.

Units: tokens and model calls are integers; money is ``cost_micros``, an integer count of micro-units of
``Settings.spend_currency`` (1 USD = 1,000,000). ``--json`` keeps those integers; the tables for people show money
in currency units with the currency code (``0.003450 USD``).

* ``runjournal spend RUN_ID [--json]`` — the run's records in the projection (Redis, as ``runjournal inspect``
  reads them) folded by ``fold_spend`` next to the ledger's run scope; a dim where the two disagree is flagged
  (``match: false``): the projector is behind, a reserve's outcome is unknown, or the ledger was changed by hand.
* ``runjournal spend --tenant T [--user U] [--json]`` — the ledger's used / open / limit per dim of the tenant (and
  the user).
* ``runjournal spend budget --tenant T [--run R | --user U] --dim DIM (--limit N | --clear) [--by WHO]
  [--reason WHY] [--json]`` — set or remove an operator's limit (Redis only: the journal is not written). Logged
  as one JSON line (who, why, scope, dim, limit) on stderr.
"""

from __future__ import annotations

import json
import logging
from decimal import Decimal, InvalidOperation
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from typer.core import TyperGroup

from runjournal.cli._errors import cli_errors, fail, printable
from runjournal.cli._tables import folding_table

if TYPE_CHECKING:
    from runjournal.core.settings import Settings

__all__ = ["spend_app"]

console = Console(soft_wrap=True)
log = logging.getLogger("runjournal.cli.spend")

#: ``--dim`` names → the ledger's dims (``cost`` is given in currency units, the others are integers).
_DIM_NAMES = {"input_tokens": "input_tokens", "output_tokens": "output_tokens", "model_calls": "model_calls",
              "cost": "cost_micros", "cost_micros": "cost_micros"}
_VALUED = ("--tenant", "--user", "--run")


class _SpendGroup(TyperGroup):
    """``spend`` runs by itself (a run's or a tenant's spend) or as ``spend budget``: a first bare word that is not
    a subcommand is the run id (``spend RUN_ID`` is ``spend --run RUN_ID``)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:  # a click.Context (typer's own click)
        words = list(args)
        i = 0
        while i < len(words):
            word = words[i]
            if word == "--":
                break
            if word in _VALUED:
                i += 2
                continue
            if word.startswith("-"):
                i += 1
                continue
            if word not in self.commands:
                words[i:i + 1] = ["--run", word]
            break
        return super().parse_args(ctx, words)


spend_app = typer.Typer(cls=_SpendGroup, invoke_without_command=True, no_args_is_help=True,
                        help="Spend: a run's (journal and ledger), a tenant's budgets, an operator's budget.")


def money(micros: int, currency: str) -> str:
    """``cost_micros`` (micro-units) as currency units with the code: ``3450`` → ``0.003450 USD``."""
    return f"{Decimal(int(micros)).scaleb(-6):f} {currency}"


def _amount(dim: str, value: int | None, currency: str) -> str:
    if value is None:
        return "-"
    return money(value, currency) if dim == "cost_micros" else str(value)


def _ledger(settings: Settings) -> Any:
    from runjournal.core import redis_client
    from runjournal.producers.spend import SpendLedger

    return SpendLedger(redis_client.client(settings), settings.topic_prefix, settings.spend_policy())


@spend_app.callback()
def spend_command(
    ctx: typer.Context,
    run_id: Annotated[str | None, typer.Option("--run", metavar="RUN_ID",
                                               help="The run (same as the RUN_ID argument: `spend RUN_ID`; "
                                                    "spell a run named `budget` or starting with `-` so).")] = None,
    tenant: Annotated[str | None, typer.Option("--tenant", help="Show this tenant's budgets (ledger).")] = None,
    user: Annotated[str | None, typer.Option("--user", help="With --tenant: this user's budgets too.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (integer base units).")] = False,
) -> None:
    """A run's spend (`runjournal spend RUN_ID`: the journal's fold next to the ledger, a disagreement flagged) or a
    tenant's budgets (`runjournal spend --tenant T [--user U]`: used, open and limit per dim)."""
    if ctx.invoked_subcommand is not None:
        return
    if user is not None and tenant is None:
        raise fail("--user needs --tenant: runjournal spend --tenant T --user U (a user's budgets are the tenant's)",
                   as_json=as_json, code=2, kind="UsageError")
    if (run_id is None) == (tenant is None):
        raise fail("name a run (runjournal spend RUN_ID) or a tenant (runjournal spend --tenant T): one of the two",
                   as_json=as_json, code=2, kind="UsageError")
    if run_id is not None:
        _show_run(run_id, as_json)
    else:
        _show_tenant(str(tenant), user, as_json)


def _show_run(run_id: str, as_json: bool) -> None:
    from runjournal.consumers.ops.inspect import inspect_run
    from runjournal.consumers.runtime.topic_identity import preflight
    from runjournal.core.settings import Settings
    from runjournal.producers.spend import DIMS, fold_spend, reconciled_charge

    settings = Settings.load()
    with cli_errors(as_json):
        preflight(settings)
        report = inspect_run(settings, run_id, with_timeline=False)
        if report is None:
            raise fail(f"no state for run {run_id} in Redis (prefix {settings.topic_prefix}): is the projector "
                       "running (`runjournal projector`), and is RUNJOURNAL_TOPIC_PREFIX right?", as_json=as_json,
                       kind="RunNotFound")
        state = report["state"]
        tenant = state.get("tenant_id")
        summary = fold_spend((state.get("records") or {}).values())
        books = _ledger(settings) if tenant is not None else None
        ledger = books.scope(tenant, "run", run_id) if books is not None else None
        # steps whose outcome the journal does not record are answered by the ledger by key (as a resume would)
        charged = reconciled_charge(summary, books, tenant, run_id) if books is not None else summary.charged()
    journal = {**summary.as_dict(), "reconciled_charge": charged}
    mismatch: dict[str, dict[str, dict[str, int]]] = {}
    if ledger is not None:
        parts = [("used", charged)] + ([("open", summary.open)] if not summary.unknown_keys else [])
        for part, ours in parts:
            for d in DIMS:
                theirs = ledger[part].get(d, 0)
                if ours[d] != theirs:
                    mismatch.setdefault(part, {})[d] = {"journal": ours[d], "ledger": theirs}
    out = {"run_id": run_id, "tenant_id": tenant, "currency": settings.spend_currency, "journal": journal,
           "ledger": ledger, "match": not mismatch, "mismatch": mismatch}
    if as_json:
        print(json.dumps(out))
        return
    cur = settings.spend_currency
    console.print(printable(f"run {run_id}  tenant {tenant or '-'}  {summary.reservations} reservation(s), "
                            f"{summary.refused} refused, {summary.unknown_reserves} reserve(s) of unknown outcome"),
                  markup=False, highlight=False)
    table = folding_table("dim", "settled", "open (unknown spend)", "charged (journal)", "used (ledger)",
                          "open (ledger)", "limit (ledger)", title=f"spend of run {printable(run_id)}")
    for d in DIMS:
        table.add_row(d, _amount(d, summary.settled[d], cur), _amount(d, summary.open[d], cur),
                      _amount(d, summary.charged()[d], cur),
                      *(_amount(d, None if ledger is None else ledger[p].get(d, 0 if p != "limit" else None), cur)
                        for p in ("used", "open", "limit")))
    console.print(table)
    if summary.by_model:
        models = folding_table("model", *DIMS, title="settled by model")
        for model, per in sorted(summary.by_model.items()):
            models.add_row(model, *(_amount(d, per[d], cur) for d in DIMS))
        console.print(models)
    if ledger is None:
        console.print("the run has no tenant: no ledger scope to compare", markup=False, highlight=False)
    elif mismatch:
        for part, dims in mismatch.items():
            for d, pair in dims.items():
                console.print(f"MISMATCH {part} {d}: journal {_amount(d, pair['journal'], cur)}, ledger "
                              f"{_amount(d, pair['ledger'], cur)} (projector behind? `runjournal projector "
                              "--until-caught-up`; a reserve of unknown outcome is charged in the ledger only)",
                              markup=False, highlight=False)
    else:
        console.print("journal and ledger agree", markup=False, highlight=False)


def _show_tenant(tenant: str, user: str | None, as_json: bool) -> None:
    from runjournal.core import redis_client
    from runjournal.core.ids import TENANT_ID, USER_ID
    from runjournal.core.settings import Settings
    from runjournal.producers.spend import DIMS

    settings = Settings.load()
    with cli_errors(as_json):
        TENANT_ID.check_lookup(tenant)
        if user is not None:
            USER_ID.check_lookup(user)
        redis_client.probe(settings, timeout_s=3.0)
        ledger = _ledger(settings)
        scopes = [{"scope": f"tenant:{tenant}", **ledger.scope(tenant)}]
        if user is not None:
            scopes.append({"scope": f"user:{user}", **ledger.scope(tenant, "user", user)})
    if as_json:
        print(json.dumps({"tenant_id": tenant, "user_id": user, "currency": settings.spend_currency,
                          "scopes": scopes}))
        return
    cur = settings.spend_currency
    for scope in scopes:
        table = folding_table("dim", "used", "open (unknown spend)", "limit", "left", title=printable(scope["scope"]))
        for d in DIMS:
            used, limit = scope["used"].get(d, 0), scope["limit"].get(d)
            left = None if limit is None else max(0, limit - used)
            table.add_row(d, _amount(d, used, cur), _amount(d, scope["open"].get(d, 0), cur), _amount(d, limit, cur),
                          _amount(d, left, cur))
        console.print(table)


def parse_limit(dim: str, text: str) -> tuple[str, int]:
    """``--dim`` and ``--limit`` → (the ledger's dim, the limit in its base unit): ``cost`` is currency units
    (``2.5`` → ``2500000`` cost_micros), every other dim a whole number.

    Raises:
        SpendValueError: an unknown dim, or a negative, fractional (tokens, calls), non-finite or too large limit.
    """
    from runjournal.core.spend_policy import SpendValueError, Usage

    ledger_dim = _DIM_NAMES.get(dim)
    if ledger_dim is None:
        raise SpendValueError(f"--dim {dim!r}: one of {', '.join(_DIM_NAMES)} (cost in currency units)")
    try:
        value = Decimal(text.strip())
    except InvalidOperation:
        raise SpendValueError(f"--limit {text!r}: not a number") from None
    if not value.is_finite():
        raise SpendValueError(f"--limit {text!r}: must be finite")
    if value.copy_abs() > 2**53:  # before any arithmetic: 1e999999999 would overflow (or take minutes) below
        raise SpendValueError(f"--limit {text!r}: at most 2**53 - 1 (cost: 2**53 - 1 micro-units)")
    if dim == "cost":
        value = value * 1_000_000
        if value != value.to_integral_value():
            raise SpendValueError(f"--limit {text!r}: finer than a micro-unit of the currency")
    try:
        return ledger_dim, Usage(input_tokens=value).input_tokens
    except SpendValueError:
        what = "an amount >= 0 of currency units, at most 2**53 - 1 micro-units" if dim == "cost" else \
            f"a whole number of {ledger_dim} in 0 … 2**53 - 1"
        raise SpendValueError(f"--limit {text!r}: must be {what}") from None


@spend_app.command("budget")
def budget_command(
    tenant: Annotated[str, typer.Option("--tenant", help="The tenant whose ledger holds the budget.")],
    dim: Annotated[str, typer.Option("--dim", help="input_tokens, output_tokens, model_calls or cost (currency "
                                                   "units; cost_micros: micro-units).")],
    run_id: Annotated[str | None, typer.Option("--run", help="The budget of this run.")] = None,
    user: Annotated[str | None, typer.Option("--user", help="The budget of this user of the tenant.")] = None,
    limit: Annotated[str | None, typer.Option("--limit", help="The limit: a whole number, or currency units for "
                                                               "--dim cost.")] = None,
    clear: Annotated[bool, typer.Option("--clear", help="Remove the operator's limit (the settings' default "
                                                        "applies again).")] = False,
    by: Annotated[str | None, typer.Option("--by", help="Who sets it (default: user@host).")] = None,
    reason: Annotated[str, typer.Option("--reason", help="Why (logged, and in the JSON output).")] = "",
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object (integer base units).")] = False,
) -> None:
    """Set (--limit N) or remove (--clear) an operator's budget of a tenant, one of its runs (--run) or users
    (--user), in one dim. Writes the tenant's ledger in Redis, not the journal; the next reserve is checked
    against it. A bad dim or value is SpendValueError (exit 2)."""
    from runjournal.consumers.ops.control import default_operator
    from runjournal.core import redis_client
    from runjournal.core.ids import RUN_ID, TENANT_ID, USER_ID
    from runjournal.core.settings import Settings
    from runjournal.core.spend_policy import SpendValueError

    if (limit is None) == (not clear):
        raise fail("give --limit N or --clear", as_json=as_json, code=2, kind="UsageError")
    if run_id is not None and user is not None:
        raise fail("give --run or --user, not both", as_json=as_json, code=2, kind="UsageError")
    settings = Settings.load()
    try:
        ledger_dim, value = (_DIM_NAMES.get(dim, ""), None) if limit is None else parse_limit(dim, limit)
        if not ledger_dim:
            raise SpendValueError(f"--dim {dim!r}: one of {', '.join(_DIM_NAMES)} (cost in currency units)")
        if ledger_dim == "cost_micros" and value is not None and not settings.spend_policy().prices:
            raise SpendValueError("a cost budget needs prices (RUNJOURNAL_SPEND_PRICES): without them no cost is "
                                  "counted")
    except SpendValueError as exc:
        raise fail(exc, as_json=as_json, code=2) from exc
    kind, ident = ("run", run_id) if run_id is not None else ("user", user) if user is not None else ("tenant", tenant)
    who = by or default_operator()
    with cli_errors(as_json):
        TENANT_ID.check(tenant)  # a budget names a scope a run can have: the ids' own rules, not a lookup's
        (RUN_ID if kind == "run" else USER_ID if kind == "user" else TENANT_ID).check(str(ident))
        redis_client.probe(settings, timeout_s=3.0)
        ledger = _ledger(settings)
        ledger.set_limit(tenant, kind, ident, ledger_dim, value)
        now = ledger.scope(tenant, kind, ident)
    out = {"tenant_id": tenant, "scope": f"{kind}:{ident}", "dim": ledger_dim, "limit": value, "cleared": clear,
           "effective_limit": now["limit"].get(ledger_dim), "used": now["used"].get(ledger_dim, 0),
           "currency": settings.spend_currency, "by": who, "reason": reason}
    # WARNING: a command's default level (runjournal.core.logs) — a budget change is an audit fact, always shown
    log.warning("spend budget cleared" if clear else "spend budget set", extra={
        "tenant_id": tenant, "scope": out["scope"], "dim": ledger_dim, "limit": value, "by": who, "reason": reason})
    if as_json:
        print(json.dumps(out))
        return
    cur = settings.spend_currency
    what = "removed" if clear else f"set to {_amount(ledger_dim, value, cur)}"
    console.print(printable(f"budget {out['scope']} of tenant {tenant} {ledger_dim}: {what} by {who}"
                            f"{': ' + reason if reason else ''} (now: limit "
                            f"{_amount(ledger_dim, out['effective_limit'], cur)}, used "
                            f"{_amount(ledger_dim, out['used'], cur)})"), markup=False, highlight=False)
