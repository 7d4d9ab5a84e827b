"""Samples and their summaries: every figure is a median with its spread.

A measurement is taken ``warmup + reps`` times; warm-up values are dropped and
kept apart, so the report can show what was thrown away. The spread is the
full range (min to max) of the kept values, never a trimmed one.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Sample:
    """Repeated values of one quantity, in ``unit``."""

    unit: str
    values: list[float] = field(default_factory=list)
    warmup: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread(self) -> float:
        """(max - min) / median: 0.10 means the values span 10% of the median."""
        return (self.high - self.low) / self.median if self.median else 0.0

    def to_dict(self) -> dict[str, Any]:
        return {
            "unit": self.unit,
            "median": self.median,
            "min": self.low,
            "max": self.high,
            "spread": self.spread,
            "reps": len(self.values),
            "values": self.values,
            "warmup": self.warmup,
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Sample:
        return cls(data["unit"], list(data["values"]), list(data.get("warmup", [])))


def repeat(fn: Callable[[int], float], *, warmup: int, reps: int, unit: str) -> Sample:
    """Call ``fn(i)`` (which returns one value) ``warmup + reps`` times."""
    sample = Sample(unit)
    for i in range(warmup + reps):
        value = fn(i)
        (sample.warmup if i < warmup else sample.values).append(value)
    return sample


def clock() -> float:
    """A monotonic clock in seconds, with the best resolution available."""
    return time.perf_counter()


def _scale(value: float, unit: str) -> tuple[float, str]:
    """A divisor and a unit name that suit ``value``."""
    if unit == "bytes":
        return 1e6, "MB"
    if unit == "s":
        if value >= 1:
            return 1.0, "s"
        if value >= 1e-3:
            return 1e-3, "ms"
        return 1e-6, "µs"
    return 1.0, unit


def _num(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def fmt(value: float, unit: str) -> str:
    """A short human form: ``1.23 ms``, ``845 µs``, ``41.2 MB``."""
    div, name = _scale(value, unit)
    return f"{_num(value / div)} {name}"


def fmt_sample(sample: Sample) -> str:
    """``median [min-max] unit``, all in the median's unit."""
    div, name = _scale(sample.median, sample.unit)
    return (
        f"{_num(sample.median / div)} [{_num(sample.low / div)}-{_num(sample.high / div)}] {name}"
    )


def sample_of(entry: dict[str, Any] | None) -> Sample | None:
    """The sample a result entry holds, if it holds one."""
    if not entry or "sample" not in entry:
        return None
    return Sample.from_dict(entry["sample"])


def row(
    check: str,
    charter: str,
    reference: str,
    *,
    value: float | None,
    shown: str,
    target: float,
    target_text: str,
    strict: bool = False,
    at_least: bool = False,
) -> dict[str, Any]:
    """A row of docs/performance.md: the figure, its target, and whether it was met."""
    if value is None:
        result = "pending"
    elif at_least:
        result = "met" if value >= target else "missed"
    elif strict:
        result = "met" if value < target else "missed"
    else:
        result = "met" if value <= target else "missed"
    return {
        "check": check,
        "Charter": charter,
        "compared with": reference,
        "value": shown if value is not None else "—",
        "target": target_text,
        "result": result,
        "measured": value,
        "limit": target,
    }
