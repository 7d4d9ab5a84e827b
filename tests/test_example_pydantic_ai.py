"""The example PydanticAI agent (examples/pydantic_ai_agent.py) killed after its
payment was applied and before its settlement committed, then recovered in a
fresh process (A4, A6, R1-R4).

The sandbox holds the payment once; the fake provider billed each model
request once, the resumed run having replayed the recorded ones; the ledger
is what the provider billed plus what the sandbox took.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

import charter
from _agent_turns import clerk_turns
from _examples import agent_world, killed_after_paying, paid_once_billed_once, run_step
from charter import AttemptStatus
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing
from charter.integrations.pydantic_ai import AgentAdapter, CharterDurability

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "pydantic_ai_agent.py"
sys.path.insert(0, str(EXAMPLE.parent))
import pydantic_ai_agent as example  # noqa: E402 - the example, importable once examples/ is on the path


def step(cfg: dict[str, Any], tmp: Path, **how: Any) -> tuple[int, list[dict[str, Any]]]:
    return run_step(EXAMPLE, cfg, tmp, **how)


@pytest.mark.crash
def test_A4_A6_R4_the_agent_killed_after_paying_is_recovered_and_pays_once(
    store_address: str, tmp_path: Path
) -> None:
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        engine, box, ops, cfg = world.engine, world.box, world.ops, world.cfg
        # 1. Killed once the sandbox applied the payment, before its settlement committed.
        run_id, pay = killed_after_paying(EXAMPLE, world, tmp_path)

        # 2. The dead owner is taken over; the payment is found by its key.
        _, unresolved = engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == [pay.id]
        async_client = AsyncOpenAI(base_url=cfg["model_url"], api_key="sk-test")
        durability = CharterDurability.from_agent(example.build_agent(async_client, box.url))
        assert durability is not None
        assert engine.coordinator.reconcile(pay.id, durability.adapter, by=ops).conclusive
        engine.coordinator.confirm(pay.id, by=ops)

        # 3. A fresh process resumes: the recorded calls come back, the last request is made.
        _, out = step(cfg, tmp_path, run=run_id, segment="seg-2")
        assert out[-1] == {"completed": "Paid the survey vendor."}

        paid_once_billed_once(
            world, run_id, "model_request", {"quote": 1, "pay": 1}, example.MICROS_PER_CENT
        )


@pytest.mark.crash
def test_A6_item20_a_crash_replay_compares_each_request_with_its_record(
    store_address: str, tmp_path: Path
) -> None:
    """The recorded requests are compared with the replayed ones: killed after
    paying and resumed in the next second by a fresh process whose agent has
    one more instruction, the first model request it replays asks for something
    else than recorded. That is a non-determinism error: nothing is sent, the
    run needs a person. (Resumed unchanged, the same replay completes: the
    test above.)"""
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        engine, ops, cfg = world.engine, world.ops, world.cfg
        run_id, pay = killed_after_paying(EXAMPLE, world, tmp_path)
        engine.coordinator.recover(run_id, "seg-2")
        async_client = AsyncOpenAI(base_url=cfg["model_url"], api_key="sk-test")
        durability = CharterDurability.from_agent(example.build_agent(async_client, world.box.url))
        assert durability is not None
        assert engine.coordinator.reconcile(pay.id, durability.adapter, by=ops).conclusive
        engine.coordinator.confirm(pay.id, by=ops)
        before = engine.attempts(run_id=run_id)

        time.sleep(1.01 - time.time() % 1)  # the clock's next second
        config = tmp_path / "changed.json"
        config.write_text(json.dumps({**cfg, "run": run_id, "segment": "seg-2"}))
        done = subprocess.run(
            [sys.executable, str(ROOT / "tests" / "_changed_example.py"), str(config)],
            capture_output=True,
            text=True,
            timeout=120,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            check=False,
        )

        assert done.returncode == 1 and "NonDeterminismError" in done.stderr, done.stderr
        [first] = [a for a in before if a.effect_key.endswith("/model/1")]
        assert f"(attempt {first.id})" in done.stderr
        assert engine.run(run_id).status is charter.RunStatus.NEEDS_INTERVENTION
        assert engine.attempts(run_id=run_id) == before  # nothing admitted, nothing sent
        assert len(world.provider.received) == 2 and len(world.box.payments()) == 1


@pytest.mark.crash
def test_N6_a_model_request_lost_in_a_crash_and_settled_by_its_usage_is_asked_again(
    store_address: str, tmp_path: Path
) -> None:
    """The first model request was billed and its answer died with the process.
    The provider's usage lookup settles it (the usage is all it proves), so the
    resumed node asks the model again, as a new attempt linked to the settled
    one and admitted against the allowance, and the agent goes on."""
    with agent_world(store_address, tmp_path, example.CONTRACT, clerk_turns) as world:
        engine, ops, cfg = world.engine, world.ops, world.cfg
        code, out = step(cfg, tmp_path, kill_at="settlement.before", nth=1)
        assert code == -signal.SIGKILL
        run_id = out[0]["run_id"]
        [lost] = engine.attempts(run_id=run_id)
        assert lost.operation == "model_request" and len(world.provider.received) == 1

        engine.coordinator.recover(run_id, "seg-2")
        durability = CharterDurability.from_agent(
            example.build_agent(AsyncOpenAI(api_key="sk-test"), world.box.url)
        )
        assert durability is not None
        adapter = AgentAdapter("clerk", durability.tools, durability.units, world.provider.lookup)
        assert engine.coordinator.reconcile(lost.id, adapter, by=ops).conclusive
        settled = engine.coordinator.confirm(lost.id, by=ops)
        assert (settled.status, settled.result) == (AttemptStatus.SUCCEEDED, None)

        _, out = step(cfg, tmp_path, run=run_id, segment="seg-2")
        assert out[-1] == {"completed": "Paid the survey vendor."}

        attempts = engine.attempts(run_id=run_id)
        [again] = [a for a in attempts if a.retry_of == lost.id]
        assert (again.operation, again.generation, again.status) == (
            "model_request",
            2,
            AttemptStatus.SUCCEEDED,
        )
        assert again.request_hash == lost.request_hash and again.answered
        models = [a for a in attempts if a.operation == "model_request"]
        assert len(models) == 4 and len(world.box.payments()) == 1
        # every request the provider billed, the lost one included, is spent once
        assert sorted(world.provider.keys()) == sorted(a.idempotency_key for a in models)
        pricing = Pricing("openai", ModelUnits())
        billed = sum(pricing.amounts(Usage(**u))["usd"] for u in world.provider.billed.values())
        paid = world.box.payments()[0]["amount"] * example.MICROS_PER_CENT
        assert engine.balances(world.mission)["usd"].spent == billed + paid
        assert engine.check_ledger(world.mission) == []


WRITE_OFF = {**example.CONTRACT, "read_only_unknown": "write_off"}


@pytest.mark.crash
def test_A7_L9_recover_writes_off_a_read_only_call_its_dead_owner_left_under_the_opt_in(
    store_address: str, tmp_path: Path
) -> None:
    """The contract writes off a read-only UNKNOWN at its full hold (A7's
    opt-in). A model request whose owner died is made UNKNOWN by recovery, and
    recovery applies the same rule there, audited: nothing is left to block
    the resume, and the resumed node asks the model again as a linked attempt."""
    with agent_world(store_address, tmp_path, WRITE_OFF, clerk_turns) as world:
        engine, cfg = world.engine, world.cfg
        code, out = step(cfg, tmp_path, kill_at="settlement.before", nth=1)
        assert code == -signal.SIGKILL
        run_id = out[0]["run_id"]
        [lost] = engine.attempts(run_id=run_id)
        assert (lost.operation, lost.status) == ("model_request", AttemptStatus.DISPATCHED)

        state, unresolved = engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == []
        written = engine.get_attempt(lost.id)
        assert (written.status, written.actual) == (AttemptStatus.WRITTEN_OFF, lost.estimate)
        [event] = [
            e
            for e in engine.audit_events(world.mission)
            if e["kind"] == "attempt.settled" and e["entity"] == lost.id
        ]
        assert (event["actor"], event["epoch"], event["after"]) == (
            "engine:read_only_policy",
            state.epoch,
            "written_off",
        )
        assert engine.run(run_id).status is not charter.RunStatus.NEEDS_INTERVENTION

        _, out = step(cfg, tmp_path, run=run_id, segment="seg-2")
        assert out[-1] == {"completed": "Paid the survey vendor."}
        [again] = [a for a in engine.attempts(run_id=run_id) if a.retry_of == lost.id]
        assert (again.generation, again.status) == (2, AttemptStatus.SUCCEEDED)
        usd = engine.balances(world.mission)["usd"]
        assert usd.held == 0 and engine.check_ledger(world.mission) == []


@pytest.mark.crash
def test_A7_recover_never_writes_off_a_payment_under_the_read_only_opt_in(
    store_address: str, tmp_path: Path
) -> None:
    with agent_world(store_address, tmp_path, WRITE_OFF, clerk_turns) as world:
        run_id, pay = killed_after_paying(EXAMPLE, world, tmp_path)
        _, unresolved = world.engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == [pay.id]
        assert world.engine.get_attempt(pay.id).status is AttemptStatus.UNKNOWN
