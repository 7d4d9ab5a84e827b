"""A PydanticAI agent as a Charter mission: a model, a price lookup, a payment.

The agent (``clerk``) calls an OpenAI-compatible model and two tools under an
allowance in USD and tokens (:mod:`charter.integrations.pydantic_ai`):

- every model request is a ``read_only`` attempt, priced from its usage in
  micro-dollars and counted in input and output tokens;
- ``quote`` looks a price up: ``read_only``;
- ``pay`` pays through the payments sandbox with the attempt's idempotency key
  and fencing token: ``idempotent_keyed``, its cost the amount paid, and a
  lost call looked up by its key.

Run by ``tests/test_example_pydantic_ai.py`` across processes, one step per
process, as ``python pydantic_ai_agent.py CONFIG.json`` (the test writes the
configuration: the store, the model's and the sandbox's URLs): start a
run, or resume one (``run``) as a segment; the step prints the run's id, then
the agent's answer.

Needs ``pip install 'charter[pydantic-ai,http]'``: PydanticAI with its OpenAI
models, and httpx, which the payments sandbox is reached with.
"""

from __future__ import annotations

import sys
from typing import Any

import _step as step
import httpx
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.models.openai import OpenAIChatModel
from pydantic_ai.providers.openai import OpenAIProvider

import charter
from charter import EffectClass, Evidence, Outcome, RecordedAttempt
from charter.integrations.pydantic_ai import CharterDurability, ToolEffect, current_send, in_node

PRICES = {"survey": 12_00}  # in cents
MICROS_PER_CENT = 10_000  # the allowance counts dollars in micro-dollars
MAX_TOKENS = 200

CONTRACT = {
    "objective": "Buy the survey the team needs",
    "principals": {
        "agent": {"run": ["clerk.*"]},
        "ops": ["approve", "consume", "resolve", "stop", "run", "raise_limit"],
    },
    "allowance": {"usd": 50_000_000, "input_tokens": 20_000, "output_tokens": 1_000},
    "units": {"usd": {"scale": 6, "name": "USD"}},
}


def build_agent(client: AsyncOpenAI, sandbox_url: str) -> Agent[None, str]:
    """The clerk: its model through ``client``, paying through ``sandbox_url``."""

    def cost(payment: dict[str, Any]) -> dict[str, int]:
        return {"usd": int(payment["amount"]) * MICROS_PER_CENT}

    def lookup(attempt: RecordedAttempt) -> Evidence:
        """The sandbox by key: a payment it holds, or the proof it holds none."""
        found = httpx.get(f"{sandbox_url}/v1/payments/by-key/{attempt.idempotency_key}")
        if found.status_code == 404:
            return Evidence.not_applied({"lookup": "no payment for this key"})
        found.raise_for_status()
        return Evidence.applied(Outcome.succeeded(found.json(), cost=cost(found.json())))

    durability = CharterDurability(
        tools={
            "quote": ToolEffect(EffectClass.READ_ONLY),
            "pay": ToolEffect(
                EffectClass.IDEMPOTENT_KEYED,
                dedupe_window_seconds=86_400,
                estimate=lambda args: {"usd": int(args["amount"]) * MICROS_PER_CENT},
                cost=cost,
                lookup=lookup,
            ),
        }
    )
    model = OpenAIChatModel("gpt-4o-mini", provider=OpenAIProvider(openai_client=client))
    agent = Agent(
        model,
        name="clerk",
        capabilities=[durability],
        model_settings={"max_tokens": MAX_TOKENS},
        instructions="Find the survey's price, pay the survey vendor, then say so.",
    )

    @agent.tool_plain
    def quote(item: str) -> int:
        """The price of ``item``, in cents."""
        return PRICES[item]

    @agent.tool_plain
    async def pay(payee: str, amount: int, reference: str) -> dict[str, Any]:
        """Pay ``amount`` cents to ``payee``."""
        send = current_send()
        headers = {"Idempotency-Key": send.idempotency_key, "X-Fencing-Token": send.fencing_token}
        body = {"amount": amount, "currency": "usd", "payee": payee, "reference": reference}
        async with httpx.AsyncClient() as http:
            paid = await http.post(f"{sandbox_url}/v1/payments", json=body, headers=headers)
        paid.raise_for_status()
        payment: dict[str, Any] = paid.json()
        return payment

    return agent


def build_plan(model_url: str, sandbox_url: str) -> charter.Plan:
    @charter.node
    async def clerk(ctx: charter.Context, task: str) -> str:
        # The client's connections belong to this node's event loop: opened and closed here.
        async with AsyncOpenAI(base_url=model_url, api_key="sk-test") as client:
            agent = build_agent(client, sandbox_url)
            with in_node(ctx):
                done = await agent.run(task)
        return done.output

    return charter.Plan("clerk", (clerk,))


if __name__ == "__main__":
    sys.exit(step.main(sys.argv[1:], build_plan))
