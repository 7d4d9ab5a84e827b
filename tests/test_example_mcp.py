"""The example MCP agent (examples/mcp_agent.py) killed after its payment was
applied and before its settlement committed, then recovered in a fresh
process (A4, A8, R1-R4, R8).

MCP offers no lookup, so the lost payment stays uncertain under reconcile and
an operator settles it with the sandbox's record as evidence. The sandbox
holds the payment once; the fake provider billed each model call once, the
resumed run having replayed the recorded ones; the ledger is what the
provider billed plus what the sandbox took.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
from mcp import Client

from _agent_turns import clerk_turns
from _examples import agent_world, killed_after_paying, paid_once_billed_once, run_step

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mcp_agent.py"
sys.path.insert(0, str(EXAMPLE.parent))
import mcp_agent as example  # noqa: E402 - the example, importable once examples/ is on the path


def step(cfg: dict[str, Any], tmp: Path, **how: Any) -> tuple[int, list[dict[str, Any]]]:
    return run_step(EXAMPLE, cfg, tmp, **how)


def desk_tools(sandbox_url: str) -> example.Tools:
    """The example's tools as an operator reconciles with them."""

    async def connect() -> example.Tools:
        async with Client(example.server(sandbox_url)) as client:
            return await example.Tools.connect(client, name="tools", keyed={"pay": 86_400})

    return asyncio.run(connect())


@pytest.mark.crash
def test_A4_R8_the_mcp_agent_killed_after_paying_is_resolved_and_pays_once(
    store_address: str, tmp_path: Path
) -> None:
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        engine, box, ops, cfg = world.engine, world.box, world.ops, world.cfg
        # 1. Killed once the sandbox applied the payment, before its settlement committed.
        run_id, pay = killed_after_paying(EXAMPLE, world, tmp_path)
        [record] = box.payments()  # the tool got the attempt's key in its _meta

        # 2. The dead owner is taken over. MCP cannot look the call up, so an
        # operator settles it on the sandbox's record.
        _, unresolved = engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == [pay.id]
        evidence = engine.coordinator.reconcile(pay.id, desk_tools(box.url), by=ops)
        assert not evidence.conclusive
        engine.coordinator.resolve(
            pay.id,
            by=ops,
            outcome="succeeded",
            evidence={"sandbox": record},
            cost={"usd": record["amount"] * example.MICROS_PER_CENT},
            result=record,
        )

        # 3. A fresh process resumes: the recorded calls come back, the last model call is made.
        _, out = step(cfg, tmp_path, run=run_id, segment="seg-2")
        assert out[-1] == {"completed": "Paid the survey vendor."}

        assert box.payments() == [record]  # the payment the operator settled, once
        paid_once_billed_once(
            world, run_id, "chat", {"quote": 1, "pay": 1}, example.MICROS_PER_CENT
        )
