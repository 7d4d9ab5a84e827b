"""LangGraph on Charter: a graph's tool and chat model calls are attempts, and
Charter's stops are LangGraph interrupts (A1-A7, W2, L7).

The graph is the example's (examples/langgraph_agent.py): LangGraph's tool
loop with ``ChatOpenAI`` talking to the loopback fake provider
(tests/_fake_models.py), on LangGraph's SQLite checkpointer, its ``pay`` tool
paying through the payments sandbox. Checked against what the provider
received and billed, what the sandbox took, what the store recorded and what
the graph's checkpoint holds.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.checkpoint.sqlite import SqliteSaver

import charter
from _agent_turns import clerk_turns
from _fake_models import FakeProvider
from charter import AttemptStatus, EffectClass, NotApplied, Operation, Secret
from charter.adapters.models import ModelUnits
from charter.conformance import ECHO_CASES, check_adapter
from charter.conformance.http_target import ScriptedHttp
from charter.errors import ConfigError
from charter.integrations.langgraph import (
    RESUMED,
    GovernedTools,
    ToolNode,
    current_send,
    invoke,
)
from charter.integrations.langgraph_models import ChatModelCalls
from charter.sandbox import Sandbox
from conftest import Principals

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import langgraph_agent as example  # noqa: E402 - the example, once examples/ is on the path


@pytest.fixture
def saver(tmp_path: Path) -> Iterator[SqliteSaver]:
    with SqliteSaver.from_conn_string(str(tmp_path / "graph.db")) as found:
        yield found


@pytest.fixture
def clerk() -> Iterator[FakeProvider]:
    with FakeProvider(chat=clerk_turns) as fake:
        yield fake


def mission(engine: charter.Engine, who: Principals, **changes: Any) -> str:
    contract = {**example.CONTRACT, **changes}
    contract["principals"] = {
        "agent": {"run": ["chat.*", "tools.*"]},
        "alice": ["approve", "resolve", "run", "stop", "raise_limit"],
    }
    return engine.create_mission(contract, by=who.alice)


def graph_of(fake: FakeProvider, tools: GovernedTools, saver: SqliteSaver) -> Any:
    calls = ChatModelCalls(example.chat_model(f"{fake.url}/v1"), units=ModelUnits())
    return example.build_graph(calls.model, ToolNode(tools), tools.tools, saver)


def plan_of(graph: Any) -> charter.Plan:
    @charter.node
    def clerk(ctx: charter.Context, task: str) -> str:
        state = invoke(ctx, graph, {"messages": [HumanMessage(task)]})
        return str(state["messages"][-1].content)

    return charter.Plan("clerk", (clerk,))


def thread(run_id: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": f"{run_id}/clerk"}}


def test_A1_A7_a_graphs_model_and_tool_calls_are_attempts_keyed_by_task_and_tool_call(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox, saver: SqliteSaver
) -> None:
    graph = graph_of(clerk, example.tools(box.url), saver)
    ex = engine.start_run(mission(engine, who), by=who.agent, segment_id="seg-1", input="survey")

    assert ex.execute(plan_of(graph)) == "Paid the survey vendor."

    attempts = engine.attempts(run_id=ex.run_id)
    assert sorted(a.scope for a in attempts) == [
        "chat.chat",
        "chat.chat",
        "chat.chat",
        "tools.pay",
        "tools.quote",
    ]
    assert all(a.status is AttemptStatus.SUCCEEDED for a in attempts)
    keys = [a.effect_key for a in attempts]
    assert f"k:{ex.run_id}/clerk:tool:call_quote_1" in keys
    models = [k for k in keys if k.startswith(f"k:{ex.run_id}/clerk:model:agent:")]
    assert len(models) == 3 and all(k.endswith(":1") for k in models)
    assert len(set(keys)) == 5
    # each model call sent once, with its attempt's key, and no id or usage recorded
    assert sorted(clerk.keys()) == sorted(
        a.idempotency_key for a in attempts if a.adapter == "chat"
    )
    last = max(
        (a.request for a in attempts if a.adapter == "chat"), key=lambda r: len(r["messages"])
    )
    assert [m["type"] for m in last["messages"]] == ["system", "human", "ai", "tool", "ai", "tool"]
    assert "id" not in json.dumps(last["messages"][2]).replace('"id": "call_', "")
    assert last["max_tokens"] == example.MAX_TOKENS
    assert [t["function"]["name"] for t in last["settings"]["tools"]] == ["quote", "pay"]
    [paid] = box.payments()
    [pay] = [a for a in attempts if a.operation == "pay"]
    assert paid["idempotency_key"] == pay.idempotency_key
    assert engine.check_ledger(ex.mission_id) == []


def test_W2_an_approval_is_a_langgraph_interrupt_resumed_once_a_person_approved(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox, saver: SqliteSaver
) -> None:
    m = mission(engine, who, approvals={"required": ["tools.pay"], "ttl_seconds": 3600})
    graph = graph_of(clerk, example.tools(box.url), saver)
    plan = plan_of(graph)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="survey")

    with pytest.raises(charter.Blocked) as blocked:
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.WAITING, blocked.value
    assert box.payments() == []
    [approval] = engine.approvals(run_id=ex.run_id, pending=True)
    # the graph stopped the LangGraph way: an interrupt saved in its checkpoint
    state = graph.get_state(thread(ex.run_id))
    assert state.next == ("tools",)
    [stop] = state.interrupts
    [pay] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "pay"]
    assert stop.value["charter"]["attempt_id"] == pay.id and approval.scope == "tools.pay"

    engine.approve(approval.id, by=who.alice)
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert resumed.execute(plan) == "Paid the survey vendor."
    assert len(box.payments()) == 1
    assert graph.get_state(thread(ex.run_id)).interrupts == ()
    # the two model calls before the wait were not made again
    assert len(clerk.received) == 3 and len(set(clerk.keys())) == 3
    assert RESUMED == {"charter": "decided"}


def test_L7_an_exhausted_allowance_is_an_interrupt_resumed_once_the_limit_is_raised(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox, saver: SqliteSaver
) -> None:
    """The payment (12 USD) does not fit the 5 USD allowance: the run pauses
    before anything is sent and the graph stops at an interrupt; a person
    raises the limit and the graph goes on from its checkpoint."""
    allowance = {**example.CONTRACT["allowance"], "usd": 5_000_000}
    m = mission(engine, who, allowance=allowance)
    graph = graph_of(clerk, example.tools(box.url), saver)
    plan = plan_of(graph)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="survey")

    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.PAUSED
    assert box.payments() == []
    [stop] = graph.get_state(thread(ex.run_id)).interrupts
    assert "usd" in stop.value["charter"]["reason"]

    engine.raise_limit(m, "usd", 50_000_000, by=who.alice)
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert resumed.execute(plan) == "Paid the survey vendor."
    assert len(box.payments()) == 1 and len(clerk.received) == 3
    assert engine.check_ledger(m) == []


def one_call(tool_name: str) -> Any:
    """The model calls ``tool_name`` once, then says what the tool answered."""

    def chat(body: dict[str, Any]) -> dict[str, Any]:
        told = [m["content"] for m in body["messages"] if m["role"] == "tool"]
        if told:
            return {"role": "assistant", "content": f"told: {told[0]}"}
        call = {
            "id": "call_1",
            "type": "function",
            "function": {"name": tool_name, "arguments": "{}"},
        }
        return {"role": "assistant", "content": None, "tool_calls": [call]}

    return chat


@pytest.mark.parametrize(
    ("effect", "status"),
    [
        (EffectClass.READ_ONLY, AttemptStatus.FAILED),
        (EffectClass.UNSAFE, AttemptStatus.UNKNOWN),
        (Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=60), AttemptStatus.UNKNOWN),
    ],
)
def test_A3_a_tools_error_reaches_the_model_only_for_a_read_only_tool(
    engine: charter.Engine,
    who: Principals,
    saver: SqliteSaver,
    effect: EffectClass | Operation,
    status: AttemptStatus,
) -> None:
    """A tool that raised may have acted first: its call is UNKNOWN unless the
    tool is ``read_only``, whose call settles FAILED and whose error the model
    is told, from the record; otherwise the graph stops at an interrupt and
    the model is told nothing until evidence settles the call."""
    ran: list[str] = []

    @tool
    def registry() -> str:
        """Look the registry up."""
        ran.append("registry")
        raise RuntimeError("the registry is down")

    tools = GovernedTools([registry], effects={"registry": effect})
    with FakeProvider(chat=one_call("registry")) as fake:
        graph = graph_of(fake, tools, saver)
        ex = engine.start_run(mission(engine, who), by=who.agent, segment_id="seg-1", input="go")
        if status is AttemptStatus.FAILED:
            told = ex.execute(plan_of(graph))
            assert told == "told: Error: RuntimeError: the registry is down"
            assert len(fake.received) == 2
        else:
            with pytest.raises(charter.Blocked):
                ex.execute(plan_of(graph))
            assert len(fake.received) == 1  # the model is told nothing on a guess
            assert engine.run(ex.run_id).status is charter.RunStatus.NEEDS_INTERVENTION
            [stop] = graph.get_state(thread(ex.run_id)).interrupts
            assert "is unknown" in stop.value["charter"]["reason"]
    [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "registry"]
    assert call.status is status and ran == ["registry"]
    if status is AttemptStatus.UNKNOWN:
        [kept] = engine.evidence(call.id)
        assert "the registry is down" in kept["detail"]


def test_A3_an_undeclared_tool_is_unsafe_and_a_tool_with_injected_arguments_is_refused() -> None:
    @tool
    def wire(to: str) -> str:
        """Wire money."""
        return to

    assert GovernedTools([wire]).operations["wire"].effect is EffectClass.UNSAFE
    with pytest.raises(ConfigError):
        GovernedTools([wire], effects={"other": EffectClass.READ_ONLY})


def test_A3_S3_the_tools_adapter_passes_the_conformance_kit() -> None:
    """``GovernedTools`` driven by ``check_adapter`` against the scripted HTTP
    target: a tool that creates through it with the attempt's key, proving a
    refusal with ``NotApplied``, and its lookup the target's by key."""
    with ScriptedHttp() as target, target.declaration().build() as looked_up:
        auth = Secret(f"Bearer {target.secret}", name="things-auth")

        @tool
        def create(amount: int, reference: str) -> dict[str, Any]:
            """Create a thing."""
            headers = {"Idempotency-Key": current_send().idempotency_key, "Authorization": ""}
            headers["Authorization"] = auth.reveal()
            answer = httpx.post(
                f"{target.url}/v1/things",
                json={"amount": amount, "reference": reference},
                headers=headers,
                timeout=0.5,
            )
            if answer.status_code == 422:
                raise NotApplied("refused before anything was done")
            if answer.status_code != 201:
                raise RuntimeError(f"HTTP {answer.status_code}: {answer.text}")
            thing: dict[str, Any] = answer.json()
            return thing

        tools = GovernedTools(
            [create],
            effects={"create": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=60)},
            costs={"create": lambda args: {"usd_cents": args["amount"]}},
            lookups={"create": looked_up.reconcile},
        )
        report = check_adapter(
            tools, target, operation="create", request={"amount": 5_00, "reference": "inv-1"}
        )
    assert set(report.not_played) <= set(ECHO_CASES)
    assert max(target.applies.values()) == 1
