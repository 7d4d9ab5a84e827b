"""PydanticAI agents on Charter (charter.integrations.pydantic_ai), against the
loopback fake provider and the payments sandbox (A1-A7, L3, L7, L8).

The agent is the example's clerk (examples/pydantic_ai_agent.py): a model
request, a read-only ``quote``, a paying ``pay``, a last model request.
"""

from __future__ import annotations

import importlib
import re
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI
from pydantic_ai import Agent
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart
from pydantic_ai.models.function import FunctionModel
from pydantic_ai.models.test import TestModel

import charter
from _agent_turns import clerk_turns
from _fake_models import INPUT, OUTPUT, FakeProvider
from charter import AttemptStatus, EffectClass
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing
from charter.integrations.pydantic_ai import CharterDurability, ToolEffect, in_node
from charter.sandbox import Sandbox
from conftest import Principals, stored

EXAMPLE = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLE))
import pydantic_ai_agent as example  # noqa: E402 - the example, importable once examples/ is on the path

TASK = "Buy the survey."


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider(chat=clerk_turns) as fake:
        yield fake


def contract(**allowance: int) -> dict[str, Any]:
    """The example's contract, ``alice`` in the place of ``ops``."""
    principals = {"agent": {"run": ["clerk.*"]}, "alice": example.CONTRACT["principals"]["ops"]}
    budget = {**example.CONTRACT["allowance"], **allowance}
    return {**example.CONTRACT, "principals": principals, "allowance": budget}


def start(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox, mission: str
) -> tuple[charter.Executor, charter.Plan]:
    plan = example.build_plan(f"{provider.url}/v1", box.url)
    return engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan, input=TASK), plan


