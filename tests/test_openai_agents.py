"""The OpenAI Agents SDK on Charter: model and tool calls as attempts (A1-A7).

An agent of the SDK, with the SDK's own Responses model, talks to the loopback
fake provider (tests/_fake_models.py), which plays an agent's turns: look the
invoice up, pay it, say so. The paying tool pays through the payments sandbox.
Checked against what the provider received and billed and what the sandbox
took.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agents import Agent, ModelSettings, function_tool

import charter
from _fake_models import INVOICE, FakeProvider, function_call, pay_invoice_script
from charter import AttemptStatus, EffectClass, Operation
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing
from charter.integrations.openai_agents import AgentModels, AgentTools, run
from charter.sandbox import Sandbox
from conftest import Principals, stored

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import openai_agents_agent as example  # noqa: E402 - the example, once examples/ is on the path


def mission(engine: charter.Engine, who: Principals, **changes: Any) -> str:
    contract = {**example.CONTRACT, **changes}
    contract["principals"] = {
        "agent": {"run": ["agent-models.*", "tools.*"]},
        "alice": ["approve", "resolve", "run", "stop"],
    }
    return engine.create_mission(contract, by=who.alice)


def billed_usd(provider: FakeProvider) -> int:
    """What the provider billed, priced as the adapters price it."""
    pricing = Pricing("openai", ModelUnits())
    return sum(pricing.amounts(Usage(**b))["usd"] for b in provider.billed.values())


def test_A1_A7_an_agents_model_and_tool_calls_are_attempts_priced_and_sent_once(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    m = mission(engine, who)
    plan = example.build_plan(provider.url + "/v1", box.url)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")

    assert ex.execute(plan) == "Paid inv-7."

    attempts = {a.effect_key: a for a in engine.attempts(run_id=ex.run_id)}
    assert {k: (a.scope, a.effect_class, a.status) for k, a in attempts.items()} == {
        "k:clerk:model:1": ("agent-models.responses", "read_only", AttemptStatus.SUCCEEDED),
        "k:clerk:tool:call_invoice": ("tools.invoice", "read_only", AttemptStatus.SUCCEEDED),
        "k:clerk:model:2": ("agent-models.responses", "read_only", AttemptStatus.SUCCEEDED),
        "k:clerk:tool:call_pay": ("tools.pay", "idempotent_keyed", AttemptStatus.SUCCEEDED),
        "k:clerk:model:3": ("agent-models.responses", "read_only", AttemptStatus.SUCCEEDED),
    }
    models = [attempts[f"k:clerk:model:{n}"] for n in (1, 2, 3)]
    # each request carried its attempt's own key, and the SDK's retries were off
    assert provider.keys() == [a.idempotency_key for a in models]
    assert all(a.price_source.startswith("genai-prices ") for a in models if a.price_source)
    assert all(a.estimate["output_tokens"] == 200 for a in models)
    assert all(a.actual == {**a.actual, "input_tokens": 12, "output_tokens": 7} for a in models)
    [paid] = box.payments()
    assert (paid["amount"], paid["payee"]) == (INVOICE["amount"], "gazette")
    pay = attempts["k:clerk:tool:call_pay"]
    assert paid["idempotency_key"] == pay.idempotency_key  # the tool sent the attempt's key
    balances = engine.balances(m)
    assert balances["usd"].spent == billed_usd(provider) + paid["amount"]
    assert balances["input_tokens"].spent == 3 * 12
    assert balances["output_tokens"].spent == 3 * 7
    assert engine.check_ledger(m) == []


def test_A6_item20_the_same_conversation_records_the_same_requests_whenever_it_is_made(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    """The SDK hands the model its earlier answers with the provider's own ids
    in them (a real provider's differ in every answer, as the fake's do), and
    each release may add fields to them or settings to ``ModelSettings``. None
    of it is recorded: the conversation, made again in the next second through
    another address, records the same requests field for field; only what the
    payment returned, which the model is shown, differs."""
    m = mission(engine, who)
    runs = []
    with FakeProvider(script=pay_invoice_script) as elsewhere:
        for url in (provider.url, elsewhere.url):
            time.sleep(1.01 - time.time() % 1)  # the clock's next second
            ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")
            assert ex.execute(example.build_plan(url + "/v1", box.url)) == "Paid inv-7."
            models = [a for a in engine.attempts(run_id=ex.run_id) if a.adapter == "agent-models"]
            runs.append(sorted(models, key=lambda a: a.effect_key))

    (one, two, three), (one_again, two_again, three_again) = runs
    assert (one.request, one.request_hash) == (one_again.request, one_again.request_hash)
    assert (two.request, two.request_hash) == (two_again.request, two_again.request_hash)
    paid = [three.request["input"].pop(), three_again.request["input"].pop()]
    assert three.request == three_again.request and paid[0] != paid[1]
    # What is recorded: the model, its instructions, each input item as the
    # model is shown it, the tools' definitions, and the settings that change
    # the answer.
    lookup = {"payee": "gazette"}
    assert two.request == {
        "model": "gpt-4o-mini",
        "instructions": "Look the payee's invoice up, pay it, and say so.",
        "input": [
            {"role": "user", "content": "Pay gazette's invoice."},
            {
                "type": "function_call",
                "call_id": "call_invoice",
                "name": "invoice",
                "arguments": json.dumps(lookup),
            },
            {
                "type": "function_call_output",
                "call_id": "call_invoice",
                "output": "{'amount': 4500000, 'payee': 'gazette', 'reference': 'inv-7'}",
            },
        ],
        "tools": [
            {"name": t["name"], "description": t["description"], "parameters": t["parameters"]}
            for t in two.request["tools"]
        ],
        "handoffs": [],
        "output_schema": None,
        "settings": {"max_tokens": 200},
        "max_output_tokens": 200,
        "previous_response_id": None,
        "conversation_id": None,
    }
    assert [t["name"] for t in two.request["tools"]] == ["invoice", "pay"]


def test_W2_a_tool_that_needs_approval_waits_as_a_charter_approval(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    m = mission(engine, who, approvals={"required": ["tools.pay"], "ttl_seconds": 3600})
    plan = example.build_plan(provider.url + "/v1", box.url)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")

    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.WAITING
    assert box.payments() == []
    [approval] = engine.approvals(run_id=ex.run_id, pending=True)
    assert approval.scope == "tools.pay"
    engine.approve(approval.id, by=who.alice)

    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert resumed.execute(plan) == "Paid inv-7."
    assert len(box.payments()) == 1
    # the two model calls before the wait were replayed, not made again
    assert len(provider.received) == 3
    assert len(set(provider.keys())) == 3


def test_A6_tools_without_an_effect_class_or_with_the_sdks_approval_are_refused() -> None:
    @function_tool
    def lookup(city: str) -> str:
        """Weather."""
        return city

    @function_tool(needs_approval=True)
    def send(to: str) -> str:
        """Send."""
        return to

    with pytest.raises(charter.ConfigError, match="no effect class"):
        AgentTools([lookup], effects={})
    with pytest.raises(charter.ConfigError, match=r"approvals\.required"):
        AgentTools([send], effects={"send": EffectClass.UNSAFE})


def test_A1_an_agent_with_an_undeclared_tool_or_its_own_model_is_refused_before_any_call(
    engine: charter.Engine, who: Principals, provider: FakeProvider
) -> None:
    @function_tool
    def lookup(city: str) -> str:
        """Weather."""
        return city

    tools = AgentTools([], effects={})
    models = AgentModels(base_url=provider.url + "/v1", api_key="sk-test")
    settings = ModelSettings(max_tokens=50)
    stray = Agent(name="a", model="gpt-4o-mini", model_settings=settings, tools=[lookup])

    @charter.node
    async def go(ctx: charter.Context, _: Any) -> str:
        result = await run(ctx, stray, "hi", models=models, tools=tools)
        return str(result.final_output)

    m = mission(engine, who)
    before = stored(engine, m, runs=False)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked) as blocked:  # the node's error, kept for a person (N6)
        ex.execute(charter.Plan("p", (go,)))
    assert isinstance(blocked.value.__cause__, charter.ConfigError)
    assert "does not govern" in blocked.value.__cause__.message
    assert stored(engine, m, runs=False)["attempts"] == before["attempts"] == []
    assert provider.received == []


def test_openai_agents_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "agents", None)
    monkeypatch.delitem(sys.modules, "charter.integrations.openai_agents")
    with pytest.raises(charter.MissingExtra) as missing:
        importlib.import_module("charter.integrations.openai_agents")
    assert missing.value.details["extra"] == "openai-agents"
    assert "charter[openai-agents]" in missing.value.message


def one_call(tool: str) -> Callable[[str, Any], list[dict[str, Any]]]:
    """An agent's turns: call ``tool`` once, then say what it was shown."""

    def script(kind: str, body: Any) -> list[dict[str, Any]]:
        done = [i for i in body["input"] if i.get("type") == "function_call_output"]
        if not done:
            return [function_call("call_1", tool, {"payee": "gazette"})]
        text = f"shown: {done[0]['output']}"
        content = [{"type": "output_text", "text": text, "annotations": []}]
        return [
            {
                "type": "message",
                "id": "m",
                "status": "completed",
                "role": "assistant",
                "content": content,
            }
        ]

    return script


