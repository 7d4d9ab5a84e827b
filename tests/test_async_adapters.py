"""Async adapters: ``await ctx.aattempt(...)`` awaits the send on the caller's loop.

The send-path and attempt tests run every rule with both kinds of adapter
(their modules set ``ADAPTER_KINDS``); these show what is particular to an
async one: where it runs, that concurrent keyed calls overlap on one loop, that
a cancelled send is an uncertainty, and that an async lookup is awaited.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest

import charter
from charter import AttemptStatus, RunStatus
from charter.adapters import Dispatch, Evidence, Outcome
from charter.testing import AsyncRecordingAdapter
from conftest import Principals, default_contract

COSTS = {"write": {"usd": 5_000, "calls": 1}, "read": {"usd": 1_000, "calls": 1}}


def test_A2_an_async_send_is_awaited_on_the_callers_loop_after_its_dispatch_commit(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    adapter = AsyncRecordingAdapter(costs=COSTS)
    seen: dict[str, Any] = {}

    def write(send: Dispatch) -> Outcome:
        seen["status"] = engine.get_attempt(send.attempt_id).status  # committed before the send
        seen["thread"] = threading.get_ident()
        return Outcome.succeeded({"ok": 1}, cost=COSTS["write"])

    adapter.script["write"] = write

    @charter.node
    async def pay(ctx: charter.Context, value: Any) -> Any:
        seen["loop"] = asyncio.get_running_loop()
        seen["node_thread"] = threading.get_ident()
        return await ctx.aattempt(adapter, "write", {"invoice": 1})

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(charter.Plan("pay", (pay,))) == {"ok": 1}

    assert adapter.loops == [seen["loop"]]
    assert seen["thread"] == seen["node_thread"]
    assert seen["status"] is AttemptStatus.DISPATCHED
    (attempt,) = engine.attempts(mission_id=mission)
    assert attempt.status is AttemptStatus.SUCCEEDED
    assert engine.balances(mission)["usd"].spent == 5_000


def test_A2_the_store_commits_around_an_async_send_run_off_the_loop(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """The loop is never blocked by the store: every durable boundary of the
    send path is passed in a worker thread, the send itself on the loop."""
    points: dict[str, int] = {}

    def hook(point: str) -> None:
        points[point] = threading.get_ident()

    config = charter.EngineConfig(credentials=creds[1])
    with charter.Engine.open(store_address, config=config, crash_hook=hook) as engine:
        people = {n: engine.authenticate(c) for n, c in creds[0].items()}
        mission = engine.create_mission(default_contract(), by=people["alice"])
        adapter = AsyncRecordingAdapter(costs=COSTS)
        loop_thread: list[int] = []

        @charter.node
        async def pay(ctx: charter.Context, value: Any) -> Any:
            loop_thread.append(threading.get_ident())
            return await ctx.aattempt(adapter, "write", {"invoice": 1})

        ex = engine.start_run(mission, by=people["agent"], segment_id="seg-1")
        ex.execute(charter.Plan("pay", (pay,)))
    for point in ("admission.before", "dispatch.after", "settlement.before", "settlement.after"):
        assert points[point] != loop_thread[0], point


def test_A6_concurrent_keyed_async_calls_are_awaited_together_on_one_loop(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """Each send waits until the other has started: they can only both finish
    if the loop awaits them at the same time."""
    arrived = {"a": asyncio.Event(), "b": asyncio.Event()}

    class Rendezvous(AsyncRecordingAdapter):
        async def dispatch(self, send: Dispatch) -> Outcome:
            me, other = ("a", "b") if send.request["who"] == "a" else ("b", "a")
            arrived[me].set()
            await asyncio.wait_for(arrived[other].wait(), 5)
            return Outcome.succeeded({"who": me}, cost=COSTS["read"])

    adapter = Rendezvous(costs=COSTS)

    @charter.node
    async def both(ctx: charter.Context, value: Any) -> Any:
        return await asyncio.gather(
            ctx.aattempt(adapter, "read", {"who": "a"}, key="a"),
            ctx.aattempt(adapter, "read", {"who": "b"}, key="b"),
        )

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(charter.Plan("both", (both,))) == [{"who": "a"}, {"who": "b"}]
    assert sorted(a.status.value for a in engine.attempts(mission_id=mission)) == [
        "succeeded",
        "succeeded",
    ]


def test_A3_an_async_send_cancelled_while_awaited_is_unknown_with_its_hold_kept(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    started = threading.Event()

    class Hangs(AsyncRecordingAdapter):
        async def dispatch(self, send: Dispatch) -> Outcome:
            started.set()
            await asyncio.sleep(3600)
            raise AssertionError("never answers")

    adapter = Hangs(costs=COSTS)

    @charter.node
    async def pay(ctx: charter.Context, value: Any) -> Any:
        return await asyncio.wait_for(ctx.aattempt(adapter, "write", {"invoice": 1}), 0.5)

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises((charter.Blocked, TimeoutError)):
        ex.execute(charter.Plan("pay", (pay,)))

    assert started.is_set()
    (attempt,) = engine.attempts(mission_id=mission)
    assert attempt.status is AttemptStatus.UNKNOWN
    assert "cancelled" in (attempt.reason or "")
    assert engine.balances(mission)["usd"].held == 5_000  # L4: the hold stays
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION


def test_R7_an_async_lookup_is_awaited_and_its_evidence_settles_the_attempt(
    make_engine: Callable[..., charter.Engine], who: Principals
) -> None:
    engine = make_engine(evidence_settles="auto")
    who = Principals(who.credentials, who.digests, engine)
    mission = engine.create_mission(default_contract(), by=who.alice)
    adapter = AsyncRecordingAdapter(costs=COSTS)

    def lost(send: Dispatch) -> Outcome:
        raise TimeoutError("the answer was lost")

    adapter.script["write"] = lost
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    unknown = ex.perform(adapter, "write", {"invoice": 1}, effect_key="pay")
    assert unknown.status is AttemptStatus.UNKNOWN
    adapter.evidence[unknown.id] = Evidence.applied(
        Outcome.succeeded({"paid": True}, cost={"usd": 4_000, "calls": 1}, receipt="r-9")
    )

    found = engine.coordinator.reconcile(unknown.id, adapter, by=who.alice)

    assert found.verdict == "applied"
    assert adapter.reconciled == [unknown.id]
    settled = engine.get_attempt(unknown.id)
    assert settled.status is AttemptStatus.SUCCEEDED and settled.receipt == "r-9"
    assert engine.balances(mission)["usd"].spent == 4_000
