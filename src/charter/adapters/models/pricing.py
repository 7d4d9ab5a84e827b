"""What the model adapters share: units, usage, prices, the input bound.

Prices come from ``genai-prices``' bundled snapshot, never fetched at run
time, so an estimate and its settlement are reproducible; the package's
version and the model priced are the price source (L8). Money is rounded up to
the unit's smallest step: a bound that rounds down is no bound.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from decimal import Decimal
from typing import Any

from charter.adapters import Estimate, Evidence, Outcome, RecordedAttempt
from charter.errors import AdmissionRefused, ConfigError, MissingExtra

#: Content parts whose tokens the request's size does not bound (an image URL
#: of a hundred bytes may cost a thousand tokens): they need ``input_bound``.
_UNBOUNDED_PARTS = frozenset(
    {"image", "image_url", "input_image", "document", "file", "input_file", "input_audio"}
)
#: Tokens a request may cost beyond its JSON's bytes (message framing).
_FRAMING_TOKENS = 64


@dataclass(frozen=True)
class ModelUnits:
    """The allowance units a model call is counted in.

    ``money`` in steps of ``10**-scale`` dollars (the contract's unit must
    have that scale), and the input and output tokens, each ``None`` to leave
    it out of the estimate and the cost.
    """

    money: str | None = "usd"
    scale: int = 6
    input_tokens: str | None = "input_tokens"
    output_tokens: str | None = "output_tokens"

    def __post_init__(self) -> None:
        if not 0 <= self.scale <= 12:
            raise ConfigError(f"the money unit's scale must be in [0, 12], got {self.scale}")


@dataclass(frozen=True)
class Usage:
    """Tokens one call used, as the provider reported them.

    ``input_tokens`` counts every input token, cached or not; ``cache_read``
    and ``cache_write`` say how many of them were read from or written to a
    prompt cache.
    """

    model: str
    input_tokens: int = 0
    output_tokens: int = 0
    cache_read: int = 0
    cache_write: int = 0

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


#: Looks up what the provider billed for a request, by the idempotency key
#: Charter sent; ``None`` when it knows of none. Neither API offers this per
#: request, so it is a hook for a gateway or a provider that does.
UsageLookup = Callable[[str], Usage | None]


def genai_prices() -> Any:
    try:
        import genai_prices  # noqa: PLC0415 - an optional extra, loaded when an adapter is built
    except ImportError:
        raise MissingExtra(
            "the model adapters price calls with genai-prices: "
            "pip install 'charter[openai]' or 'charter[anthropic]'",
            extra="openai",
        ) from None
    return genai_prices


class Pricing:
    """A provider's prices, from genai-prices, in a mission's units."""

    def __init__(self, provider: str, units: ModelUnits) -> None:
        self.provider = provider
        self.units = units
        self._prices = genai_prices()

    def source(self, model: str) -> str:
        """Where a price came from (L8): the package, its version, the model."""
        return f"genai-prices {self._prices.__version__}: {self.provider}/{model}"

    def amounts(self, usage: Usage) -> dict[str, int]:
        """What ``usage`` costs in each unit (money rounded up to its step)."""
        units = self.units
        out: dict[str, int] = {}
        if units.money is not None:
            price = self._price(usage)
            out[units.money] = math.ceil(price * (Decimal(10) ** units.scale))
        if units.input_tokens is not None:
            out[units.input_tokens] = usage.input_tokens
        if units.output_tokens is not None:
            out[units.output_tokens] = usage.output_tokens
        return out

    def _price(self, usage: Usage) -> Decimal:
        counted = self._prices.Usage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            cache_read_tokens=usage.cache_read or None,
            cache_write_tokens=usage.cache_write or None,
        )
        try:
            found = self._prices.calc_price(counted, usage.model, provider_id=self.provider)
        except LookupError as exc:
            raise AdmissionRefused(
                f"genai-prices {self._prices.__version__} has no price for {self.provider} "
                f"model {usage.model!r} ({exc}); use a priced model, or count it in tokens "
                "only (ModelUnits(money=None))",
                model=usage.model,
            ) from None
        return Decimal(found.total_price)

    def estimate(
        self, request: Mapping[str, Any], max_tokens: int, bound: Callable[[Any], int] | None
    ) -> Estimate:
        """The upper bound: every input token the request can hold, and every
        output token it allows, at the output price (L3)."""
        model = str(request.get("model", ""))
        tokens = input_bound(request) if bound is None else bound(request)
        usage = Usage(model, tokens, max_tokens)
        return Estimate(self.amounts(usage), self.source(model))

    def outcome(self, result: Any, usage: Usage, receipt: Mapping[str, Any]) -> Outcome:
        return Outcome.succeeded(
            result,
            cost=self.amounts(usage),
            receipt={**receipt, "usage": usage.as_json()},
            price_source=self.source(usage.model),
        )

    def reconcile(self, attempt: RecordedAttempt, lookup: UsageLookup | None) -> Evidence:
        """A lost model call: what the provider billed for its key, if it can say."""
        if lookup is None:
            return Evidence.indeterminate(
                {"lookup": "the provider offers no usage lookup by key; a person decides"}
            )
        billed = lookup(attempt.idempotency_key)
        if billed is None:  # usage is reported late: an empty lookup proves nothing
            return Evidence.indeterminate({"lookup": "no usage recorded for this key yet"})
        return Evidence.applied(
            self.outcome(None, billed, {"lookup": attempt.idempotency_key}),
            detail={"source": "usage lookup"},
        )


def input_bound(request: Mapping[str, Any]) -> int:
    """An upper bound on a text request's input tokens: its JSON's UTF-8 bytes
    (a byte-level tokenizer's token covers at least one byte) plus framing.
    Images, files and audio are not bounded by their bytes: refused."""
    unbounded = _kinds(request) & _UNBOUNDED_PARTS
    if unbounded:
        raise AdmissionRefused(
            f"the request holds {sorted(unbounded)} content, whose tokens its size does not "
            "bound; give the adapter an input_bound function for such requests"
        )
    text = json.dumps(request, ensure_ascii=False, separators=(",", ":"), default=str)
    return len(text.encode()) + _FRAMING_TOKENS


def _kinds(value: Any) -> set[str]:
    if isinstance(value, Mapping):
        found = {str(value["type"])} if isinstance(value.get("type"), str) else set()
        for v in value.values():
            found |= _kinds(v)
        return found
    if isinstance(value, list | tuple):
        return set().union(*(_kinds(v) for v in value)) if value else set()
    return set()


def max_tokens(request: Mapping[str, Any], names: tuple[str, ...], scope: str) -> int:
    """The request's output limit, which the estimate needs (refused without one)."""
    for name in names:
        value = request.get(name)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    raise AdmissionRefused(
        f"a {scope} request must set {' or '.join(names)} (a positive integer): the "
        "estimate is an upper bound, and the output has none without it"
    )
