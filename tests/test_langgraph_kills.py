"""Double payments out of N kills, LangGraph with Charter and without (A4, R4).

Each trial runs the example agent in a process, SIGKILLs it after the payments
sandbox applied the payment and before the agent recorded it, and starts it
again with LangGraph's own resume: the same thread, from its checkpointer.
With Charter (examples/langgraph_agent.py) the resumed graph gets the
payment's record back, settled by the sandbox's lookup after recovery; without
it (tests/_langgraph_plain.py) the tool node runs again and pays again. The
counts are the table in docs/integrations.md.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from _agent_turns import clerk_turns
from _examples import World, agent_world, run_step
from charter import AttemptStatus
from test_example_langgraph import EXAMPLE, checkpoints, example

PLAIN = Path(__file__).resolve().parent / "_langgraph_plain.py"
TRIALS = 3


def with_charter(world: World, tmp: Path) -> int:
    """One kill and resume under Charter; how many payments the run made."""
    engine, ops = world.engine, world.ops
    code, out = run_step(EXAMPLE, world.cfg, tmp, kill_at="settlement.before", nth=4)
    assert code == -signal.SIGKILL
    run_id = out[0]["run_id"]
    [pay] = [a for a in engine.attempts(run_id=run_id) if a.operation == "pay"]
    assert pay.status is AttemptStatus.DISPATCHED  # applied by the sandbox, not recorded
    engine.coordinator.recover(run_id, "seg-2")
    assert engine.coordinator.reconcile(pay.id, example.tools(world.box.url), by=ops).conclusive
    engine.coordinator.confirm(pay.id, by=ops)
    _, out = run_step(EXAMPLE, world.cfg, tmp, run=run_id, segment="seg-2")
    assert out[-1] == {"completed": "Paid the survey vendor."}
    keys = {a.idempotency_key for a in engine.attempts(run_id=run_id) if a.operation == "pay"}
    return sum(p["idempotency_key"] in keys for p in world.box.payments())


def without_charter(world: World, tmp: Path, trial: int) -> int:
    """One kill and resume of LangGraph alone; how many payments it made."""
    before = len(world.box.payments())
    cfg = {**world.cfg, "thread": f"plain-{trial}"}
    code, _ = run_step(PLAIN, cfg, tmp, step="start", kill=True)
    assert code == -signal.SIGKILL
    assert len(world.box.payments()) == before + 1  # applied, then killed
    _, out = run_step(PLAIN, cfg, tmp, step="resume")
    assert out[-1] == {"completed": "Paid the survey vendor."}
    return len(world.box.payments()) - before


@pytest.mark.crash
@pytest.mark.timeout(600)
@pytest.mark.parametrize("trial", range(1, TRIALS + 1))
def test_A4_R4_out_of_n_kills_charter_pays_once_and_langgraph_alone_pays_twice(
    store_address: str, backend: str, tmp_path: Path, trial: int
) -> None:
    """One of the table's kills (each trial a test of its own, so that they run
    side by side): with Charter the resumed graph pays once, alone it pays twice."""
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        checkpoints(world, tmp_path, backend)
        doubles = {
            "charter": with_charter(world, tmp_path) > 1,
            "langgraph alone": without_charter(world, tmp_path, trial) > 1,
        }
        assert world.engine.check_ledger(world.mission) == []
    print(f"\ndouble payments, kill {trial} of {TRIALS} ({backend}): {doubles}")
    assert doubles == {"charter": False, "langgraph alone": True}
