"""Time as a seam: the engine never reads the wall clock directly.

Times are integers of microseconds since the Unix epoch (UTC) everywhere in the
store, so leases and deadlines compare exactly and never pass through floats.
Tests move a :class:`ManualClock` instead of sleeping.
"""

from __future__ import annotations

import time
from datetime import UTC, datetime
from typing import Protocol

MICROS = 1_000_000


class Clock(Protocol):
    """A source of the current time in microseconds since the epoch, and of a
    monotonic time that only measures durations.

    Wall-clock time names instants (recorded, compared with the store's clock);
    monotonic time measures how long something took in *this* process, which a
    skewed or stepped wall clock cannot distort. Send deadlines are measured on
    it (F3).
    """

    def now_us(self) -> int: ...

    def monotonic_us(self) -> int: ...


class SystemClock:
    """The machine's real-time clock, and its monotonic clock."""

    def now_us(self) -> int:
        return time.time_ns() // 1_000

    def monotonic_us(self) -> int:
        return time.monotonic_ns() // 1_000


class ManualClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start_us: int = 1_767_225_600 * MICROS) -> None:
        self._now = start_us
        self._elapsed = 0

    def now_us(self) -> int:
        return self._now

    def monotonic_us(self) -> int:
        return self._elapsed

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (never backward); monotonic time
        moves by the same amount."""
        if seconds < 0:
            raise ValueError("a clock never moves backward")
        step = round(seconds * MICROS)
        self._now += step
        self._elapsed += step


class SkewedClock:
    """Another machine's view of ``base``: its wall clock off by ``offset_seconds``
    (ahead if positive), its monotonic clock running at the same rate.

    For tests of several machines sharing one store whose clocks disagree: the
    store keeps ``base`` as its clock, a worker gets a skewed one.
    """

    def __init__(self, base: Clock, offset_seconds: float) -> None:
        self.base = base
        self.offset_us = round(offset_seconds * MICROS)

    def now_us(self) -> int:
        return self.base.now_us() + self.offset_us

    def monotonic_us(self) -> int:
        return self.base.monotonic_us()


def seconds_us(seconds: float) -> int:
    """Convert a duration in seconds to integer microseconds."""
    return round(seconds * MICROS)


def iso(us: int | None) -> str | None:
    """Render a stored timestamp for people (ISO 8601, UTC)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / MICROS, tz=UTC).isoformat(timespec="milliseconds")
