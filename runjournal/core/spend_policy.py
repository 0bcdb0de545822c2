"""Spend prices, budgets and amounts: the configuration half of the spend ledger (``Settings.spend_*``).

The ledger itself (reserve, settle, the Redis scripts) is ``runjournal.producers.spend``; the rules are in
docs/design/decisions/0053-spend-ledger.md. This module is pure: parsing and arithmetic, checked at the boundary
(settings load, ``RunHandle.reserve``) so a bad amount is a named error before anything is published.

**Units.** Tokens and calls are integers; money is an integer count of micro-units of ``Settings.spend_currency``
(``cost_micros``: 1 USD = 1,000,000). A price per million tokens in currency units is exactly the price per token
in micro-units.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal, InvalidOperation
from typing import Any

from runjournal.core.errors import RunjournalError

__all__ = ["DIMS", "SpendConfigError", "SpendPolicy", "SpendValueError", "UnknownCurrencyError",
           "UnknownModelError", "Usage", "check_currency"]

DIMS: tuple[str, ...] = ("input_tokens", "output_tokens", "cost_micros", "model_calls")
"""What a budget limits: input and output tokens, money (micro-units of the currency) and model calls."""
_BUDGET_DIMS = {"input_tokens": "input_tokens", "output_tokens": "output_tokens", "cost": "cost_micros",
                "model_calls": "model_calls"}
"""A budget's setting names → the ledger's dims (``cost`` is given in currency units)."""
_MAX = 2**53 - 1
"""Largest amount in any dim: exact in a Lua number (a double) and in JSON."""
_SCOPES = ("run", "tenant", "user")
_MAX_MONEY = Decimal(_MAX) / 1_000_000
"""Largest amount of money (currency units): its micro-units must stay below 2**53."""


class SpendValueError(RunjournalError, ValueError):
    """An amount is negative, not finite, not a whole number of tokens or above 2**53 - 1; nothing was published."""


class SpendConfigError(SpendValueError):
    """``RUNJOURNAL_SPEND_PRICES`` / ``RUNJOURNAL_SPEND_BUDGETS`` is malformed (the message names the entry)."""


class UnknownCurrencyError(SpendConfigError):
    """Not an ISO 4217 currency code (``Settings.spend_currency``, or a budget given in another currency)."""


class UnknownModelError(SpendValueError):
    """A reservation names a model with no price in ``RUNJOURNAL_SPEND_PRICES`` while prices are configured."""

    def __init__(self, model: str, known: Iterable[str]) -> None:
        names = sorted(known)
        super().__init__(f"no price for model {model!r} (RUNJOURNAL_SPEND_PRICES has {', '.join(names[:8])}"
                         f"{' …' if len(names) > 8 else ''}): add it, or a '*' entry for every other model")
        self.model = model


@dataclass(frozen=True, slots=True)
class Usage:
    """Tokens of one model call (whole, >= 0). ``Usage.of(mapping)`` accepts the common spellings
    (``input_tokens``/``prompt_tokens``, ``output_tokens``/``completion_tokens``).

    Raises:
        SpendValueError: a negative, non-integral, non-finite or too large count.
    """

    input_tokens: int = 0
    output_tokens: int = 0

    def __post_init__(self) -> None:
        for name in ("input_tokens", "output_tokens"):
            object.__setattr__(self, name, _count(getattr(self, name), name))

    @classmethod
    def of(cls, value: Usage | Mapping[str, Any] | Any) -> Usage:
        """A provider's usage report as :class:`Usage`: a mapping or an object (OpenAI's ``CompletionUsage``,
        Anthropic's ``Usage``, LangChain's ``usage_metadata``) with ``input_tokens`` or ``prompt_tokens`` and
        ``output_tokens`` or ``completion_tokens``.

        Raises:
            SpendValueError: no count of one side, or the two spellings of one side disagree.
        """
        if isinstance(value, Usage):
            return value
        if isinstance(value, Mapping):
            def get(name: str) -> Any:
                return value.get(name)
        else:
            def get(name: str) -> Any:
                return getattr(value, name, None)
        return cls(input_tokens=_side(get, "input_tokens", "prompt_tokens"),
                   output_tokens=_side(get, "output_tokens", "completion_tokens"))


def _side(get: Any, name: str, other: str) -> Any:
    """One side's count from a usage report: ``name`` or its other spelling ``other``; both given must agree."""
    ours, theirs = get(name), get(other)
    if ours is None and theirs is None:
        raise SpendValueError(f"the usage report has no {name} (or {other}): settle with the provider's counts, or "
                              "Usage(input_tokens=…, output_tokens=…)")
    if ours is not None and theirs is not None and ours != theirs:
        raise SpendValueError(f"the usage report says {name}={ours!r} and {other}={theirs!r}: which is it?")
    return ours if ours is not None else theirs