def clerk_plan(fake: FakeProvider, tools: AgentTools, prompt: str) -> charter.Plan:
    """A plan of one node running the agent ``clerk``, whose model is ``fake``'s
    and whose tools are ``tools``, on ``prompt``."""
    models = AgentModels(base_url=fake.url + "/v1", api_key="sk-test")
    agent = Agent(
        name="clerk",
        model="gpt-4o-mini",
        model_settings=ModelSettings(max_tokens=50),
        tools=list(tools.tools.values()),
    )

    @charter.node
    async def go(ctx: charter.Context, _: Any) -> str:
        return str((await run(ctx, agent, prompt, models=models, tools=tools)).final_output)

    return charter.Plan("p", (go,))


@pytest.mark.parametrize(
    ("effect", "status"),
    [
        (EffectClass.READ_ONLY, AttemptStatus.FAILED),
        (EffectClass.UNSAFE, AttemptStatus.UNKNOWN),
        (Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=60), AttemptStatus.UNKNOWN),
    ],
)
def test_A3_a_tools_error_is_read_by_the_one_rule_failed_only_for_a_read_only_tool(
    engine: charter.Engine, who: Principals, effect: EffectClass | Operation, status: AttemptStatus
) -> None:
    """A tool that raised may have acted first: its call is UNKNOWN unless the
    tool is ``read_only``, whose call settles FAILED and whose error the model
    is told as the SDK tells it (the SDK's message, recorded)."""
    calls: list[str] = []

    @function_tool
    def lookup(payee: str) -> str:
        """Look a payee up."""
        calls.append(payee)
        raise RuntimeError("the registry is down")

    tools = AgentTools([lookup], effects={"lookup": effect})
    with FakeProvider(script=one_call("lookup")) as fake:
        plan = clerk_plan(fake, tools, "look")
        m = mission(engine, who)
        ex = engine.start_run(m, by=who.agent, segment_id="seg-1")
        if status is AttemptStatus.FAILED:
            assert (
                ex.execute(plan)
                == "shown: An error occurred while running the tool. Please try again."
            )
            assert len(fake.received) == 2
        else:
            with pytest.raises(charter.Blocked):
                ex.execute(plan)
            assert len(fake.received) == 1  # the model is told nothing on a guess
    [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "lookup"]
    assert call.status is status and calls == ["gazette"]
    if status is AttemptStatus.FAILED:
        assert call.actual == {} and "the registry is down" in call.result["error"]
    else:
        [kept] = engine.evidence(call.id)
        assert "the registry is down" in kept["detail"]


