"""An OpenAI Agents SDK agent on Charter: it looks an invoice up and pays it.

The agent calls a model (the SDK's OpenAI Responses model, at ``MODEL_URL``)
and two function tools: ``invoice`` (read only) and ``pay``, which pays
through the payments sandbox with the attempt's idempotency key and fencing
token. Each model call and each tool call is an attempt, under an allowance in
USD (micro-dollars) and tokens; the SDK's tracing is off, so nothing leaves
for a tracing service.

Run by ``tests/test_example_agent.py`` across fresh processes: one step is
``python openai_agents_agent.py CONFIG.json`` (the test writes the
configuration), which ``start``\\s a run or ``resume``\\s one as a segment and
prints one JSON line saying how it ended.

Needs ``pip install 'charter[openai-agents,http]'``: the SDK, and httpx, which
the payments sandbox is reached with.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
from agents import Agent, ModelSettings, function_tool, set_tracing_disabled

import charter
from charter import EffectClass, Operation
from charter.integrations.openai_agents import AgentModels, AgentTools, current_dispatch, run
from charter.sandbox import client as sandbox
from charter.testing import kill_at

set_tracing_disabled(True)  # the SDK's traces would go to OpenAI's servers

#: What the invoice tool knows (amounts in micro-dollars).
INVOICES = {"gazette": {"payee": "gazette", "amount": 4_500_000, "reference": "inv-7"}}

CONTRACT = {
    "objective": "Pay the gazette's invoice",
    "principals": {
        "agent": {"run": ["agent-models.*", "tools.*"]},
        "ops": ["approve", "resolve", "run", "stop"],
    },
    "allowance": {"usd": 20_000_000, "input_tokens": 40_000, "output_tokens": 2_000},
    "units": {"usd": {"scale": 6, "name": "USD"}},
}


def tools(payments_url: str) -> AgentTools:
    """The agent's tools as Charter operations (an operator reconciles with these)."""

    @function_tool
    def invoice(payee: str) -> dict[str, Any]:
        """The open invoice of a payee."""
        return INVOICES[payee]

    @function_tool
    async def pay(payee: str, amount: int, reference: str) -> dict[str, Any]:
        """Pay a payee an amount in micro-dollars."""
        send = current_dispatch()  # the attempt: its key and fencing token
        headers = {"Idempotency-Key": send.idempotency_key, "X-Fencing-Token": send.fencing_token}
        body = {"payee": payee, "amount": amount, "currency": "usd", "reference": reference}
        async with httpx.AsyncClient(base_url=payments_url, timeout=5.0) as http:
            answer = await http.post("/v1/payments", json=body, headers=headers)
        answer.raise_for_status()
        paid: dict[str, Any] = answer.json()
        return paid

    def find_payment(attempt: charter.RecordedAttempt) -> charter.Evidence:
        """What became of an uncertain payment: the sandbox looked up by its key."""
        with sandbox.declaration(payments_url, unit="usd").build() as payments:
            return payments.reconcile(attempt)

    return AgentTools(
        [invoice, pay],
        effects={
            "invoice": EffectClass.READ_ONLY,
            "pay": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=86_400),
        },
        costs={"pay": lambda args: {"usd": args["amount"]}},
        lookups={"pay": find_payment},
    )


def build_plan(model_url: str, payments_url: str) -> charter.Plan:
    models = AgentModels(base_url=model_url, api_key="sk-test")
    governed = tools(payments_url)
    agent = Agent(
        name="clerk",
        instructions="Look the payee's invoice up, pay it, and say so.",
        model="gpt-4o-mini",
        model_settings=ModelSettings(max_tokens=200),
        tools=list(governed.tools.values()),
    )

    @charter.node
    async def pay_invoice(ctx: charter.Context, payee: str) -> str:
        result = await run(ctx, agent, f"Pay {payee}'s invoice.", models=models, tools=governed)
        return str(result.final_output)

    return charter.Plan("pay-invoice", (pay_invoice,))


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    hook = kill_at(cfg["kill_at"], cfg["nth"]) if cfg.get("kill_at") else None
    config = charter.EngineConfig(credentials=cfg["digests"])
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        agent = engine.authenticate(cfg["credential"])
        plan = build_plan(cfg["model_url"], cfg["payments_url"])
        if cfg["step"] == "start":
            ex = engine.start_run(cfg["mission"], by=agent, segment_id="seg-1", input="gazette")
        else:
            ex = engine.coordinator.resume(cfg["run"], cfg["segment"], by=agent)
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        try:
            result = ex.execute(plan)
        except charter.Blocked as blocked:
            print(json.dumps({"ended": "blocked", "reason": blocked.reason}), flush=True)
            return 0
        print(json.dumps({"ended": "completed", "result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
