"""MCP tool calls as attempts, against an MCP server started by the test (A1-A7).

The server is the SDK's own, connected in process through the SDK's client:
a read-only tool, a tool that sends (and records what it received, its
``_meta`` included) and a tool that answers an error.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

import charter
from charter import AttemptStatus, EffectClass
from charter.integrations.mcp import FENCE_META, KEY_META, McpTools
from conftest import Principals, default_contract


def desk() -> tuple[MCPServer, list[dict[str, Any]]]:
    server = MCPServer("desk")
    sent: list[dict[str, Any]] = []

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def weather(city: str) -> str:
        return f"sunny in {city}"

    @server.tool()
    def send_email(to: str, body: str, ctx: Context) -> str:
        sent.append({"to": to, "body": body, "meta": dict(ctx.request_context.meta or {})})
        return f"sent to {to}"

    @server.tool()
    def refuse(reason: str) -> str:
        raise ValueError(reason)

    return server, sent


@pytest.fixture
def mission(engine: charter.Engine, who: Principals) -> str:
    contract = default_contract(principals={"agent": {"run": ["mcp.*"]}, "alice": ["resolve"]})
    return engine.create_mission(contract, by=who.alice)


def test_A7_a_tools_effect_class_comes_from_its_annotations_or_the_configuration() -> None:
    server, _ = desk()

    async def adapt(**options: Any) -> dict[str, EffectClass]:
        async with Client(server) as client:
            tools = await McpTools.connect(client, **options)
            return {name: op.effect for name, op in tools.operations.items()}

    import asyncio

    assert asyncio.run(adapt()) == {
        "weather": EffectClass.READ_ONLY,
        "send_email": EffectClass.UNSAFE,
        "refuse": EffectClass.UNSAFE,
    }
    keyed = asyncio.run(
        adapt(keyed={"send_email": 3600}, effects={"refuse": EffectClass.READ_ONLY})
    )
    assert keyed["send_email"] is EffectClass.IDEMPOTENT_KEYED
    assert keyed["refuse"] is EffectClass.READ_ONLY


def test_A2_A4_each_tool_call_is_an_attempt_sent_once_and_replayed_from_its_record(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """A node that fails after its tools answered runs again: the read-only
    call is made again, the sending call is replayed from its record."""
    server, sent = desk()
    tries: list[int] = []

    @charter.node(retries=1)
    async def answer_mail(ctx: charter.Context, city: str) -> str:
        async with Client(server) as client:
            tools = await McpTools.connect(client)
            forecast = await ctx.aattempt(tools, "weather", {"city": city}, key="forecast")
            mail = {"to": "team@example.org", "body": str(forecast)}
            done = await ctx.aattempt(tools, "send_email", mail, key="mail")
        tries.append(1)
        if len(tries) == 1:
            raise RuntimeError("the node failed after its tools answered")
        return str(done)

    plan = charter.Plan("mail", (answer_mail,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan, input="Oslo")
    assert "sent to team@example.org" in ex.execute(plan)

    assert len(sent) == 1  # the sending call was made once (A4)
    [mail] = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "send_email"]
    assert mail.status is AttemptStatus.SUCCEEDED
    assert sent[0]["meta"][KEY_META] == mail.idempotency_key
    assert sent[0]["meta"][FENCE_META] == f"{ex.run_id}:1"
    reads = [a for a in engine.attempts(run_id=ex.run_id) if a.operation == "weather"]
    assert len(reads) == 2  # a read-only call runs again on the node's retry


def test_A3_a_read_only_tools_error_result_settles_the_attempt_failed_with_it_kept(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """A read-only tool changes nothing outside: its error result may settle FAILED."""
    server, _ = desk()

    @charter.node
    async def ask(ctx: charter.Context, _: Any) -> Any:
        async with Client(server) as client:
            tools = await McpTools.connect(client, effects={"refuse": EffectClass.READ_ONLY})
            try:
                return await ctx.aattempt(tools, "refuse", {"reason": "no"}, key="r")
            except charter.AttemptFailed as failed:  # the node sees the refusal
                return {"failed": failed.details["attempt_id"]}

    plan = charter.Plan("refuse", (ask,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    failed = ex.execute(plan)["failed"]
    [attempt] = engine.attempts(run_id=ex.run_id)
    assert attempt.id == failed
    assert attempt.status is AttemptStatus.FAILED
    assert attempt.result["isError"] is True  # the tool's answer, stored once


def test_A3_A4_a_tool_that_acts_then_raises_is_unknown_and_never_called_again(
    engine: charter.Engine, who: Principals, mission: str
) -> None:
    """The MCP SDK turns any exception inside a tool into an ``isError`` result,
    even after the tool acted: for an unsafe tool that proves nothing. The
    attempt is UNKNOWN with the answer kept, and the node's retry blocks on it
    instead of calling the tool again (it used to settle FAILED, and the retry
    moved the money a second time)."""
    server = MCPServer("bank")
    moved: list[int] = []

    @server.tool()
    def transfer(amount: int) -> str:
        moved.append(amount)  # the money moves...
        raise RuntimeError("ledger write timed out")  # ...and then the tool fails

    @charter.node(retries=2)
    async def pay(ctx: charter.Context, _: Any) -> Any:
        async with Client(server) as client:
            tools = await McpTools.connect(client)
            return await ctx.aattempt(tools, "transfer", {"amount": 500}, key="t")

    plan = charter.Plan("pay", (pay,))
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1", plan=plan)
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    assert moved == [500]  # called once, never again
    [attempt] = engine.attempts(run_id=ex.run_id)
    assert attempt.status is AttemptStatus.UNKNOWN
    [evidence] = engine.evidence(attempt.id)
    assert evidence["verdict"] == "indeterminate"
    assert json.loads(evidence["detail"])["answer"]["isError"] is True
    assert engine.balances(mission)["calls"].held == 1  # the hold waits for a person