def test_R8_a_model_calls_result_is_checked_against_the_sdks_response_at_resolve(
    engine: charter.Engine, who: Principals, box: Sandbox
) -> None:
    """Given the adapter, ``resolve`` refuses (typed, nothing written) a model
    call's result the agent run could not read back; a model response passes,
    and resolving without a result lets the replay ask again (N6)."""
    with FakeProvider(script=pay_invoice_script, faults=["500_after_billing"]) as fake:
        m = mission(engine, who)
        plan = example.build_plan(fake.url + "/v1", box.url)
        ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")
        with pytest.raises(charter.Blocked):
            ex.execute(plan)
        [lost] = engine.attempts(run_id=ex.run_id)
        models = AgentModels(base_url=fake.url + "/v1", api_key="sk-test")
        before = stored(engine, m)
        with pytest.raises(charter.UsageError, match="model response"):
            engine.coordinator.resolve(
                lost.id,
                by=who.alice,
                outcome="succeeded",
                evidence="seen in the provider's console",
                result="Paid.",
                adapter=models,
            )
        assert stored(engine, m) == before
        engine.coordinator.resolve(
            lost.id, by=who.alice, outcome="succeeded", evidence="billed", adapter=models
        )
        resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
        assert resumed.execute(plan) == "Paid inv-7."
    calls = [a for a in engine.attempts(run_id=ex.run_id) if a.adapter == "agent-models"]
    assert [a.retry_of for a in calls if a.retry_of] == [lost.id]


def test_N6_a_tool_call_resolved_without_its_answer_stops_the_node_and_tells_the_model_nothing(
    engine: charter.Engine, who: Principals
) -> None:
    """The tool acted and its answer was lost; a person confirmed it without
    saying what it returned. The model is not told anything made up (not even
    an error, which would invite it to call again): the node stops with
    AnswerNotRecorded for a person, and the tool is not called again."""
    calls: list[str] = []

    @function_tool
    def lookup(payee: str) -> str:
        """Pay a payee."""
        calls.append(payee)
        if len(calls) == 1:
            raise RuntimeError("connection reset after the bank took it")
        return "paid"

    tools = AgentTools([lookup], effects={"lookup": EffectClass.UNSAFE})
    with FakeProvider(script=one_call("lookup")) as fake:
        plan = clerk_plan(fake, tools, "pay")
        m = mission(engine, who)
        ex = engine.start_run(m, by=who.agent, segment_id="seg-1")
        with pytest.raises(charter.Blocked):
            ex.execute(plan)
        [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "lookup"]
        engine.coordinator.resolve(call.id, by=who.alice, outcome="succeeded", evidence="bank")

        resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
        with pytest.raises(charter.Blocked) as blocked:
            resumed.execute(plan)
        assert isinstance(blocked.value.__cause__, charter.AnswerNotRecorded)
        assert len(fake.received) == 1  # the model was told nothing
    assert calls == ["gazette"]
    assert engine.run(ex.run_id).status is charter.RunStatus.NEEDS_INTERVENTION
