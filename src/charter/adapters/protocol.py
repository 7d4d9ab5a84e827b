"""The adapter protocol: the only way an effect reaches the outside world.

An adapter estimates an operation's cost (an upper bound, in integer smallest
steps), dispatches one attempt, and reconciles an uncertain one. It must:

- send the attempt's own ``idempotency_key`` and, where the target supports it,
  the ``fencing_token`` (the run's id and epoch) so stale sends are rejected (A5, F3);
- refuse to send after ``send_deadline_us`` by raising
  :class:`~charter.errors.NotApplied` (F3): call :meth:`Dispatch.check_deadline`
  immediately before the send;
- turn off its SDK's own retries, so every send is an attempt Charter knows;
- raise :class:`~charter.errors.NotApplied` only when non-application is
  proven; any other exception makes the attempt UNKNOWN (A3).

``dispatch`` and ``reconcile`` may be ``async def``: agent frameworks are
async, and an async adapter's send is awaited on the caller's event loop
(``await ctx.aattempt(...)``); a synchronous caller gets a private loop
(:func:`blocking`). ``estimate`` is always synchronous: it runs before admission.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Coroutine, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from charter.amounts import is_amount
from charter.clock import Clock
from charter.errors import AdapterError, NotApplied


class EffectClass(StrEnum):
    """What an uncertain send may have done (A7)."""

    READ_ONLY = "read_only"  # no outside effect: a model call, a search
    IDEMPOTENT_KEYED = "idempotent_keyed"  # target dedupes by our key inside a window
    UNSAFE = "unsafe"  # everything else


@dataclass(frozen=True)
class Operation:
    """An adapter operation's declared effect class (and dedupe window if keyed).

    ``retries`` is the operation's retry policy: how many new attempts the
    engine makes by itself for one effect after an attempt that was settled
    as not applied while nobody was waiting for it (a node resumed after a
    person or evidence settled it FAILED, A4), or a ``read_only`` UNKNOWN
    written off under the contract's opt-in (A7). A node sees the failure
    once they are spent.
    """

    effect: EffectClass
    dedupe_window_seconds: int | None = None
    retries: int = 2

    def __post_init__(self) -> None:
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise AdapterError(f"retries must be a non-negative integer, got {self.retries!r}")
        if self.effect is EffectClass.IDEMPOTENT_KEYED and not self.dedupe_window_seconds:
            raise AdapterError(
                "an idempotent_keyed operation must declare the target's dedupe window "
                "(dedupe_window_seconds)"
            )


@dataclass(frozen=True)
class Estimate:
    """An upper bound on an operation's cost per unit, and where the price came from (L8)."""

    amounts: Mapping[str, int]
    price_source: str

    def __post_init__(self) -> None:
        _check_amounts(self.amounts, "estimate")


@dataclass(frozen=True)
class Outcome:
    """What the target did: applied as success, or applied/refused as a failure.

    ``cost`` is the actual cost as reported, never clamped (L2, L5); ``receipt``
    is the target's raw receipt, kept verbatim.
    """

    status: Literal["succeeded", "failed"]
    result: Any = None
    cost: Mapping[str, int] = field(default_factory=dict)
    receipt: Any = None
    price_source: str | None = None

    def __post_init__(self) -> None:
        if self.status not in ("succeeded", "failed"):
            raise AdapterError(f"outcome status must be 'succeeded' or 'failed', not {self.status}")
        _check_amounts(self.cost, "outcome cost")

    @classmethod
    def succeeded(
        cls,
        result: Any = None,
        *,
        cost: Mapping[str, int] | None = None,
        receipt: Any = None,
        price_source: str | None = None,
    ) -> Outcome:
        return cls("succeeded", result, dict(cost or {}), receipt, price_source)

    @classmethod
    def failed(
        cls,
        result: Any = None,
        *,
        cost: Mapping[str, int] | None = None,
        receipt: Any = None,
        price_source: str | None = None,
    ) -> Outcome:
        return cls("failed", result, dict(cost or {}), receipt, price_source)


@dataclass(frozen=True)
class Evidence:
    """What reconciliation found about an attempt (R7). Stored, never edited."""

    verdict: Literal["applied", "not_applied", "indeterminate"]
    outcome: Outcome | None = None
    detail: Any = None
    source: str = "adapter"

    def __post_init__(self) -> None:
        if self.verdict not in ("applied", "not_applied", "indeterminate"):
            raise AdapterError(f"unknown evidence verdict {self.verdict!r}")
        if self.verdict == "applied" and self.outcome is None:
            raise AdapterError("evidence that an effect was applied must carry its outcome")

    @classmethod
    def applied(cls, outcome: Outcome, *, detail: Any = None) -> Evidence:
        return cls("applied", outcome, detail)

    @classmethod
    def not_applied(cls, detail: Any) -> Evidence:
        return cls("not_applied", None, detail)

    @classmethod
    def indeterminate(cls, detail: Any = None) -> Evidence:
        return cls("indeterminate", None, detail)

    @property
    def conclusive(self) -> bool:
        return self.verdict != "indeterminate"


