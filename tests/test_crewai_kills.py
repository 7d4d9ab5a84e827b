"""The example crew (examples/crewai_agent.py) killed after its payment was
applied and before its settlement committed, then started again in a fresh
process (A4, A6, R1-R4); and N such kills with Charter and without it.

With Charter the crew started again gets every recorded call back by its key:
the sandbox holds the payment once, the fake provider billed each model call
once, and the ledger is what the provider billed plus what the sandbox took.
CrewAI alone (tests/_crewai_plain.py) runs the task again and pays again. The
counts are the table in docs/integrations.md. Runs in .venv-crewai.
"""

from __future__ import annotations

# ruff: noqa: I001 - _crewai_env is imported before CrewAI, which it prepares
import _crewai_env
import signal
import sys
from pathlib import Path
from typing import Any

import pytest

import test_example_imports as imports_check
from _agent_turns import clerk_turns
from _examples import World, agent_world, killed_after_paying, paid_once_billed_once, run_step
from charter import AttemptStatus

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "crewai_agent.py"
PLAIN = Path(__file__).resolve().parent / "_crewai_plain.py"
TRIALS = 3
sys.path.insert(0, str(EXAMPLE.parent))
import crewai_agent as example  # noqa: E402 - the example, importable once examples/ is on the path

pytestmark = _crewai_env.QUIET


def step(cfg: dict[str, Any], tmp: Path, **how: Any) -> tuple[int, list[dict[str, Any]]]:
    return run_step(EXAMPLE, cfg, tmp, **how)


@pytest.mark.crash
def test_A4_R4_a_crew_killed_after_paying_starts_again_and_pays_once(
    store_address: str, tmp_path: Path
) -> None:
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        world.cfg["item"] = "survey"
        engine, ops = world.engine, world.ops
        # 1. Killed once the sandbox applied the payment, before its settlement committed.
        run_id, pay = killed_after_paying(EXAMPLE, world, tmp_path)
        assert pay.effect_key.startswith(f"k:{run_id}/clerk:t1:tool:pay:")

        # 2. The dead owner is taken over; the payment is found by its key.
        _, unresolved = engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == [pay.id]
        governed = example.tools(world.box.url)
        assert engine.coordinator.reconcile(pay.id, governed, by=ops).conclusive
        engine.coordinator.confirm(pay.id, by=ops)

        # 3. A fresh process starts the crew again: every call answered from its record.
        _, out = step(world.cfg, tmp_path, run=run_id, segment="seg-2")
        assert out[-1] == {"completed": "Paid the survey vendor."}

        paid_once_billed_once(
            world, run_id, "chat", {"quote": 1, "pay": 1}, example.MICROS_PER_CENT
        )


def with_charter(world: World, tmp: Path) -> int:
    """One kill and start again under Charter; how many payments the run made."""
    engine, ops = world.engine, world.ops
    code, out = step(world.cfg, tmp, kill_at="settlement.before", nth=4)
    assert code == -signal.SIGKILL
    run_id = out[0]["run_id"]
    [pay] = [a for a in engine.attempts(run_id=run_id) if a.operation == "pay"]
    assert pay.status is AttemptStatus.DISPATCHED  # applied by the sandbox, not recorded
    engine.coordinator.recover(run_id, "seg-2")
    assert engine.coordinator.reconcile(pay.id, example.tools(world.box.url), by=ops).conclusive
    engine.coordinator.confirm(pay.id, by=ops)
    _, out = step(world.cfg, tmp, run=run_id, segment="seg-2")
    assert out[-1] == {"completed": "Paid the survey vendor."}
    keys = {a.idempotency_key for a in engine.attempts(run_id=run_id) if a.operation == "pay"}
    return sum(p["idempotency_key"] in keys for p in world.box.payments())


def without_charter(world: World, tmp: Path) -> int:
    """One kill and start again of CrewAI alone; how many payments it made."""
    before = len(world.box.payments())
    code, _ = run_step(PLAIN, world.cfg, tmp, kill=True)
    assert code == -signal.SIGKILL
    assert len(world.box.payments()) == before + 1  # applied, then killed
    _, out = run_step(PLAIN, world.cfg, tmp)
    assert out[-1] == {"completed": "Paid the survey vendor."}
    return len(world.box.payments()) - before


@pytest.mark.crash
@pytest.mark.timeout(600)
@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
def test_A4_R4_out_of_n_kills_charter_pays_once_and_crewai_alone_pays_twice(
    store_address: str, backend: str, tmp_path: Path, trial: int
) -> None:
    """One of the table's kills (each trial a test of its own, so that they run
    side by side): with Charter the crew pays once, alone it pays twice."""
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        world.cfg["item"] = "survey"
        doubles = {
            "charter": with_charter(world, tmp_path) > 1,
            "crewai alone": without_charter(world, tmp_path) > 1,
        }
        assert world.engine.check_ledger(world.mission) == []
    print(f"\ndouble payments, kill {trial} of {TRIALS} ({backend}): {doubles}")
    assert doubles == {"charter": False, "crewai alone": True}


def test_the_crewai_example_imports_only_what_its_extras_install() -> None:
    """tests/test_example_imports.py's check, for the one example the main
    environment cannot hold."""
    assert imports_check.documented(EXAMPLE) == {"crewai", "http"}
    imports_check.test_an_examples_imports_come_from_its_documented_extras(EXAMPLE)
