"""A CrewAI crew as a Charter mission: a model, a price lookup, a payment.

One agent, one task: find the survey's price, pay its vendor, say so. The
agent's model is CrewAI's own OpenAI client (``LLM(model=..., base_url=...)``)
inside a :class:`~charter.integrations.crewai_models.CrewModel`, and its tools
go through :class:`~charter.integrations.crewai.CrewTools`
(:mod:`charter.integrations.crewai`):

- every model call is a ``read_only`` attempt ``chat.chat``, priced from its
  usage in micro-dollars and counted in input and output tokens;
- ``quote`` looks a price up: ``read_only``;
- ``pay`` pays through the payments sandbox with the attempt's idempotency key
  and fencing token: ``idempotent_keyed``, its cost the amount paid, and a
  lost call looked up by its key.

Run by ``tests/test_crewai_example.py`` across processes, one step per
process, as ``python crewai_agent.py CONFIG.json`` (the test writes the
configuration: the store, the model's and the sandbox's URLs): start a run, or
resume one (``run``) as a segment; the step prints the run's id, then the
crew's answer. A resumed run starts the crew again, and every call it recorded
is answered from its record.

Needs ``pip install 'charter[crewai,http]'``: CrewAI, and httpx, which the
payments sandbox is reached with.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

# CrewAI's telemetry and tracing leave the machine unless turned off.
os.environ.setdefault("CREWAI_DISABLE_TELEMETRY", "true")
os.environ.setdefault("CREWAI_TRACING_ENABLED", "false")

import httpx
from crewai import LLM, Agent, Crew, Task
from crewai.tools import tool

import charter
from charter import EffectClass, Evidence, Operation, Outcome, RecordedAttempt
from charter.adapters.models import ModelUnits
from charter.integrations.crewai import CrewTools, current_send, kickoff
from charter.integrations.crewai_models import CrewModel
from charter.testing import kill_at

PRICES = {"survey": 12_00}  # in cents
MICROS_PER_CENT = 10_000  # the allowance counts dollars in micro-dollars
MAX_TOKENS = 200

CONTRACT = {
    "objective": "Buy the survey the team needs",
    "principals": {
        "agent": {"run": ["chat.*", "tools.*"]},
        "ops": ["approve", "consume", "resolve", "stop", "run", "raise_limit"],
    },
    "allowance": {"usd": 50_000_000, "input_tokens": 20_000, "output_tokens": 1_000},
    "units": {"usd": {"scale": 6, "name": "USD"}},
}


@tool("quote")
def quote(item: str) -> int:
    """The price of ``item``, in cents."""
    return PRICES[item]


def paying(sandbox_url: str) -> Any:
    """The ``pay`` tool: a payment through the sandbox, with the attempt's key."""

    @tool("pay")
    def pay(payee: str, amount: int, reference: str) -> dict[str, Any]:
        """Pay ``amount`` cents to ``payee``."""
        send = current_send()
        headers = {"Idempotency-Key": send.idempotency_key, "X-Fencing-Token": send.fencing_token}
        body = {"amount": amount, "currency": "usd", "payee": payee, "reference": reference}
        paid = httpx.post(f"{sandbox_url}/v1/payments", json=body, headers=headers)
        paid.raise_for_status()
        payment: dict[str, Any] = paid.json()
        return payment

    return pay


def tools(sandbox_url: str) -> CrewTools:
    """The crew's tools as Charter operations (an operator reconciles with these)."""

    def cost(payment: dict[str, Any]) -> dict[str, int]:
        return {"usd": int(payment["amount"]) * MICROS_PER_CENT}

    def lookup(attempt: RecordedAttempt) -> Evidence:
        """The sandbox by key: a payment it holds, or the proof it holds none."""
        found = httpx.get(f"{sandbox_url}/v1/payments/by-key/{attempt.idempotency_key}")
        if found.status_code == 404:
            return Evidence.not_applied({"lookup": "no payment for this key"})
        found.raise_for_status()
        return Evidence.applied(Outcome.succeeded(found.json(), cost=cost(found.json())))

    return CrewTools(
        [quote, paying(sandbox_url)],
        effects={
            "quote": EffectClass.READ_ONLY,
            "pay": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=86_400),
        },
        costs={"pay": cost},
        lookups={"pay": lookup},
    )


def model(model_url: str) -> CrewModel:
    """CrewAI's OpenAI client, each call an attempt."""
    llm = LLM(
        model="gpt-4o-mini", base_url=model_url, api_key="sk-test", max_tokens=MAX_TOKENS,
        max_retries=0,
    )  # fmt: skip
    return CrewModel(llm, units=ModelUnits())


def build_crew(llm: CrewModel, governed: CrewTools) -> Crew:
    clerk = Agent(
        role="clerk",
        goal="Buy what the team needs, once",
        backstory="You pay the team's vendors.",
        llm=llm,
        tools=governed.tools,
    )
    buy = Task(
        description="Find the {item}'s price, pay the {item} vendor, then say so.",
        expected_output="A sentence saying what was paid.",
        agent=clerk,
    )
    return Crew(agents=[clerk], tasks=[buy])


def build_plan(model_url: str, sandbox_url: str) -> charter.Plan:
    crew = build_crew(model(model_url), tools(sandbox_url))

    @charter.node
    def clerk(ctx: charter.Context, item: str) -> str:
        return str(kickoff(ctx, crew, {"item": item}).raw)

    return charter.Plan("clerk", (clerk,))


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    hook = kill_at(cfg["kill_at"], cfg["nth"]) if cfg.get("kill_at") else None
    config = charter.EngineConfig(credentials=cfg["digests"])
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        me = engine.authenticate(cfg["credential"])
        ex = (
            engine.coordinator.resume(cfg["run"], cfg["segment"], by=me)
            if "run" in cfg
            else engine.start_run(cfg["mission"], by=me, segment_id="seg-1", input=cfg["item"])
        )
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        try:
            result = ex.execute(build_plan(cfg["model_url"], cfg["sandbox_url"]))
        except charter.Blocked as blocked:
            print(json.dumps({"blocked": blocked.reason}), flush=True)
            return 0
        print(json.dumps({"completed": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
