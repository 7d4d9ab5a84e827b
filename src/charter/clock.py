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
    """A source of the current time in microseconds since the epoch."""

    def now_us(self) -> int: ...


class SystemClock:
    """The machine's real-time clock."""

    def now_us(self) -> int:
        return time.time_ns() // 1_000


class ManualClock:
    """A clock that only moves when told to; for tests and simulations."""

    def __init__(self, start_us: int = 1_767_225_600 * MICROS) -> None:
        self._now = start_us

    def now_us(self) -> int:
        return self._now

    def advance(self, seconds: float) -> None:
        """Move the clock forward by ``seconds`` (never backward)."""
        if seconds < 0:
            raise ValueError("a clock never moves backward")
        self._now += round(seconds * MICROS)


def seconds_us(seconds: float) -> int:
    """Convert a duration in seconds to integer microseconds."""
    return round(seconds * MICROS)


def iso(us: int | None) -> str | None:
    """Render a stored timestamp for people (ISO 8601, UTC)."""
    if us is None:
        return None
    return datetime.fromtimestamp(us / MICROS, tz=UTC).isoformat(timespec="milliseconds")
