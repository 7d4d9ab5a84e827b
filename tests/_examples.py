"""Running an example script as one step of a mission, in a fresh process."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import charter
from _fake_models import FakeProvider
from charter import AttemptStatus
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing
from charter.sandbox import Sandbox
from charter.testing import credential


def run_step(
    example: Path, cfg: dict[str, Any], tmp: Path, **how: Any
) -> tuple[int, list[dict[str, Any]]]:
    """Run ``example`` on ``cfg`` updated with ``how``: its exit code (0, or
    killed by its crash hook) and the JSON lines it printed."""
    path = tmp / f"step-{len(list(tmp.glob('step-*')))}.json"
    path.write_text(json.dumps({**cfg, **how}))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run(
        [sys.executable, str(example), str(path)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.returncode in (0, -signal.SIGKILL), done.stderr
    return done.returncode, [json.loads(line) for line in done.stdout.splitlines()]


@dataclass
class World:
    """An example agent's surroundings: the engine, the sandbox, the fake
    provider, the operator, the mission, and the configuration a step reads."""

    engine: charter.Engine
    box: Sandbox
    provider: FakeProvider
    ops: charter.Principal
    mission: str
    cfg: dict[str, Any]


@contextmanager
def agent_world(
    store_address: str, tmp: Path, contract: dict[str, Any], chat: Callable[..., Any]
) -> Iterator[World]:
    """A mission on ``contract`` for an agent asked to buy the survey, its model
    answered by ``chat`` (see ``_agent_turns.py``) and its payments by the sandbox."""
    pairs = {name: credential(name) for name in ("agent", "ops")}
    config = charter.EngineConfig(credentials={n: d for n, (_, d) in pairs.items()})
    with (
        charter.Engine.open(store_address, config=config) as engine,
        Sandbox(tmp / "sandbox.db") as box,
        FakeProvider(chat=chat) as provider,
    ):
        ops = engine.authenticate(pairs["ops"][0])
        mission = engine.create_mission(contract, by=ops)
        cfg = {
            "store": store_address,
            "digests": config.credentials,
            "credential": pairs["agent"][0],
            "model_url": f"{provider.url}/v1",
            "sandbox_url": box.url,
            "mission": mission,
            "task": "Buy the survey.",
        }
        yield World(engine, box, provider, ops, mission, cfg)


def killed_after_paying(example: Path, world: World, tmp: Path) -> tuple[str, Any]:
    """Start the agent's run and kill it once the sandbox applied the payment,
    before its settlement committed: the 4th attempt to settle (a model call,
    the quote, a model call, the payment). The run's id and the payment's
    attempt, still DISPATCHED, the sandbox holding it under the attempt's key."""
    code, out = run_step(example, world.cfg, tmp, kill_at="settlement.before", nth=4)
    assert code == -signal.SIGKILL
    run_id = out[0]["run_id"]
    [pay] = [a for a in world.engine.attempts(run_id=run_id) if a.operation == "pay"]
    assert pay.status is AttemptStatus.DISPATCHED
    assert [p["idempotency_key"] for p in world.box.payments()] == [pay.idempotency_key]
    assert len(world.provider.received) == 2
    return run_id, pay


def paid_once_billed_once(
    world: World, run_id: str, model_op: str, tools: dict[str, int], micros_per_cent: int
) -> None:
    """The resumed run completed with every attempt succeeded: the sandbox holds
    one payment, each model call was billed once under its own key, and the
    mission spent what the provider billed plus what the sandbox took."""
    engine, provider = world.engine, world.provider
    assert engine.run(run_id).status is charter.RunStatus.COMPLETED
    attempts = engine.attempts(run_id=run_id)
    assert Counter(a.operation for a in attempts) == {model_op: 3, **tools}
    assert all(a.status is AttemptStatus.SUCCEEDED for a in attempts)
    assert len(world.box.payments()) == 1  # paid once
    keys = Counter(provider.keys())
    models = {a.idempotency_key for a in attempts if a.operation == model_op}
    assert set(keys) == models and set(keys.values()) == {1}  # each call billed once
    pricing = Pricing("openai", ModelUnits())
    billed = sum(pricing.amounts(Usage(**u))["usd"] for u in provider.billed.values())
    paid = sum(p["amount"] for p in world.box.payments()) * micros_per_cent
    assert engine.balances(world.mission)["usd"].spent == billed + paid
    assert engine.check_ledger(world.mission) == []
