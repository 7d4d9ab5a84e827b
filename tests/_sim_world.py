"""The simulator's outside world and its seams (see tests/_simulation.py).

The target a seed decides (:class:`World`), the adapters that reach it, the
crash hook that injects store faults and pauses, and the names of what can
happen, with how often it does.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import charter
from charter import AttemptStatus, Dispatch, Evidence, NotApplied, Outcome
from charter.adapters import EffectClass, Operation, RecordedAttempt
from charter.engine.executor import Executor
from charter.testing import AsyncRecordingAdapter, AtCommit, RecordingAdapter

if TYPE_CHECKING:
    from _simulation import Simulation

LEASE = 30.0
APPROVAL_TTL = 120
COSTS = {
    "read": {"usd": 1_000, "calls": 1},
    "write": {"usd": 5_000, "calls": 1},
    "charge": {"usd": 20_000, "calls": 1},
}
OPERATIONS = {
    "read": Operation(EffectClass.READ_ONLY),
    "write": Operation(EffectClass.UNSAFE),
    "charge": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=3_600),
}
#: What the target does with a send, and how often.
FATES = {
    "applied": 8,
    "refused": 2,  # NotApplied: proven not applied
    "timeout": 2,  # applied, then the answer timed out (UNKNOWN)
    "lost": 1,  # never arrived, but the sender cannot know (UNKNOWN)
    "late": 1,  # applied; the answer comes back after the owner lost the run
    "duplicate": 1,  # applied; the answer is delivered, and again by the lookup later
    "overbilled": 1,  # applied at more than the hold (L5: an incident)
    "paused": 1,  # the sender pauses after its dispatch commit, past its lease (F3)
}
LOOKUPS = {"available": 5, "unavailable": 2, "racing": 1}
FAULTS = {None: 14, "fail.before": 1, "fail.after": 1, "busy": 1, "kill.before": 1, "kill.after": 1}
HOLDING = frozenset({AttemptStatus.PREPARED, AttemptStatus.DISPATCHED, AttemptStatus.UNKNOWN})


def replay_command(seed: int, steps: int, backend: str) -> str:
    """The one command that replays a seed."""
    extra = "" if backend == "sqlite" else f" --backend {backend}"
    return f"python3 tasks.py simulate --seed {seed} --steps {steps}{extra}"


class Violation(AssertionError):
    """An invariant broken, named by its rule."""

    def __init__(self, rule: str, message: str) -> None:
        super().__init__(f"{rule}: {message}")
        self.rule = rule


class SimulatedCrash(BaseException):
    """The worker's process dies here (a BaseException: nothing may catch it)."""


def pick(rng: random.Random, weights: dict[Any, int]) -> Any:
    return rng.choices(list(weights), weights=list(weights.values()))[0]


@dataclass
class Received:
    """One send as the target received it."""

    attempt_id: str
    operation: str
    run_id: str
    epoch: int
    applied: bool


class World:
    """The outside world: a target that applies what it is sent (deduplicating
    ``idempotent_keyed`` sends by key), answers as its fate says, keeps the
    books a lookup reads, and records every send it received."""

    def __init__(self, sim: Simulation) -> None:
        self.sim = sim
        self.received: list[Received] = []
        self.applied: dict[str, dict[str, int]] = {}  # attempt id -> what it billed
        self.duplicates: list[str] = []
        self.fate = "applied"
        self.lookup = "available"

    def receive(self, send: Dispatch) -> Outcome:
        """The target's side of a send; it does not check the deadline (the
        engine must have: a send received after it is an F3 violation)."""
        self.sim.check_send(send)
        fate, self.fate = self.fate, "applied"
        first = all(r.attempt_id != send.attempt_id for r in self.received)
        if not first and OPERATIONS[send.operation].effect is EffectClass.IDEMPOTENT_KEYED:
            self.received.append(
                Received(send.attempt_id, send.operation, send.run_id, send.epoch, False)
            )
            if send.attempt_id in self.applied:  # deduplicated: the first answer again
                return self._answer(send)
            fate = "applied"
        if fate in ("refused", "lost"):
            self.received.append(
                Received(send.attempt_id, send.operation, send.run_id, send.epoch, False)
            )
            if fate == "refused":
                raise NotApplied("refused before processing", evidence={"to": send.attempt_id})
            raise ConnectionResetError("connection reset; nothing came back")
        cost = dict(COSTS[send.operation])
        if fate == "overbilled":
            cost["usd"] += 7
        elif self.sim.rng.random() < 0.3:
            cost["usd"] = self.sim.rng.randrange(cost["usd"] + 1)
        self.applied[send.attempt_id] = cost
        self.received.append(
            Received(send.attempt_id, send.operation, send.run_id, send.epoch, True)
        )
        if fate == "timeout":
            raise TimeoutError("applied, but the answer timed out")
        if fate == "late":
            self.sim.meanwhile_take_over(send.run_id)
        if fate == "duplicate":
            self.duplicates.append(send.attempt_id)
        return self._answer(send)

    def _answer(self, send: Dispatch) -> Outcome:
        return Outcome.succeeded(
            {"done": send.attempt_id},
            cost=self.applied[send.attempt_id],
            receipt={"id": send.idempotency_key},
            price_source="world/books",
        )

    def look_up(self, attempt: RecordedAttempt) -> Evidence:
        """What the target's books say; unavailable, or racing a person's resolution."""
        fate, self.lookup = self.lookup, "available"
        if fate == "unavailable":
            raise ConnectionError("the target's lookup is unavailable")
        if fate == "racing":
            self.sim.meanwhile_resolve(attempt.id)
        cost = self.applied.get(attempt.id)
        if cost is None:
            return Evidence.not_applied({"books": "no such key", "attempt": attempt.id})
        outcome = Outcome.succeeded(
            {"done": attempt.id}, cost=cost, receipt={"id": attempt.idempotency_key}
        )
        return Evidence.applied(outcome, {"books": "found"})


@dataclass
class WorldAdapter(RecordingAdapter):
    """A synchronous adapter to the simulated world."""

    world: World | None = None

    def _answer(self, send: Dispatch) -> Outcome:
        assert self.world is not None
        return self.world.receive(send)

    def _look_up(self, attempt: RecordedAttempt) -> Evidence:
        assert self.world is not None
        return self.world.look_up(attempt)


@dataclass
class AsyncWorldAdapter(WorldAdapter, AsyncRecordingAdapter):
    """The same adapter with ``async def`` send and lookup: the world's answers
    from :class:`WorldAdapter`, the sending from ``AsyncRecordingAdapter``."""


@dataclass
class Hook:
    """An engine's crash hook: the armed store fault, and a pause at a named point."""

    fault: AtCommit | None = None
    pause_at: str | None = None
    pause: Callable[[], None] | None = None
    fired: bool = False

    def __call__(self, name: str) -> None:
        if self.pause is not None and name == self.pause_at:
            pause, self.pause = self.pause, None
            pause()
        if self.fault is not None:
            try:
                self.fault(name)
            except BaseException:
                self.fault, self.fired = None, True
                raise


@dataclass
class Process:
    """A worker (or the operator): an engine on the shared store, its clock, its runs."""

    name: str
    offset: float
    engine: charter.Engine
    hook: Hook
    executor: Executor | None = None
    who: dict[str, charter.Principal] = field(default_factory=dict)


@dataclass
class Stats:
    steps: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    fates: Counter[str] = field(default_factory=Counter)
    actions: Counter[str] = field(default_factory=Counter)
