"""Concurrent calls on one executor keep their own state (L5, A6).

An async node may have several calls in flight at once (``asyncio.gather``,
parallel tool calls). Each call is settled by what its own admission saw: the
units the contract budgeted when it was admitted. They used to be kept on the
shared executor between admission and settlement, so a call admitted under one
contract version could be settled by another call's.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import charter
from charter import AttemptStatus
from charter.testing import RecordingAdapter
from conftest import Principals, default_contract


class _Interleaved(RecordingAdapter):
    """Call ``a`` is in flight while the contract gains a unit and call ``b`` is
    admitted under it; then ``a`` answers a cost in that unit."""

    def __init__(self, engine: charter.Engine, who: Principals, mission: str) -> None:
        super().__init__(costs={"write": {"usd": 1_000, "calls": 1}})
        self.engine, self.who, self.mission = engine, who, mission
        self.b_started = threading.Event()
        self.amended = asyncio.Event()

    async def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        self.sent.append(send)  # type: ignore[arg-type]
        if send.request["call"] == "a":
            contract = self.engine.contract(self.mission).to_dict()
            contract["allowance"] = {**contract["allowance"], "tokens": 50}
            await asyncio.to_thread(
                self.engine.amend_contract,
                self.mission,
                contract,
                by=self.who.alice,
                reason="budget tokens from now on",
            )
            self.amended.set()
            await asyncio.to_thread(self.b_started.wait, 10)
            cost = {"usd": 1_000, "calls": 1, "tokens": 5}
        else:
            self.b_started.set()
            cost = {"usd": 1_000, "calls": 1}
        return charter.Outcome.succeeded({"ok": send.request["call"]}, cost=cost)


def test_L5_A6_a_call_is_settled_by_what_its_own_admission_saw(
    engine: charter.Engine, who: Principals
) -> None:
    contract = default_contract(allowance={"usd": 1_000_000, "calls": 100})
    mission = engine.create_mission(contract, by=who.alice)
    adapter = _Interleaved(engine, who, mission)

    @charter.node
    async def both(ctx: charter.Context, _: Any) -> list[Any]:
        async def second() -> Any:
            await adapter.amended.wait()  # admitted after the amendment
            return await ctx.aattempt(adapter, "write", {"call": "b"}, key="b")

        return list(
            await asyncio.gather(ctx.aattempt(adapter, "write", {"call": "a"}, key="a"), second())
        )

    plan = charter.Plan("both", (both,))
    run = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    assert run.execute(plan) == [{"ok": "a"}, {"ok": "b"}]

    settled = {a.request["call"]: a for a in engine.attempts(run_id=run.run_id)}
    assert settled["a"].status is AttemptStatus.SUCCEEDED
    # Admitted under a contract that did not budget tokens: a's token cost is an
    # unbudgeted cost (an incident), not a spend of an allowance it held nothing in.
    assert engine.balances(mission)["tokens"].spent == 0
    kinds = [(i["kind"], i["attempt_id"]) for i in engine.incidents(mission)]
    assert ("unbudgeted_cost", settled["a"].id) in kinds
    assert engine.check_ledger(mission) == []