def test_A1_A5_A7_L8_each_model_request_and_tool_call_is_an_attempt_priced_and_keyed(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    mission = engine.create_mission(contract(), by=who.alice)
    ex, plan = start(engine, who, provider, box, mission)

    assert ex.execute(plan) == "Paid the survey vendor."

    attempts = engine.attempts(run_id=ex.run_id)
    # Keyed by the agent run, then the request's turn or the model's tool-call id.
    assert {
        a.effect_key.split("/", 1)[1]: (a.scope, a.effect_class, a.status) for a in attempts
    } == {
        "model/1": ("clerk.model_request", "read_only", AttemptStatus.SUCCEEDED),
        "tool/call_quote_1": ("clerk.quote", "read_only", AttemptStatus.SUCCEEDED),
        "model/2": ("clerk.model_request", "read_only", AttemptStatus.SUCCEEDED),
        "tool/call_pay_1": ("clerk.pay", "idempotent_keyed", AttemptStatus.SUCCEEDED),
        "model/3": ("clerk.model_request", "read_only", AttemptStatus.SUCCEEDED),
    }
    models = [a for a in attempts if a.operation == "model_request"]
    # Each request went out once, with its attempt's own key (A5), and was billed once.
    assert sorted(provider.keys()) == sorted(a.idempotency_key for a in models)
    priced = Pricing("openai", ModelUnits()).amounts(Usage("gpt-4o-mini", INPUT, OUTPUT))
    for a in models:
        assert a.actual == priced  # the usage, in USD and tokens (L8)
        assert a.estimate["output_tokens"] == example.MAX_TOKENS  # the bound: max_tokens
        assert a.estimate["input_tokens"] >= INPUT and a.estimate["usd"] >= priced["usd"]
        assert a.price_source is not None and a.price_source.startswith("genai-prices ")
        assert "timestamp" not in str(a.request) and a.request["model"] == "gpt-4o-mini"
    # The tool calls: keyed by the model's call ids, their request the call itself.
    pay = next(a for a in attempts if a.operation == "pay")
    assert pay.effect_key.endswith("/tool/call_pay_1")
    assert pay.request == {
        "tool": "pay",
        "tool_call_id": "call_pay_1",
        "args": {"payee": "survey-vendor", "amount": 12_00, "reference": "survey-1"},
    }
    [paid] = box.payments()
    assert paid["idempotency_key"] == pay.idempotency_key
    assert pay.actual == {"usd": 12_00 * example.MICROS_PER_CENT}
    spent = engine.balances(mission)
    assert spent["usd"].spent == 3 * priced["usd"] + 12_00 * example.MICROS_PER_CENT
    assert spent["output_tokens"].spent == 3 * OUTPUT
    assert engine.check_ledger(mission) == []


def next_second() -> None:
    """Wait for the clock's next second: a timestamp made after differs in it."""
    time.sleep(1.01 - time.time() % 1)


def test_A6_item20_the_same_conversation_records_the_same_requests_whenever_it_is_made(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    """PydanticAI stamps each message with when it was made and each response
    with its provider's address, id, usage and timing (and a release may add
    more). None of it is recorded: the clerk's conversation, made again in the
    next second through another address, records the same requests field for
    field; only what the payment returned, which the model is shown, differs."""
    instructions = "Find the survey's price, pay the survey vendor, then say so."
    history: list[list[Any]] = []

    def plan(url: str) -> charter.Plan:
        @charter.node
        async def clerk(ctx: charter.Context, task: str) -> str:
            async with AsyncOpenAI(base_url=f"{url}/v1", api_key="sk-test") as client:
                with in_node(ctx):
                    done = await example.build_agent(client, box.url).run(task)
            history.append(done.all_messages())
            return done.output

        return charter.Plan("clerk", (clerk,))

    mission = engine.create_mission(contract(), by=who.alice)
    runs = []
    with FakeProvider(chat=clerk_turns) as elsewhere:
        for url in (provider.url, elsewhere.url):
            next_second()
            ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", input=TASK)
            assert ex.execute(plan(url)) == "Paid the survey vendor."
            attempts = engine.attempts(run_id=ex.run_id)
            models = [a for a in attempts if a.operation == "model_request"]
            runs.append(sorted(models, key=lambda a: a.effect_key))

    first, second = history
    assert first[0].timestamp.second != second[0].timestamp.second  # made at other times
    assert first[1].provider_url != second[1].provider_url  # through other addresses
    (one, two, three), (one_again, two_again, three_again) = runs
    assert (one.request, one.request_hash) == (one_again.request, one_again.request_hash)
    assert (two.request, two.request_hash) == (two_again.request, two_again.request_hash)
    paid = [three.request["messages"].pop(), three_again.request["messages"].pop()]
    assert three.request == three_again.request
    assert [p["parts"][0]["content"]["idempotency_key"] for p in paid] == [
        p["idempotency_key"] for p in box.payments()
    ]
    # What is recorded: the model, the settings that change the answer, each
    # message's parts as the model is shown them, and the tools' definitions.
    schema = {"type": "object", "additionalProperties": False}
    assert two.request == {
        "provider": "openai",
        "model": "gpt-4o-mini",
        "settings": {"max_tokens": example.MAX_TOKENS},
        "messages": [
            {
                "kind": "request",
                "instructions": instructions,
                "parts": [{"part_kind": "user-prompt", "content": TASK}],
            },
            {
                "kind": "response",
                "parts": [
                    {
                        "part_kind": "tool-call",
                        "tool_name": "quote",
                        "tool_call_id": "call_quote_1",
                        "args": '{"item": "survey"}',
                    }
                ],
            },
            {
                "kind": "request",
                "instructions": instructions,
                "parts": [
                    {
                        "part_kind": "tool-return",
                        "tool_name": "quote",
                        "tool_call_id": "call_quote_1",
                        "content": example.PRICES["survey"],
                        "outcome": "success",
                    }
                ],
            },
        ],
        "parameters": {
            "function_tools": [
                {
                    "kind": "function",
                    "name": "quote",
                    "description": "The price of ``item``, in cents.",
                    "parameters_json_schema": {
                        **schema,
                        "properties": {"item": {"type": "string"}},
                        "required": ["item"],
                    },
                },
                {
                    "kind": "function",
                    "name": "pay",
                    "description": "Pay ``amount`` cents to ``payee``.",
                    "parameters_json_schema": {
                        **schema,
                        "properties": {
                            "amount": {"type": "integer"},
                            "payee": {"type": "string"},
                            "reference": {"type": "string"},
                        },
                        "required": ["payee", "amount", "reference"],
                    },
                },
            ],
            "output_tools": [],
            "native_tools": [],
            "output_mode": "text",
            "allow_text_output": True,
            "allow_image_output": False,
        },
    }


def test_L7_an_exhausted_token_allowance_pauses_the_agent_and_a_raised_limit_resumes_it(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    """Room for two requests' output bound, not three: the third request is
    refused before it is sent and the run pauses; raising the limit resumes
    the node, whose recorded calls come back without being made again."""
    bound = example.MAX_TOKENS
    mission = engine.create_mission(contract(output_tokens=bound + OUTPUT + 1), by=who.alice)
    ex, plan = start(engine, who, provider, box, mission)

    with pytest.raises(charter.Blocked, match="output_tokens needs 200"):
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.PAUSED
    assert len(provider.received) == 2  # the third request never left
    assert len(box.payments()) == 1

    engine.raise_limit(mission, "output_tokens", 1_000, by=who.alice)
    assert ex.execute(plan) == "Paid the survey vendor."

    assert engine.run(ex.run_id).status is charter.RunStatus.COMPLETED
    assert len(provider.received) == 3  # nothing recorded was asked again
    assert len(box.payments()) == 1
    assert engine.balances(mission)["output_tokens"].spent == 3 * OUTPUT
    assert engine.check_ledger(mission) == []


def test_W2_a_tool_the_contract_requires_an_approval_for_waits_for_it(
    engine: charter.Engine, who: Principals, provider: FakeProvider, box: Sandbox
) -> None:
    mission = engine.create_mission(
        {**contract(), "approvals": {"required": ["clerk.pay"], "ttl_seconds": 3600}},
        by=who.alice,
    )
    ex, plan = start(engine, who, provider, box, mission)

    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.WAITING
    [approval] = engine.approvals(run_id=ex.run_id, pending=True)
    assert approval.scope == "clerk.pay"
    assert box.payments() == []  # nothing paid before the approval

    engine.approve(approval.id, by=who.alice)
    assert ex.execute(plan) == "Paid the survey vendor."
    assert len(box.payments()) == 1
    assert len(provider.received) == 3


def test_W2_pydantic_ais_own_approval_is_refused_for_the_contracts(
    engine: charter.Engine, who: Principals
) -> None:
    """A tool asking for PydanticAI's approval would end the run outside
    Charter's waits: the run is refused before anything is sent or recorded."""
    agent = Agent(TestModel(), name="clerk", capabilities=[CharterDurability()])

    @agent.tool_plain(requires_approval=True)
    def wire(amount: int) -> str:
        return "sent"

    @charter.node
    async def ask(ctx: charter.Context, _: Any) -> str:
        with in_node(ctx):
            return (await agent.run("wire it")).output

    mission = engine.create_mission(contract(), by=who.alice)
    plan = charter.Plan("wire", (ask,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked) as blocked:  # the node's error, kept for a person (N6)
        ex.execute(plan)
    assert isinstance(blocked.value.__cause__, charter.ConfigError)
    assert re.search(r"\['wire'\].*approvals.required", blocked.value.__cause__.message)
    assert engine.attempts(run_id=ex.run_id) == []


def test_the_integration_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pydantic_ai.durable_exec", None)
    monkeypatch.delitem(sys.modules, "charter.integrations.pydantic_ai")
    with pytest.raises(charter.MissingExtra) as missing:
        importlib.import_module("charter.integrations.pydantic_ai")
    assert missing.value.details["extra"] == "pydantic-ai"
    assert "charter[pydantic-ai]" in missing.value.message


def test_A7_a_keyed_tool_must_declare_its_targets_dedupe_window() -> None:
    with pytest.raises(charter.AdapterError, match="dedupe window"):
        ToolEffect(EffectClass.IDEMPOTENT_KEYED)


def test_L3_a_model_request_without_max_tokens_is_refused_before_anything_is_recorded(
    engine: charter.Engine, who: Principals
) -> None:
    """Its estimate would have no upper bound on the output."""
    agent = Agent(
        FunctionModel(lambda messages, info: ModelResponse(parts=[TextPart("hi")])),
        name="clerk",
        capabilities=[CharterDurability(units=ModelUnits(money=None))],
    )
    answered: list[str] = []

    @charter.node
    async def ask(ctx: charter.Context, _: Any) -> str:
        with in_node(ctx):
            answered.append((await agent.run("hello")).output)
        return answered[-1]

    mission = engine.create_mission(contract(), by=who.alice)
    plan = charter.Plan("ask", (ask,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked) as blocked:
        ex.execute(plan)
    assert isinstance(blocked.value.__cause__, charter.AdmissionRefused)
    assert "max_tokens" in blocked.value.__cause__.message
    assert engine.attempts(run_id=ex.run_id) == []
    assert answered == []


def desk(tools: dict[str, ToolEffect], **options: Any) -> tuple[Agent[None, str], list[Any]]:
    """An agent ``desk`` whose model calls the tool named in the prompt once,
    then answers with the tool's result as the model was shown it; and the
    list of the messages each model request carried."""
    seen: list[Any] = []

    def model(messages: list[Any], info: Any) -> ModelResponse:
        seen.append(messages)
        if len(messages) == 1:
            tool = str(messages[0].parts[-1].content)
            return ModelResponse(parts=[ToolCallPart(tool, {"amount": 5}, tool_call_id="c1")])
        shown = messages[-1].parts[0]
        return ModelResponse(parts=[TextPart(f"{shown.part_kind}: {shown.model_response_str()}")])

    durability = CharterDurability(tools=tools, units=ModelUnits(money=None), **options)
    agent = Agent(
        FunctionModel(model),
        name="desk",
        capabilities=[durability],
        model_settings={"max_tokens": 100},
    )
    return agent, seen


def desk_run(engine: charter.Engine, who: Principals, agent: Agent[None, str], tool: str) -> Any:
    @charter.node
    async def ask(ctx: charter.Context, _: Any) -> str:
        with in_node(ctx):
            return (await agent.run(tool)).output

    mission = engine.create_mission(
        {
            "objective": "desk",
            "principals": {"agent": {"run": ["desk.*"]}, "alice": ["resolve", "run"]},
            "allowance": {"input_tokens": 100_000, "output_tokens": 10_000},
        },
        by=who.alice,
    )
    plan = charter.Plan("desk", (ask,))
    return engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan), plan


@pytest.mark.parametrize("effect", [EffectClass.UNSAFE, EffectClass.IDEMPOTENT_KEYED])
@pytest.mark.parametrize("error", [ToolFailed("the bank refused"), ModelRetry("try less")])
def test_A3_a_tool_that_acts_and_raises_an_error_for_the_model_is_unknown_not_failed(
    engine: charter.Engine, who: Principals, effect: EffectClass, error: Exception
) -> None:
    """PydanticAI turns ``ToolFailed`` and ``ModelRetry`` into an answer for the
    model; for a tool with an effect outside they prove nothing about it (it
    may have acted before raising), so the call stays UNKNOWN with what it
    said kept as evidence, and the model is not told anything on a guess."""
    acted: list[int] = []
    window = 3600 if effect is EffectClass.IDEMPOTENT_KEYED else None
    agent, seen = desk({"wire": ToolEffect(effect, dedupe_window_seconds=window)})

    @agent.tool_plain
    def wire(amount: int) -> str:
        acted.append(amount)
        raise error

    ex, plan = desk_run(engine, who, agent, "wire")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)

    [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "wire"]
    assert call.status is AttemptStatus.UNKNOWN and call.effect_class == effect.value
    assert acted == [5] and len(seen) == 1  # the model was not told anything
    [kept] = engine.evidence(call.id)
    assert str(error) in kept["detail"]
    assert engine.run(ex.run_id).status is charter.RunStatus.NEEDS_INTERVENTION


@pytest.mark.parametrize("error", [ToolFailed("no such city"), ModelRetry("say a city")])
def test_A3_a_read_only_tools_error_settles_failed_and_the_model_is_told_it(
    engine: charter.Engine, who: Principals, error: Exception
) -> None:
    """A tool with no effect outside may settle FAILED on its error, which the
    model is then told as PydanticAI tells it."""
    agent, seen = desk({"forecast": ToolEffect(EffectClass.READ_ONLY)})

    @agent.tool_plain
    def forecast(amount: int) -> str:
        raise error

    ex, plan = desk_run(engine, who, agent, "forecast")
    answer = ex.execute(plan)

    assert answer.startswith("tool-return: ") and str(error) in answer
    [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "forecast"]
    assert call.status is AttemptStatus.FAILED and call.actual == {}
    assert call.result["kind"] in ("tool_failed", "model_retry")  # as PydanticAI records it
    assert len(seen) == 2


def wire_lost(engine: charter.Engine, who: Principals) -> tuple[Any, Any, Any, Agent[None, str]]:
    """The desk's ``wire`` tool acted and then raised: its call is UNKNOWN."""
    agent, _ = desk({"wire": ToolEffect(EffectClass.UNSAFE)})
    wired: list[int] = []

    @agent.tool_plain
    def wire(amount: int) -> dict[str, int]:
        if not wired:
            wired.append(amount)
            raise RuntimeError("connection reset after the bank took it")
        return {"wired": amount}

    ex, plan = desk_run(engine, who, agent, "wire")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "wire"]
    assert call.status is AttemptStatus.UNKNOWN
    return ex, plan, call, agent


@pytest.mark.parametrize("with_adapter", [False, True])
def test_R8_a_tool_call_resolved_with_the_tools_plain_value_is_what_the_model_is_told(
    engine: charter.Engine, who: Principals, with_adapter: bool
) -> None:
    """A person resolves the lost call with what the bank says the tool
    returned, as the tool returns it. The model is told exactly that value,
    and the tool is not called again; given the integration's adapter,
    ``resolve`` records it in PydanticAI's form of a tool's return."""
    ex, plan, call, agent = wire_lost(engine, who)
    durability = CharterDurability.from_agent(agent)
    assert durability is not None
    engine.coordinator.resolve(
        call.id,
        by=who.alice,
        outcome="succeeded",
        evidence="the bank's statement",
        result={"wired": 5},
        **({"adapter": durability.adapter} if with_adapter else {}),
    )

    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
    assert resumed.execute(plan) == 'tool-return: {"wired":5}'
    recorded = engine.get_attempt(call.id).result
    form = {"kind": "tool_return", "result": {"wired": 5}}
    assert recorded == (form if with_adapter else {"wired": 5})
    assert [a.id for a in engine.attempts(run_id=ex.run_id) if a.operation == "wire"] == [call.id]
    assert engine.run(ex.run_id).status is charter.RunStatus.COMPLETED


def test_R8_a_result_the_integration_could_not_read_is_refused_at_resolve(
    engine: charter.Engine, who: Principals
) -> None:
    """Given the adapter, ``resolve`` checks the result against the form the
    integration reads: a model response that is not one is refused, typed,
    and nothing is written."""

    def lost(messages: list[Any], info: Any) -> ModelResponse:
        raise ConnectionResetError("the answer was lost")

    agent = Agent(
        FunctionModel(lost),
        name="desk",
        capabilities=[CharterDurability(units=ModelUnits(money=None))],
        model_settings={"max_tokens": 100},
    )
    ex, plan = desk_run(engine, who, agent, "anything")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    [call] = engine.attempts(run_id=ex.run_id)
    assert call.status is AttemptStatus.UNKNOWN
    durability = CharterDurability.from_agent(agent)
    assert durability is not None
    before = stored(engine, engine.run(ex.run_id).mission_id)
    with pytest.raises(charter.UsageError, match="model response"):
        engine.coordinator.resolve(
            call.id,
            by=who.alice,
            outcome="succeeded",
            evidence="seen in the provider's console",
            result="Sunny.",
            adapter=durability.adapter,
        )
    assert stored(engine, engine.run(ex.run_id).mission_id) == before


def test_N6_a_tool_call_resolved_without_its_answer_stops_the_node_and_tells_the_model_nothing(
    engine: charter.Engine, who: Principals
) -> None:
    ex, plan, call, _ = wire_lost(engine, who)
    engine.coordinator.resolve(call.id, by=who.alice, outcome="succeeded", evidence="the bank")
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
    with pytest.raises(charter.Blocked) as blocked:
        resumed.execute(plan)
    assert isinstance(blocked.value.__cause__, charter.AnswerNotRecorded)
    assert blocked.value.__cause__.details["attempt_id"] == call.id
    wires = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "wire"]
    assert [a.id for a in wires] == [call.id]  # not called again
    assert engine.run(ex.run_id).status is charter.RunStatus.NEEDS_INTERVENTION
