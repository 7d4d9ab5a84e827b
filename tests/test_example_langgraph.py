"""The example LangGraph agent (examples/langgraph_agent.py) killed after its
payment was applied and before its settlement committed, then resumed in a
fresh process from the same thread of LangGraph's checkpointer (A4, A6, R1-R4).

The sandbox holds the payment once; the fake provider billed each model call
once, the resumed graph having replayed the recorded ones; the ledger is what
the provider billed plus what the sandbox took.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from _agent_turns import clerk_turns
from _examples import World, agent_world, killed_after_paying, paid_once_billed_once, run_step

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "langgraph_agent.py"
sys.path.insert(0, str(EXAMPLE.parent))
import langgraph_agent as example  # noqa: E402 - the example, importable once examples/ is on the path


def checkpoints(world: World, tmp: Path, backend: str) -> None:
    """LangGraph's checkpointer beside Charter's store: the same PostgreSQL
    schema, or a SQLite file of its own."""
    store = world.cfg["store"]
    world.cfg["checkpoints"] = store if backend == "postgresql" else str(tmp / "graph.db")


def step(cfg: dict[str, Any], tmp: Path, **how: Any) -> tuple[int, list[dict[str, Any]]]:
    return run_step(EXAMPLE, cfg, tmp, **how)


@pytest.mark.crash
def test_A4_R4_the_graph_killed_after_paying_resumes_its_thread_and_pays_once(
    store_address: str, backend: str, tmp_path: Path
) -> None:
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        checkpoints(world, tmp_path, backend)
        engine, ops = world.engine, world.ops
        # 1. Killed once the sandbox applied the payment, before its settlement committed.
        run_id, pay = killed_after_paying(EXAMPLE, world, tmp_path)
        assert pay.effect_key == f"k:{run_id}/clerk:tool:call_pay_1"

        # 2. The dead owner is taken over; the payment is found by its key.
        _, unresolved = engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == [pay.id]
        governed = example.tools(world.box.url)
        assert engine.coordinator.reconcile(pay.id, governed, by=ops).conclusive
        engine.coordinator.confirm(pay.id, by=ops)

        # 3. A fresh process resumes the thread from LangGraph's checkpoint.
        _, out = step(world.cfg, tmp_path, run=run_id, segment="seg-2")
        assert out[-1] == {"completed": "Paid the survey vendor."}

        paid_once_billed_once(
            world, run_id, "chat", {"quote": 1, "pay": 1}, example.MICROS_PER_CENT
        )
