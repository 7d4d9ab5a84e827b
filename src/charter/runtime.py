"""What the engine's parts share, handed down to them, never reached up for.

An :class:`~charter.engine.engine.Engine` builds one :class:`Runtime` and gives it to
every executor and to its coordinator: the store, the configuration, the
clocks, authority, randomness and the crash hook (the seams tests control),
and the observer telemetry is given.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from charter.clock import Clock
from charter.config import EngineConfig
from charter.contracts.authority import Authority
from charter.crashpoints import CrashHook
from charter.storage import Database
from charter.telemetry import Observer


@dataclass(frozen=True)
class Runtime:
    """One engine's shared parts."""

    db: Database
    config: EngineConfig
    clock: Clock
    authority: Authority
    rng: random.Random
    crash_hook: CrashHook | None = None
    #: Told of runs, nodes and attempts (:mod:`charter.telemetry`); ``None``: nobody.
    observer: Observer | None = None

    def crash(self, point: str) -> None:
        """A durable boundary: where a test's crash hook may kill the process."""
        if self.crash_hook is not None:
            self.crash_hook(point)

    def random(self) -> float:
        return self.rng.random()

    def randbits(self, n: int) -> int:
        return self.rng.getrandbits(n)
