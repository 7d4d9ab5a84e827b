"""Helpers for testing missions and adapters against a real store.

- :class:`ManualClock` — move time instead of sleeping;
- :func:`kill_at` — a crash hook that SIGKILLs the process at a named durable
  boundary (see :data:`charter.crashpoints.POINTS`), for real crash tests;
- :class:`AtCommit` — a crash hook that acts at the k-th physical commit,
  whatever it records: kills the process, or makes the commit fail (before
  it, or after it succeeded), for sweeps over every commit of a workload;
- :class:`RecordingAdapter` — an in-process adapter that records exactly what
  it was asked to send, with scripted outcomes; :class:`AsyncRecordingAdapter`
  is the same with ``async def dispatch`` and ``async def reconcile``;
- :func:`credential` — a fresh ``(credential, digest)`` pair for a principal;
- :func:`check_adapter` — the conformance kit every adapter passes: what its
  answers prove, no secret stored, answers bounded (:mod:`charter.conformance`).
"""

from __future__ import annotations

import os
import signal
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from charter.adapters import (
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
    RecordedAttempt,
)
from charter.clock import ManualClock, SkewedClock
from charter.conformance import check_adapter
from charter.contracts.principals import new_credential as credential
from charter.crashpoints import COMMIT_POINTS, POINTS, CrashHook
from charter.errors import StoreError

if TYPE_CHECKING:
    import asyncio

__all__ = [
    "COMMIT_POINTS",
    "POINTS",
    "AsyncRecordingAdapter",
    "AtCommit",
    "ManualClock",
    "RecordingAdapter",
    "Sent",
    "SkewedClock",
    "check_adapter",
    "credential",
    "kill_at",
]


def kill_at(point: str, nth: int = 1) -> CrashHook:
    """A crash hook that kills this process with SIGKILL the ``nth`` time it
    passes ``point`` (in a plan whose nodes run concurrently, in the middle)."""
    if point not in POINTS:
        raise ValueError(f"unknown crash point {point!r}; known: {POINTS}")
    if isinstance(nth, bool) or not isinstance(nth, int) or nth < 1:
        raise ValueError(f"nth counts from 1, got {nth!r}")
    passed = [0]

    def hook(name: str) -> None:
        if name == point:
            passed[0] += 1
            if passed[0] == nth:
                os.kill(os.getpid(), signal.SIGKILL)

    return hook


@dataclass
class AtCommit:
    """A crash hook counting physical commits; at the ``k``-th, ``when`` it is
    ``"before"`` or ``"after"`` it, it does ``what``:

    - ``"kill"``: SIGKILL this process (before: the commit never happened;
      after: it is durable and nobody was told);
    - ``"fail"``: raise ``error`` (before: a commit that failed, nothing stored;
      after: one that succeeded while its caller was told it failed, as when
      the connection is lost after the server committed);
    - ``"pause"``: SIGSTOP this process, which goes on where it was when it is
      sent SIGCONT (a worker paused past its lease, then resumed; before the
      commit it still holds the store's lock for it).

    With ``k = 0`` it only counts (``seen``), to learn a workload's commits.
    """

    k: int = 0
    when: str = "before"
    what: str = "kill"
    error: BaseException | None = None
    seen: int = 0

    def __post_init__(self) -> None:
        if self.when not in ("before", "after") or self.what not in ("kill", "fail", "pause"):
            raise ValueError("when is 'before' or 'after'; what is 'kill', 'fail' or 'pause'")

    def __call__(self, name: str) -> None:
        if name not in COMMIT_POINTS:
            return
        if name == "commit.before":
            self.seen += 1
        if self.seen != self.k or name != f"commit.{self.when}":
            return
        if self.what == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.what == "pause":
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        raise self.error or StoreError(f"the connection was lost at commit {self.k} ({self.when})")


@dataclass(frozen=True)
class Sent:
    """One dispatch as the adapter received it."""

    attempt_id: str
    operation: str
    request: Any
    idempotency_key: str
    run_id: str
    epoch: int
    send_deadline_us: int

    @property
    def fencing_token(self) -> str:
        """As the target received it: ``"<run_id>:<epoch>"``."""
        return f"{self.run_id}:{self.epoch}"


Script = Callable[[Dispatch], Outcome]


@dataclass
class RecordingAdapter:
    """An adapter that records every send and answers from a script.

    ``script`` maps an operation to a function of the :class:`Dispatch` that
    returns an :class:`Outcome` or raises (``NotApplied`` to prove
    non-application, anything else to leave the outcome unknown). By default
    every operation succeeds at its estimate.
    """

    name: str = "recorder"
    operations: Mapping[str, Operation] = field(
        default_factory=lambda: {
            "read": Operation(EffectClass.READ_ONLY),
            "write": Operation(EffectClass.UNSAFE),
            "charge": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=86_400),
        }
    )
    costs: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    script: dict[str, Script] = field(default_factory=dict)
    evidence: dict[str, Evidence] = field(default_factory=dict)
    sent: list[Sent] = field(default_factory=list)
    reconciled: list[str] = field(default_factory=list)

    def estimate(self, operation: str, request: Any) -> Estimate:
        return Estimate(dict(self.costs.get(operation, {"calls": 1})), f"{self.name}/test-prices")

    def dispatch(self, send: Dispatch) -> Outcome | Awaitable[Outcome]:
        return self._answer(send)

    def reconcile(self, attempt: RecordedAttempt) -> Evidence | Awaitable[Evidence]:
        return self._look_up(attempt)

    def _answer(self, send: Dispatch) -> Outcome:
        send.check_deadline()
        self.sent.append(
            Sent(
                send.attempt_id,
                send.operation,
                send.request,
                send.idempotency_key,
                send.run_id,
                send.epoch,
                send.send_deadline_us,
            )
        )
        handler = self.script.get(send.operation)
        if handler is not None:
            return handler(send)
        return Outcome.succeeded(
            {"ok": True, "echo": send.request},
            cost=self.estimate(send.operation, send.request).amounts,
            receipt={"id": f"rcpt-{send.idempotency_key}"},
        )

    def _look_up(self, attempt: RecordedAttempt) -> Evidence:
        self.reconciled.append(attempt.id)
        return self.evidence.get(attempt.id, Evidence.indeterminate({"looked_up": attempt.id}))


@dataclass
class AsyncRecordingAdapter(RecordingAdapter):
    """A :class:`RecordingAdapter` whose send and lookup are ``async def``.

    ``loops`` records the event loop each send was awaited on, so a test can
    show where an async adapter ran.
    """

    loops: list[asyncio.AbstractEventLoop] = field(default_factory=list)

    async def dispatch(self, send: Dispatch) -> Outcome:
        import asyncio  # noqa: PLC0415 - the running loop loaded it; `import charter.testing` does not

        self.loops.append(asyncio.get_running_loop())
        await asyncio.sleep(0)  # a real await: the loop may run other tasks here
        return self._answer(send)

    async def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        import asyncio  # noqa: PLC0415 - as in dispatch

        await asyncio.sleep(0)
        return self._look_up(attempt)
