"""CrewAI on Charter (charter.integrations.crewai): a crew's model and tool
calls are attempts keyed by what is stable, answered from their records when
the crew runs again, stopped by approvals, allowances and uncertain outcomes,
and a tool's error read by A3. Runs in .venv-crewai (see _crewai_env.py).
"""

from __future__ import annotations

# ruff: noqa: I001 - _crewai_env is imported before CrewAI, which it prepares
import _crewai_env  # before CrewAI: skips or fails where it is not installed
import json
import re
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
from crewai.tools import tool

import charter
from _agent_turns import clerk_turns
from _fake_models import FakeProvider
from charter import AttemptStatus, EffectClass, NotApplied, Operation, Secret
from charter.conformance import ECHO_CASES, check_adapter
from charter.conformance.http_target import ScriptedHttp
from charter.errors import ConfigError
from charter.integrations.crewai import CrewTools, current_send, kickoff
from charter.sandbox import Sandbox
from conftest import Principals

ROOT = Path(__file__).resolve().parents[1]
pytestmark = _crewai_env.QUIET
sys.path.insert(0, str(ROOT / "examples"))
import crewai_agent as example  # noqa: E402 - the example, once examples/ is on the path


@pytest.fixture
def clerk() -> Any:
    with FakeProvider(chat=clerk_turns) as fake:
        yield fake


def mission(engine: charter.Engine, who: Principals, **changes: Any) -> str:
    contract = {**example.CONTRACT, **changes}
    contract["principals"] = {
        "agent": {"run": ["chat.*", "tools.*"]},
        "alice": ["approve", "resolve", "run", "stop", "raise_limit"],
    }
    return engine.create_mission(contract, by=who.alice)


def plan_of(fake: FakeProvider, tools: CrewTools) -> charter.Plan:
    crew = example.build_crew(example.model(f"{fake.url}/v1"), tools)

    @charter.node
    def clerk(ctx: charter.Context, item: str) -> str:
        return str(kickoff(ctx, crew, {"item": item}).raw)

    return charter.Plan("clerk", (clerk,))


def test_A1_A7_a_crews_model_and_tool_calls_are_attempts_keyed_by_task_tool_and_arguments(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox
) -> None:
    ex = engine.start_run(mission(engine, who), by=who.agent, segment_id="seg-1", input="survey")

    assert ex.execute(plan_of(clerk, example.tools(box.url))) == "Paid the survey vendor."

    attempts = sorted(engine.attempts(run_id=ex.run_id), key=lambda a: a.effect_key)
    assert [a.scope for a in attempts] == [
        "chat.chat",
        "chat.chat",
        "chat.chat",
        "tools.pay",
        "tools.quote",
    ]
    assert all(a.status is AttemptStatus.SUCCEEDED for a in attempts)
    base = f"k:{ex.run_id}/clerk:t1"
    keys = [a.effect_key for a in attempts]
    assert [k for k in keys if ":model:" in k] == [f"{base}:model:{n}" for n in (1, 2, 3)]
    [quote_key] = [k for k in keys if ":tool:quote:" in k]
    assert re.fullmatch(rf"{re.escape(base)}:tool:quote:[0-9a-f]{{16}}:1", quote_key)
    # each model call sent once, with its attempt's key; no cache marker recorded
    assert sorted(clerk.keys()) == sorted(
        a.idempotency_key for a in attempts if a.adapter == "chat"
    )
    last = attempts[2].request
    assert [m["role"] for m in last["messages"]] == [
        "system",
        "user",
        "assistant",
        "tool",
        "assistant",
        "tool",
    ]
    assert "cache_breakpoint" not in json.dumps(last)
    assert last["max_tokens"] == example.MAX_TOKENS
    assert [t["function"]["name"] for t in last["tools"]] == ["quote", "pay"]
    [paid] = box.payments()
    [pay] = [a for a in attempts if a.operation == "pay"]
    assert paid["idempotency_key"] == pay.idempotency_key
    assert engine.check_ledger(ex.mission_id) == []


def test_A6_a_crew_run_again_replays_its_records_without_calling_the_model_or_a_tool(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox
) -> None:
    """The crew stopped at the payment's approval, then ran again from its first
    task: the quote and the model calls before the stop come from their records."""
    m = mission(engine, who, approvals={"required": ["tools.pay"], "ttl_seconds": 3600})
    plan = plan_of(clerk, example.tools(box.url))
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="survey")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.WAITING
    assert box.payments() == [] and len(clerk.received) == 2
    [approval] = engine.approvals(run_id=ex.run_id, pending=True)
    assert approval.scope == "tools.pay"

    engine.approve(approval.id, by=who.alice)
    resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent)
    assert resumed.execute(plan) == "Paid the survey vendor."
    assert len(box.payments()) == 1
    assert len(clerk.received) == 3 and len(set(clerk.keys())) == 3  # two replayed, one new
    assert engine.check_ledger(m) == []