def _count(value: Any, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, (numbers.Integral, float, Decimal)):
        raise SpendValueError(f"{name} must be a whole number >= 0, not {value!r}")
    if isinstance(value, (float, Decimal)) and not (math.isfinite(value) if isinstance(value, float)
                                                    else value.is_finite()):
        raise SpendValueError(f"{name} must be finite, not {value!r}")
    if value < 0 or value > _MAX or value != int(value):  # the range first: int() of a huge Decimal takes forever
        raise SpendValueError(f"{name} must be a whole number in 0 … 2**53 - 1, not {value!r}")
    return int(value)


def _money(value: Any, what: str) -> Decimal:
    """A non-negative, finite amount of money (currency units) as a Decimal."""
    if isinstance(value, bool):
        raise SpendConfigError(f"{what}: not an amount: {value!r}")
    try:
        amount = Decimal(str(value))
    except InvalidOperation:
        raise SpendConfigError(f"{what}: not an amount: {value!r}") from None
    if not amount.is_finite() or amount < 0:
        raise SpendConfigError(f"{what}: must be finite and >= 0, not {value!r}")
    if amount > _MAX_MONEY:
        raise SpendConfigError(f"{what}: at most {_MAX_MONEY} currency units, not {value!r}")
    return amount


#: ISO 4217 currency codes (the 178 of the standard's list as pycountry 26.2 ships it): a 20 MiB package for one
#: membership test would take the core install past its size budget (tests/package/test_packaging.py).
ISO_4217 = frozenset("""
    AED AFN ALL AMD AOA ARS AUD AWG AZN BAM BBD BDT BHD BIF BMD BND BOB BOV BRL BSD BTN BWP BYN BZD CAD CDF CHE
    CHF CHW CLF CLP CNY COP COU CRC CUP CVE CZK DJF DKK DOP DZD EGP ERN ETB EUR FJD FKP GBP GEL GHS GIP GMD GNF
    GTQ GYD HKD HNL HTG HUF IDR ILS INR IQD IRR ISK JMD JOD JPY KES KGS KHR KMF KPW KRW KWD KYD KZT LAK LBP LKR
    LRD LSL LYD MAD MDL MGA MKD MMK MNT MOP MRU MUR MVR MWK MXN MXV MYR MZN NAD NGN NIO NOK NPR NZD OMR PAB PEN
    PGK PHP PKR PLN PYG QAR RON RSD RUB RWF SAR SBD SCR SDG SEK SGD SHP SLE SOS SRD SSP STN SVC SYP SZL THB TJS
    TMT TND TOP TRY TTD TWD TZS UAH UGX USD USN UYI UYU UYW UZS VED VES VND VUV WST XAD XAF XAG XAU XBA XBB XBC
    XBD XCD XCG XDR XOF XPD XPF XPT XSU XTS XUA XXX YER ZAR ZMW ZWG
""".split())


def check_currency(code: str) -> str:
    """``code`` (any case) if it is an ISO 4217 currency code (:data:`ISO_4217`); raises
    :class:`UnknownCurrencyError`."""
    if not isinstance(code, str) or code.upper() not in ISO_4217:
        raise UnknownCurrencyError(f"{code!r} is not an ISO 4217 currency code (USD, EUR, GBP, JPY …)")
    return code.upper()


