"""Shared fixtures: a real store per backend, a manual clock, real principals.

Every test that takes ``engine`` runs once per backend in ``BACKENDS``; the
PostgreSQL backend joins this list when it lands, and the same tests prove it.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import charter
from charter.testing import ManualClock, RecordingAdapter, credential

BACKENDS = ["sqlite"]

NAMES = ("agent", "alice", "bob", "mallory")


@dataclass
class Principals:
    """Credentials and authenticated principals of the test engine."""

    credentials: dict[str, str]
    digests: dict[str, str]
    engine: charter.Engine

    def __getattr__(self, name: str) -> charter.Principal:
        if name in self.credentials:
            return self.engine.authenticate(self.credentials[name])
        raise AttributeError(name)


def default_contract(**overrides: Any) -> dict[str, Any]:
    """A contract: ``agent`` runs on the recorder, ``alice`` decides, ``bob`` approves."""
    contract: dict[str, Any] = {
        "objective": "test mission",
        "principals": {
            "agent": {"run": ["recorder.*"]},
            "alice": ["resolve", "raise_limit", "stop", "link", "adopt", "consume", "approve"],
            "bob": {"approve": ["recorder.*"]},
        },
        "allowance": {"usd": 1_000_000, "calls": 100},
    }
    contract.update(overrides)
    return contract


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def creds() -> tuple[dict[str, str], dict[str, str]]:
    pairs = {n: credential(n) for n in NAMES}
    return {n: c for n, (c, _) in pairs.items()}, {n: d for n, (_, d) in pairs.items()}


@pytest.fixture
def store_url(tmp_path: Path, backend: str) -> str:
    assert backend == "sqlite"
    return str(tmp_path / "charter.db")


@pytest.fixture
def make_engine(
    store_url: str, clock: ManualClock, creds: tuple[dict[str, str], dict[str, str]]
) -> Iterator[Callable[..., charter.Engine]]:
    """Open (more) engines on the same store; all are closed after the test."""
    opened: list[charter.Engine] = []

    def make(**config: Any) -> charter.Engine:
        cfg = charter.EngineConfig(credentials=creds[1], **config)
        eng = charter.Engine.open(
            store_url, config=cfg, clock=clock, rng=random.Random(len(opened))
        )
        opened.append(eng)
        return eng

    yield make
    for eng in opened:
        eng.close()


@pytest.fixture
def engine(make_engine: Callable[..., charter.Engine]) -> charter.Engine:
    return make_engine()


@pytest.fixture
def who(engine: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    """``who.agent``, ``who.alice`` ... authenticated on ``engine``."""
    return Principals(creds[0], creds[1], engine)


@pytest.fixture
def adapter() -> RecordingAdapter:
    return RecordingAdapter(
        costs={
            "read": {"usd": 1_000, "calls": 1},
            "write": {"usd": 5_000, "calls": 1},
            "charge": {"usd": 20_000, "calls": 1},
        }
    )


@pytest.fixture
def mission(engine: charter.Engine, who: Principals) -> str:
    return engine.create_mission(default_contract(), by=who.alice)