def test_L7_an_exhausted_allowance_stops_the_crew_until_a_person_raises_the_limit(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox
) -> None:
    """The payment (12 USD) does not fit the 5 USD allowance: the run pauses
    before anything is sent; a person raises the limit and the crew goes on."""
    allowance = {**example.CONTRACT["allowance"], "usd": 5_000_000}
    m = mission(engine, who, allowance=allowance)
    plan = plan_of(clerk, example.tools(box.url))
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="survey")

    with pytest.raises(charter.Blocked) as blocked:
        ex.execute(plan)
    assert engine.run(ex.run_id).status is charter.RunStatus.PAUSED
    assert "usd" in blocked.value.reason
    assert box.payments() == [] and len(clerk.received) == 2

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
    effect: EffectClass | Operation,
    status: AttemptStatus,
) -> None:
    """A tool that raised may have acted first: its call is UNKNOWN unless the
    tool is ``read_only``, whose call settles FAILED and whose error the model
    is told, from the record on replay too; otherwise the crew stops and the
    model is told nothing until evidence settles the call."""
    ran: list[str] = []

    @tool("registry")
    def registry() -> str:
        """Look the registry up."""
        ran.append("registry")
        raise RuntimeError("the registry is down")

    tools = CrewTools([registry], effects={"registry": effect})
    with FakeProvider(chat=one_call("registry")) as fake:
        plan = plan_of(fake, tools)
        ex = engine.start_run(mission(engine, who), by=who.agent, segment_id="seg-1", input="x")
        if status is AttemptStatus.FAILED:
            told = "told: Error executing tool: RuntimeError: the registry is down"
            assert ex.execute(plan) == told
            assert len(fake.received) == 2
        else:
            with pytest.raises(charter.Blocked):
                ex.execute(plan)
            assert len(fake.received) == 1  # the model is told nothing on a guess
            assert engine.run(ex.run_id).status is charter.RunStatus.NEEDS_INTERVENTION
    [call] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "registry"]
    assert call.status is status and ran == ["registry"]
    if status is AttemptStatus.UNKNOWN:
        [kept] = engine.evidence(call.id)
        assert "the registry is down" in kept["detail"]


def test_A7_an_undeclared_tool_is_unsafe_and_a_crew_with_a_call_outside_charter_is_refused(
    engine: charter.Engine, who: Principals, clerk: FakeProvider, box: Sandbox
) -> None:
    from crewai import Agent, Crew, Task

    @tool("wire")
    def wire(to: str) -> str:
        """Wire money."""
        return to

    assert CrewTools([wire]).operations["wire"].effect is EffectClass.UNSAFE
    with pytest.raises(ConfigError):
        CrewTools([wire], effects={"other": EffectClass.READ_ONLY})
    agent = Agent(role="r", goal="g", backstory="b", llm=example.model(f"{clerk.url}/v1"),
                  tools=[wire])  # fmt: skip
    crew = Crew(agents=[agent], tasks=[Task(description="d", expected_output="o", agent=agent)])

    @charter.node
    def ungoverned(ctx: charter.Context, item: str) -> str:
        return str(kickoff(ctx, crew, {"item": item}).raw)

    ex = engine.start_run(mission(engine, who), by=who.agent, segment_id="seg-1", input="x")
    with pytest.raises(charter.Blocked, match="is not governed"):
        ex.execute(charter.Plan("ungoverned", (ungoverned,)))
    assert clerk.received == [] and engine.attempts(run_id=ex.run_id) == []


def test_A3_S3_the_tools_adapter_passes_the_conformance_kit() -> None:
    """``CrewTools`` driven by ``check_adapter`` against the scripted HTTP
    target: a tool that creates through it with the attempt's key, proving a
    refusal with ``NotApplied``, and its lookup the target's by key."""
    with ScriptedHttp() as target, target.declaration().build() as looked_up:
        auth = Secret(f"Bearer {target.secret}", name="things-auth")

        @tool("create")
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

        tools = CrewTools(
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


def test_the_crewai_page_examples_run(tmp_path: Path) -> None:
    """docs/crewai.md's examples (``py`` blocks: the main environment's
    documentation check cannot import CrewAI) run here."""
    page = (ROOT / "docs" / "crewai.md").read_text()
    blocks = re.findall(r"```py\n(.*?)```", page, flags=re.DOTALL)
    assert blocks
    for block in blocks:
        exec(compile(block, "docs/crewai.md", "exec"), {"tmp": tmp_path, "__name__": "docs"})
