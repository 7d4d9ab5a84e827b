"""The deterministic simulator (tests/_simulation.py), run as tests.

The fast profile runs a few seeds per store in the normal suite; ``python3
tasks.py simulate --long`` (or ``faults --long``) runs many more, and
``python3 tasks.py simulate --seed N`` replays one. Every seed that ever broke
an invariant is in ``REGRESSIONS`` and runs every time.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

import charter.adapters.protocol
from _simulation import Stats, Violation, replay_command, simulate
from conftest import LONG, fresh_store

#: Seeds that once broke an invariant: each runs in every profile, on every store.
REGRESSIONS: list[int] = []


def profile(backend: str) -> tuple[list[int], int]:
    """Seeds and steps: ``CHARTER_SIM_SEED`` (one seed), ``CHARTER_SIM_SEEDS``
    (how many), ``CHARTER_SIM_STEPS``, else the fast or the long profile."""
    steps = int(os.environ.get("CHARTER_SIM_STEPS") or (200 if LONG else 80))
    if backend != "sqlite" and not LONG and not os.environ.get("CHARTER_SIM_STEPS"):
        steps = 50  # a round trip per statement: shorter histories in the suite
    if os.environ.get("CHARTER_SIM_SEED"):
        return [int(os.environ["CHARTER_SIM_SEED"])], steps
    fast = 5 if backend == "sqlite" else 2
    count = int(os.environ.get("CHARTER_SIM_SEEDS") or (fast * 25 if LONG else fast))
    first = int(os.environ.get("CHARTER_SIM_FIRST") or 1)
    return list(range(first, first + count)), steps


def run_seeds(backend: str, tmp_path: Path, seeds: list[int], steps: int) -> Stats:
    total = Stats()
    for seed in seeds:
        with fresh_store(tmp_path / str(seed), backend) as url:
            (tmp_path / str(seed)).mkdir(exist_ok=True)
            digest, stats = simulate(seed, url, backend, steps)
        print(f"seed {seed} ({backend}): {stats.steps} steps, trace {digest}")
        total.steps += stats.steps
        total.faults += stats.faults
        total.fates += stats.fates
        total.actions += stats.actions
    print(
        f"{backend}: {len(seeds)} seeds, {total.steps} steps, "
        f"{sum(total.faults.values())} store faults {dict(total.faults)}, "
        f"{sum(total.fates.values())} target outcomes {dict(total.fates)}, no violation"
    )
    return total


@pytest.mark.timeout(0 if LONG else 600)
def test_A2_A4_F2_F3_L0_R7_R8_S1_hold_in_every_simulated_history(
    backend: str, tmp_path: Path
) -> None:
    """Seeded histories of two skewed workers and an operator against a world
    that applies, refuses, times out, answers late or twice, under store faults
    and clock moves: any broken rule fails with its name and its replay command."""
    seeds, steps = profile(backend)
    if not os.environ.get("CHARTER_SIM_SEED"):
        seeds += [s for s in REGRESSIONS if s not in seeds]
    run_seeds(backend, tmp_path, seeds, steps)


def test_the_same_seed_gives_the_same_trace_in_another_process(tmp_path: Path) -> None:
    """Determinism is what makes a failing seed worth printing: the trace (every
    step, every outcome, every stored status and balance) hashes the same in a
    fresh process whose string hashing differs."""
    with fresh_store(tmp_path / "a", "sqlite") as url:
        (tmp_path / "a").mkdir()
        here, _ = simulate(7, url, "sqlite", 40)
    code = (
        "import sys; sys.path.insert(0, 'tests'); from _simulation import simulate; "
        f"print(simulate(7, {str(tmp_path / 'b.db')!r}, 'sqlite', 40)[0])"
    )
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == here


def test_F3_the_simulator_catches_a_send_after_its_deadline_and_names_the_replay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The checks are real: with the engine's own deadline check taken out, a
    sender paused past its lease reaches the target, and the seed says so."""
    monkeypatch.setattr(charter.adapters.protocol.Dispatch, "expired", property(lambda s: False))
    found: Counter[str] = Counter()
    for seed in range(1, 30):
        with fresh_store(tmp_path / str(seed), "sqlite") as url:
            (tmp_path / str(seed)).mkdir()
            try:
                simulate(seed, url, "sqlite", 120)
            except Violation as exc:
                assert replay_command(seed, 120, "sqlite") in str(exc)
                found[exc.rule] += 1
                break
    assert found == {"F3": 1}