@dataclass(frozen=True)
class SpendPolicy:
    """Prices and default budgets, parsed from settings (``Settings.spend_*``; docs/reference/settings.md).

    Attributes:
        currency: ISO 4217 code money is counted in.
        prices: model → (price per million input tokens, per million output tokens), currency units — equal to
            micro-units per token. ``"*"`` prices every other model. Empty: money is not counted (cost 0), and a
            money budget is refused as a configuration error.
        budgets: scope → dim → limit (ledger units). Scopes: ``run`` / ``tenant`` / ``user`` (the default of each
            kind), ``tenant:<id>`` / ``user:<id>`` (one).
    """

    currency: str = "USD"
    prices: Mapping[str, tuple[Decimal, Decimal]] = field(default_factory=dict)
    budgets: Mapping[str, Mapping[str, int]] = field(default_factory=dict)

    @classmethod
    def parse(cls, currency: str, prices: Mapping[str, Any], budgets: Mapping[str, Any]) -> SpendPolicy:
        """Validate the raw settings. Raises :class:`SpendConfigError` / :class:`UnknownCurrencyError`."""
        code = check_currency(currency)
        parsed: dict[str, tuple[Decimal, Decimal]] = {}
        for model, price in prices.items():
            if not isinstance(price, Mapping) or set(price) - {"input_per_mtok", "output_per_mtok"}:
                raise SpendConfigError(f"RUNJOURNAL_SPEND_PRICES[{model!r}]: give input_per_mtok and output_per_mtok")
            parsed[model] = (_money(price.get("input_per_mtok", 0), f"price of {model} input"),
                             _money(price.get("output_per_mtok", 0), f"price of {model} output"))
        limits: dict[str, dict[str, int]] = {}
        for scope, dims in budgets.items():
            kind, _, ident = scope.partition(":")
            if kind not in _SCOPES or (kind == "run" and ident) or not isinstance(dims, Mapping):
                raise SpendConfigError(f"RUNJOURNAL_SPEND_BUDGETS: scope {scope!r} is not run, tenant[:ID] or "
                                       "user[:ID] with a {dim: limit} object")
            limits[scope] = {}
            for name, value in dims.items():
                if name not in _BUDGET_DIMS:
                    raise SpendConfigError(f"RUNJOURNAL_SPEND_BUDGETS[{scope!r}]: unknown dim {name!r} "
                                           f"(one of {', '.join(_BUDGET_DIMS)})")
                if name == "cost":
                    if not parsed:
                        raise SpendConfigError(f"RUNJOURNAL_SPEND_BUDGETS[{scope!r}]: a cost budget needs prices "
                                               "(RUNJOURNAL_SPEND_PRICES)")
                    limits[scope]["cost_micros"] = _count(_money(value, f"{scope} cost") * 1_000_000, "cost")
                else:
                    limits[scope][_BUDGET_DIMS[name]] = _count(value, f"{scope} {name}")
        return cls(currency=code, prices=parsed, budgets=limits)

    def cost_micros(self, model: str, usage: Usage) -> int:
        """The cost of ``usage`` on ``model``, micro-units of the currency, rounded up; 0 without prices.

        Raises:
            UnknownModelError: prices are configured and neither ``model`` nor ``"*"`` has one.
        """
        if not self.prices:
            return 0
        price = self.prices.get(model) or self.prices.get("*")
        if price is None:
            raise UnknownModelError(model, self.prices)
        return _count(math.ceil(price[0] * usage.input_tokens + price[1] * usage.output_tokens), "cost_micros")

    def amounts(self, model: str, usage: Usage, calls: int = 1) -> dict[str, int]:
        """The ledger amounts of one call: ``{dim: amount}`` over :data:`DIMS`."""
        return {"input_tokens": usage.input_tokens, "output_tokens": usage.output_tokens,
                "cost_micros": self.cost_micros(model, usage), "model_calls": calls}

    def defaults(self, kind: str, ident: str | None) -> dict[str, int]:
        """The budget of scope ``kind`` (``run``/``tenant``/``user``) ``ident`` from settings (the entry for the id
        over the kind's default); an operator's budget in the ledger overrides it."""
        own = self.budgets.get(f"{kind}:{ident}") if ident is not None and kind != "run" else None
        return dict(own if own is not None else self.budgets.get(kind, {}))
