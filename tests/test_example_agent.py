"""The OpenAI Agents SDK example (examples/openai_agents_agent.py) across fresh
processes, killed once its payment was applied (A4, A8, R1-R4).

The first process runs the agent and is SIGKILLed when the paying tool's
answer is in (the sandbox applied the payment) and before its settlement
commits. Recovery takes the dead owner's run over; the uncertain payment is
settled by looking its key up at the sandbox. A fresh process resumes: the
model calls and the tool calls already recorded are replayed, not made again,
and the agent finishes. The sandbox took the payment once, the provider billed
each model call once, and the ledger holds exactly what both took.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

import charter
from _examples import run_step
from _fake_models import INVOICE, FakeProvider, pay_invoice_script
from charter import AttemptStatus
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing
from charter.integrations.openai_agents import AgentModels
from charter.sandbox import Sandbox
from charter.testing import credential

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "openai_agents_agent.py"
sys.path.insert(0, str(EXAMPLE.parent))
import openai_agents_agent as example  # noqa: E402 - the example, once examples/ is on the path


def step(cfg: dict[str, Any], tmp: Path, **how: Any) -> tuple[int, list[dict[str, Any]]]:
    return run_step(EXAMPLE, cfg, tmp, **how)


World = tuple[charter.Engine, Sandbox, FakeProvider, charter.Principal, str, dict[str, Any]]


@contextmanager
def world(store_address: str, tmp_path: Path) -> Iterator[World]:
    """An engine on the test's store, the sandbox and the fake provider running,
    ``ops`` and a mission under the example's contract; and the configuration
    each process of the example is given (as the agent)."""
    pairs = {name: credential(name) for name in ("agent", "ops")}
    digests = {n: d for n, (_, d) in pairs.items()}
    config = charter.EngineConfig(credentials=digests)
    with (
        charter.Engine.open(store_address, config=config) as engine,
        Sandbox(tmp_path / "sandbox.db") as box,
        FakeProvider(script=pay_invoice_script) as provider,
    ):
        ops = engine.authenticate(pairs["ops"][0])
        mission = engine.create_mission(example.CONTRACT, by=ops)
        cfg = {
            "store": store_address,
            "digests": digests,
            "credential": pairs["agent"][0],
            "mission": mission,
            "model_url": provider.url + "/v1",
            "payments_url": box.url,
        }
        yield engine, box, provider, ops, mission, cfg


@pytest.mark.crash
def test_A4_A8_the_agent_killed_after_its_payment_resumes_without_paying_or_billing_twice(
    store_address: str, tmp_path: Path
) -> None:
    with world(store_address, tmp_path) as (engine, box, provider, ops, mission, cfg):
        # 1. Killed once the paying tool answered: settlements of model call 1,
        # the invoice, model call 2, then the payment's, which never commits.
        code, out = step(cfg, tmp_path, step="start", kill_at="settlement.before", nth=4)
        assert code == -signal.SIGKILL
        run_id = out[0]["run_id"]
        assert len(box.payments()) == 1  # the target applied it
        [pay] = [a for a in engine.attempts(run_id=run_id) if a.scope == "tools.pay"]
        assert pay.status is AttemptStatus.DISPATCHED

        # 2. The dead owner's run is taken over; the payment is found by its key.
        _, unresolved = engine.coordinator.recover(run_id, "seg-2")
        assert unresolved == [pay.id]
        evidence = engine.coordinator.reconcile(pay.id, example.tools(box.url), by=ops)
        assert evidence.conclusive
        engine.coordinator.confirm(pay.id, by=ops)

        # 3. A fresh process resumes: what was recorded is replayed, the rest made.
        _, out = step(cfg, tmp_path, step="resume", run=run_id, segment="seg-2")
        assert out[-1] == {"ended": "completed", "result": "Paid inv-7."}

        assert engine.run(run_id).status is charter.RunStatus.COMPLETED
        [paid] = box.payments()
        assert (paid["amount"], paid["idempotency_key"]) == (INVOICE["amount"], pay.idempotency_key)
        models = [a for a in engine.attempts(run_id=run_id) if a.adapter == "agent-models"]
        assert len(models) == 3 and all(a.status is AttemptStatus.SUCCEEDED for a in models)
        # each model call was billed once, under its attempt's key
        assert sorted(provider.keys()) == sorted(a.idempotency_key for a in models)
        pricing = Pricing("openai", ModelUnits())
        billed = sum(pricing.amounts(Usage(**b))["usd"] for b in provider.billed.values())
        balances = engine.balances(mission)
        assert balances["usd"].spent == billed + paid["amount"]
        assert balances["input_tokens"].spent == sum(
            b["input_tokens"] for b in provider.billed.values()
        )
        assert balances["usd"].held == 0
        assert engine.check_ledger(mission) == []
        assert all(v.ok for v in engine.verify_audit(mission))


@pytest.mark.crash
def test_N6_a_model_call_lost_in_a_crash_and_settled_by_its_usage_is_made_again(
    store_address: str, tmp_path: Path
) -> None:
    """Killed before the first model call's settlement: the provider billed it
    and its answer is gone. The usage lookup settles it (what was billed, not
    what was said), so the resumed agent asks again as a new attempt linked to
    the settled one, and finishes."""
    with world(store_address, tmp_path) as (engine, box, provider, ops, mission, cfg):
        code, out = step(cfg, tmp_path, step="start", kill_at="settlement.before", nth=1)
        assert code == -signal.SIGKILL
        run_id = out[0]["run_id"]
        [lost] = engine.attempts(run_id=run_id)
        engine.coordinator.recover(run_id, "seg-2")
        models = AgentModels(
            base_url=provider.url + "/v1", api_key="sk-test", lookup=provider.lookup
        )
        assert engine.coordinator.reconcile(lost.id, models, by=ops).conclusive
        assert engine.coordinator.confirm(lost.id, by=ops).result is None

        _, out = step(cfg, tmp_path, step="resume", run=run_id, segment="seg-2")
        assert out[-1] == {"ended": "completed", "result": "Paid inv-7."}

        calls = [a for a in engine.attempts(run_id=run_id) if a.adapter == "agent-models"]
        [again] = [a for a in calls if a.retry_of == lost.id]
        assert (again.generation, again.status, again.effect_key) == (
            2,
            AttemptStatus.SUCCEEDED,
            lost.effect_key,
        )
        assert len(calls) == 4 and len(box.payments()) == 1
        assert sorted(provider.keys()) == sorted(a.idempotency_key for a in calls)
        pricing = Pricing("openai", ModelUnits())
        billed = sum(pricing.amounts(Usage(**b))["usd"] for b in provider.billed.values())
        assert engine.balances(mission)["usd"].spent == billed + INVOICE["amount"]
        assert engine.check_ledger(mission) == []