@dataclass(frozen=True)
class Dispatch:
    """Everything an adapter is told when asked to send one attempt.

    ``run_id`` and ``epoch`` fence stale sends: a target that checks them keeps
    the highest epoch it has seen per run and rejects a send with a lower one
    (:attr:`fencing_token` is the two as one string, ``"<run_id>:<epoch>"``).
    ``send_deadline_us`` is the deadline by the store's clock, for the record
    and for targets; the adapter decides with :meth:`check_deadline`, which
    measures on this process's monotonic clock, so a skewed or stepped wall
    clock cannot make a late send look early (F3).
    """

    attempt_id: str
    operation: str
    request: Any
    idempotency_key: str
    run_id: str
    epoch: int
    send_deadline_us: int
    deadline_monotonic_us: int
    clock: Clock = field(repr=False, compare=False)

    @property
    def fencing_token(self) -> str:
        """The run and its epoch, ``"<run_id>:<epoch>"``: send it to targets that fence."""
        return f"{self.run_id}:{self.epoch}"

    @property
    def expired(self) -> bool:
        """Whether the send deadline has passed, by this process's monotonic clock."""
        return self.clock.monotonic_us() >= self.deadline_monotonic_us

    def check_deadline(self) -> None:
        """Raise :class:`NotApplied` if the send deadline has passed (F3); call it
        immediately before the bytes go out."""
        now = self.clock.monotonic_us()
        if now >= self.deadline_monotonic_us:  # the lease may end at this instant (F3)
            raise NotApplied(
                "send deadline passed before sending",
                evidence={
                    "deadline_us": self.send_deadline_us,
                    "late_by_us": now - self.deadline_monotonic_us,
                },
            )


class RecordedAttempt(Protocol):
    """An attempt as recorded, as much of it as an adapter needs to look it up.

    Structural, so that the adapter protocol needs nothing from the store:
    :class:`charter.Attempt` is one. Annotate ``reconcile`` with it.
    """

    @property
    def id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def request(self) -> Any: ...
    @property
    def request_hash(self) -> str: ...
    @property
    def idempotency_key(self) -> str: ...
    @property
    def estimate(self) -> Mapping[str, int]: ...
    @property
    def dispatched_epoch(self) -> int | None: ...
    @property
    def dispatched_at_us(self) -> int | None: ...


@runtime_checkable
class Adapter(Protocol):
    """An integration with an outside system."""

    @property
    def name(self) -> str: ...

    @property
    def operations(self) -> Mapping[str, Operation]: ...

    def estimate(self, operation: str, request: Any) -> Estimate: ...

    def dispatch(self, send: Dispatch) -> Outcome | Awaitable[Outcome]: ...

    def reconcile(self, attempt: RecordedAttempt) -> Evidence | Awaitable[Evidence]: ...


T = TypeVar("T")


def is_async(adapter: Adapter) -> bool:
    """Whether ``adapter`` sends with ``async def dispatch`` (known per class once
    its ``dispatch`` is the class's own; asked on each send, it is on the hot path)."""
    kind = type(adapter)
    if "dispatch" in getattr(adapter, "__dict__", ()):  # set on the instance
        return inspect.iscoroutinefunction(adapter.dispatch)
    found = _ASYNC.get(kind)
    if found is None:
        found = _ASYNC[kind] = inspect.iscoroutinefunction(adapter.dispatch)
    return found


#: Whether each adapter class's ``dispatch`` is ``async def``.
_ASYNC: dict[type, bool] = {}


def blocking(aw: Awaitable[T]) -> T:
    """The value of ``aw``, for a synchronous caller: awaited on a fresh event
    loop, in a worker thread when this thread already runs one (a running loop
    cannot be re-entered, and the caller blocks either way)."""

    async def main() -> T:
        return await aw

    # asyncio (with the ssl and logging it loads) was half of `import charter`,
    # and a program that never awaits an adapter needs none of it.
    import asyncio  # noqa: PLC0415 - loaded on first use
    from concurrent.futures import ThreadPoolExecutor  # noqa: PLC0415 - likewise

    coro: Coroutine[Any, Any, T] = main()
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    with ThreadPoolExecutor(1, thread_name_prefix="charter-loop") as pool:
        return pool.submit(asyncio.run, coro).result()


def _check_amounts(amounts: Mapping[str, int], what: str) -> None:
    for unit, amount in amounts.items():
        if not is_amount(amount):
            raise AdapterError(
                f"{what} for unit {unit!r} must be an integer in [0, 2^63 - 1] in the unit's "
                f"smallest step (floats never touch the ledger), got {amount!r}"
            )
