"""What the engine tells an observer: runs, nodes and attempts as they pass.

An :class:`Observer` is given to ``Engine.open(observer=...)``; the engine
calls it when a run's segment starts and ends executing, when a node
execution starts and ends, and, for each attempt a node execution made, when
it was admitted and when it settled, as recorded (its times are the store's).
A node's attempts are reported when the node execution ends, read back from
the store, so the attempt path itself carries no observer at all; an attempt
made outside a node (``Executor.perform``) is reported when it returns.

Without an observer the engine does nothing more than ask whether it has one.
An observer's error never reaches the run: telemetry must not change what
happens. :mod:`charter.integrations.otel` turns these calls into OpenTelemetry
spans and counters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class ObservedRun:
    """A run's segment, executing."""

    run_id: str
    mission_id: str
    segment_id: str
    epoch: int
    plan: str


@dataclass(frozen=True)
class ObservedNode:
    """One execution of one node of a run."""

    run_id: str
    node_id: str
    execution: int


class ObservedAttempt(Protocol):
    """An attempt as recorded (``charter.Attempt`` is one)."""

    @property
    def id(self) -> str: ...
    @property
    def run_id(self) -> str: ...
    @property
    def node_id(self) -> str: ...
    @property
    def execution(self) -> int: ...
    @property
    def effect_key(self) -> str: ...
    @property
    def adapter(self) -> str: ...
    @property
    def operation(self) -> str: ...
    @property
    def effect_class(self) -> str: ...
    @property
    def status(self) -> str: ...
    @property
    def request(self) -> Any: ...
    @property
    def estimate(self) -> Mapping[str, int]: ...
    @property
    def actual(self) -> Mapping[str, int] | None: ...
    @property
    def receipt(self) -> Any: ...
    @property
    def price_source(self) -> str | None: ...
    @property
    def prepared_at_us(self) -> int: ...
    @property
    def settled_at_us(self) -> int | None: ...


class Observer:
    """Subclass and override what you need; every method does nothing here.

    ``status`` of a run or a node: ``"completed"``, ``"blocked"`` (it waits for
    a person, an approval, a timer or a resume) or ``"failed"``.
    """

    def run_started(self, run: ObservedRun) -> None:
        """A segment starts executing the run's plan."""

    def run_finished(self, run: ObservedRun, status: str) -> None:
        """The segment stopped executing (the run completed, blocked or failed)."""

    def node_started(self, node: ObservedNode) -> None:
        """A node execution starts (in the thread, and the event loop, it runs in)."""

    def node_finished(self, node: ObservedNode, status: str) -> None:
        """The node execution returned, blocked or raised."""

    def attempt_admitted(self, attempt: ObservedAttempt) -> None:
        """An attempt was admitted: its estimate is held (L3)."""

    def attempt_settled(self, attempt: ObservedAttempt) -> None:
        """An attempt settled: its actual cost is spent, its hold released (L1)."""
