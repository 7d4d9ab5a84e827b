"""G1-G4: `charter gateway` between MCP clients and MCP servers, every tool call an attempt.

Real processes on loopback: the payments sandbox (its records are the ground
truth of what was paid), its MCP face as the upstream MCP server (started by
the gateway over stdio), `charter gateway` as a process of its own, and the
MCP SDK's own client over streamable HTTP and over stdio. Each test asserts
on what the store holds and on what the sandbox applied.
"""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

import charter
from _gateway_world import PAY, World, http_client, world


@pytest.fixture
def gw(tmp_path: Path, store_address: str) -> Any:
    with world(tmp_path, store_address) as w:
        w.start()
        yield w


def test_a_gateway_serves_on_the_port_it_says_and_a_taken_one_is_a_typed_error(
    tmp_path: Path, store_address: str
) -> None:
    """Broken: the gateway announces its address before it listens (or port 0
    as itself), or a port already taken ends it with uvicorn's exit and no
    error of its own."""
    with world(tmp_path, store_address) as w:
        w.start()  # on port 0: back once its first line names the port chosen
        assert w.port != 0
        with socket.create_connection(("127.0.0.1", w.port)):
            pass  # it listens: the line came once it did
        taken = w.port
        w.stop()
        with socket.socket() as holder:
            holder.bind(("127.0.0.1", taken))
            holder.listen()
            with pytest.raises(RuntimeError, match=rf"cannot serve on 127\.0\.0\.1:{taken}"):
                w.start()


def pay(amount: int, reference: str = "inv-1") -> dict[str, Any]:
    return {"payee": "acme", "amount": amount, "currency": "usd", "reference": reference}


def said(result: Any) -> dict[str, Any]:
    """The gateway's own word in a result (``structuredContent.charter``)."""
    assert result.is_error, result
    return dict(result.structured_content["charter"])


def test_G1_G2_a_client_sees_its_tools_and_each_call_is_an_attempt_under_the_contract(
    gw: World,
) -> None:
    """Broken G1/G2: a tool outside the principal's patterns is listed or called;
    a call is not recorded, not keyed, not held and settled at its cost."""

    async def session() -> tuple[list[str], Any, Any]:
        async with http_client(gw) as client:
            listed = [t.name for t in (await client.list_tools()).tools]
            paid = await client.call_tool("payments.pay", pay(2_500))
            with pytest.raises(Exception, match="unknown tool"):
                await client.call_tool("payments.list_payments", {"reference": "inv-1"})
            return listed, paid, await client.list_tools()

    listed, paid, _ = asyncio.run(session())
    assert sorted(listed) == ["payments.get_payment", "payments.pay"]
    assert not paid.is_error and paid.structured_content["amount"] == 2_500
    [payment] = gw.payments()
    [attempt] = gw.engine.attempts(mission_id=gw.mission)
    assert attempt.scope == "payments.pay" and attempt.status is charter.AttemptStatus.SUCCEEDED
    assert payment["idempotency_key"] == attempt.idempotency_key  # the key went in _meta
    assert attempt.effect_class == "idempotent_keyed"
    assert attempt.estimate == {"usd_cents": 2_500} and attempt.actual == {"usd_cents": 2_500}
    usd = gw.engine.balances(gw.mission)["usd_cents"]
    assert (usd.spent, usd.held) == (2_500, 0)
    assert [r.status for r in gw.engine.runs(gw.mission)] == [charter.RunStatus.COMPLETED]
    assert gw.engine.check_ledger(gw.mission) == []


def test_G3_the_same_call_asked_again_is_answered_from_its_record(gw: World) -> None:
    """Broken G3: a client's retry of the same call (its key in ``_meta``) reaches
    the upstream again; another key is not another call."""

    async def session() -> list[Any]:
        async with http_client(gw) as client:
            first = await client.call_tool("payments.pay", pay(700), meta={"charter/call_key": "a"})
            again = await client.call_tool("payments.pay", pay(700), meta={"charter/call_key": "a"})
            other = await client.call_tool("payments.pay", pay(700), meta={"charter/call_key": "b"})
            return [first, again, other]

    first, again, other = asyncio.run(session())
    assert first.structured_content == again.structured_content
    assert other.structured_content["id"] != first.structured_content["id"]
    assert len(gw.payments()) == 2
    assert len(gw.engine.attempts(mission_id=gw.mission)) == 2
    assert gw.engine.balances(gw.mission)["usd_cents"].spent == 1_400


def test_G3_identical_arguments_within_a_tools_window_are_one_call(
    tmp_path: Path, store_address: str
) -> None:
    """Broken G3: a tool that declares ``same_call_seconds`` is called twice for
    the same arguments within its window."""
    with world(
        tmp_path, store_address, tools={"payments.pay": {**PAY, "same_call_seconds": 600}}
    ) as w:
        w.start()

        async def session() -> list[Any]:
            async with http_client(w) as client:
                return [await client.call_tool("payments.pay", pay(300)) for _ in range(3)]

        answers = asyncio.run(session())
        assert len({json.dumps(a.structured_content, sort_keys=True) for a in answers}) == 1
        assert len(w.payments()) == 1 and len(w.engine.runs(w.mission)) == 1


def test_L3_G2_an_exhausted_allowance_refuses_before_the_upstream_sees_the_call(
    tmp_path: Path, store_address: str
) -> None:
    """Broken L3/G2: a call the allowance cannot hold reaches the upstream, or a
    raised limit does not let the same call through."""
    contract = {**_contract(), "allowance": {"usd_cents": 1_000}}
    with world(tmp_path, store_address, contract=contract) as w:
        w.start()

        async def ask(amount: int, key: str) -> Any:
            async with http_client(w) as client:
                return await client.call_tool("payments.pay", pay(amount, key),
                                              meta={"charter/call_key": key})  # fmt: skip

        assert not asyncio.run(ask(800, "inv-1")).is_error
        refused = said(asyncio.run(ask(500, "inv-2")))
        assert (refused["status"], refused["code"]) == ("refused", "allowance_exceeded")
        assert [p["reference"] for p in w.payments()] == ["inv-1"]  # the upstream saw nothing
        assert w.engine.balances(w.mission)["usd_cents"].held == 0
        w.engine.raise_limit(w.mission, "usd_cents", 2_000, by=w.principal("ops"))
        assert not asyncio.run(ask(500, "inv-2")).is_error  # the same call, now through
        assert [p["reference"] for p in w.payments()] == ["inv-1", "inv-2"]
        assert w.engine.check_ledger(w.mission) == []


def test_W2_P3_G4_an_approval_is_named_to_the_client_and_the_call_sent_once_when_given(
    tmp_path: Path, store_address: str
) -> None:
    """Broken G4/W2/P3: a call that needs an approval blocks the client or is
    sent before it is given; the requester approves itself; the approved call is
    sent twice."""
    approvals = {"required": ["payments.pay"], "ttl_seconds": 600, "four_eyes": True}
    contract = {**_contract(), "approvals": approvals}
    contract["principals"] = {**contract["principals"], "agent": {"run": ["payments.*"],
                              "approve": ["payments.*"]}}  # fmt: skip
    with world(tmp_path, store_address, contract=contract) as w:
        w.start()

        async def ask() -> Any:
            async with http_client(w) as client:
                return await client.call_tool("payments.pay", pay(900),
                                              meta={"charter/call_key": "inv-9"})  # fmt: skip

        pending = said(asyncio.run(ask()))
        assert pending["status"] == "approval_required" and pending["approvers"] == ["ops"]
        assert pending["console"].endswith(f"/runs/{pending['run_id']}")
        assert w.payments() == []
        assert w.engine.balances(w.mission)["usd_cents"].held == 900  # held while it waits
        with pytest.raises(charter.CharterError):  # four eyes: not the requester
            w.engine.approve(pending["approval_id"], by=w.principal("agent"))
        assert said(asyncio.run(ask()))["status"] == "approval_required"
        w.engine.approve(pending["approval_id"], by=w.principal("ops"))
        sent, again = asyncio.run(ask()), asyncio.run(ask())
        assert not sent.is_error and sent.structured_content == again.structured_content
        assert len(w.payments()) == 1
        assert [r.status for r in w.engine.runs(w.mission)] == [charter.RunStatus.COMPLETED]


def test_P1_P4_G1_strangers_and_bad_requests_are_refused_and_nothing_is_written(
    gw: World,
) -> None:
    """Broken P1/P4/G1: a request without a credential, with a wrong one, or
    from a principal the gateway does not serve, malformed JSON-RPC or a 50 MB
    argument is read, carried out, or writes anything."""
    before, paid = gw.stored(), gw.payments()
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
            "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                       "clientInfo": {"name": "x", "version": "1"}}}  # fmt: skip
    accept = {"Accept": "application/json, text/event-stream"}
    for token in (None, "agent:wrong", gw.creds["mallory"], "garbage"):
        headers = accept | ({} if token is None else {"Authorization": f"Bearer {token}"})
        answer = httpx.post(gw.url, json=init, headers=headers, timeout=10)
        assert answer.status_code == 401, (token, answer.text)
    auth = accept | {"Authorization": f"Bearer {gw.creds['agent']}"}
    malformed = httpx.post(gw.url, content=b"{not json", headers=auth, timeout=10)
    assert 400 <= malformed.status_code < 500
    memo = {"memo": "x" * 50_000_000}
    huge = {"jsonrpc": "2.0", "id": 2, "method": "tools/call",
            "params": {"name": "payments.pay", "arguments": memo}}  # fmt: skip
    too_big = httpx.post(gw.url, content=json.dumps(huge).encode(), headers=auth, timeout=60)
    assert too_big.status_code == 413
    assert gw.stored() == before and gw.payments() == paid


def test_G1_the_official_client_over_stdio(tmp_path: Path, store_address: str) -> None:
    """Broken G1: a stdio client (one local client, named by the file) cannot use
    the gateway, or its call is not governed as an HTTP client's is."""
    from mcp import Client, StdioServerParameters

    with world(tmp_path, store_address) as w:
        command, *args = w.command("--stdio")

        async def session() -> tuple[list[str], Any]:
            params = StdioServerParameters(command=command, args=args, env=w.env())
            async with Client(params) as client:
                names = [t.name for t in (await client.list_tools()).tools]
                return names, await client.call_tool("payments.pay", pay(1_200))

        names, paid = asyncio.run(session())
        assert sorted(names) == ["payments.get_payment", "payments.pay"]
        assert paid.structured_content["amount"] == 1_200 and len(w.payments()) == 1
        [attempt] = w.engine.attempts(mission_id=w.mission)
        assert attempt.principal == "agent" and attempt.actual == {"usd_cents": 1_200}


def test_G1_gateway_check_lists_each_problem_on_a_line(tmp_path: Path, store_address: str) -> None:
    """Broken G1: `charter gateway check` passes a tool pattern that matches
    nothing, a lookup the upstream lacks, or stops at the first problem."""
    tools = {"payments.pay": {**PAY, "lookup": "find_payment"}, "payments.refund*": {}}
    with world(tmp_path, store_address, tools=tools) as w:
        checked = subprocess.run([*w.command(), "check"], env=w.env(), capture_output=True,
                                 text=True, timeout=60)  # fmt: skip
        assert checked.returncode == 1, checked.stderr
        assert checked.stdout.splitlines() == [
            "[tools.'payments.pay'] lookup 'find_payment' is not a tool of payments",
            "[tools.'payments.refund*'] matches no tool of the upstreams",
        ]
        in_clear = '"headers" = { "Authorization" = "Bearer abc" }\n"command" ='
        w.gateway_file.write_text(w.gateway_file.read_text().replace('"command" =', in_clear))
        clear = subprocess.run([*w.command(), "check"], env=w.env(), capture_output=True,
                               text=True, timeout=60)  # fmt: skip
        assert clear.returncode != 0 and "secret given in clear" in clear.stdout + clear.stderr
        assert w.payments() == []


def _contract() -> dict[str, Any]:
    from _gateway_world import CONTRACT

    return json.loads(json.dumps(CONTRACT))


def test_G3_a_call_in_flight_when_the_gateway_died_is_looked_up_never_sent_again(
    tmp_path: Path, store_address: str
) -> None:
    """Broken G3/R1/R7: after the gateway was SIGKILLed while the upstream applied
    a payment it had not answered, the client's retry reaches the upstream
    again, or the lookup does not settle it, or the ledger differs from what
    the upstream took."""
    with world(tmp_path, store_address, engine={"evidence_settles": "auto"}) as w:
        w.start()
        w.sandbox.fault("slow", times=1, seconds=30)  # applied, then the answer waits

        async def ask() -> Any:
            async with http_client(w) as client:
                return await client.call_tool("payments.pay", pay(4_200, "inv-42"),
                                              meta={"charter/call_key": "inv-42"})  # fmt: skip

        async def interrupted() -> None:
            call = asyncio.create_task(ask())
            while not w.payments():  # the upstream has applied it...
                await asyncio.sleep(0.02)
            w.kill()  # ...and the gateway dies before the client hears of it
            with pytest.raises(BaseException):  # noqa: B017 - the connection is gone
                await call

        asyncio.run(interrupted())
        [attempt] = w.engine.attempts(mission_id=w.mission)
        assert attempt.status is charter.AttemptStatus.DISPATCHED
        w.start()  # the next gateway looks up what the last one left in flight
        assert w.engine.get_attempt(attempt.id).status is charter.AttemptStatus.SUCCEEDED
        retried = asyncio.run(ask())
        assert not retried.is_error and retried.structured_content["reference"] == "inv-42"
        assert len(w.payments()) == 1  # the retry reached the upstream zero more times
        settled = w.engine.get_attempt(attempt.id)
        assert settled.status is charter.AttemptStatus.SUCCEEDED
        usd = w.engine.balances(w.mission)["usd_cents"]
        assert (usd.spent, usd.held) == (4_200, 0) == (w.payments()[0]["amount"], 0)
        assert w.engine.check_ledger(w.mission) == []
        assert asyncio.run(ask()).structured_content == retried.structured_content
        assert len(w.payments()) == 1
        assert [r.status for r in w.engine.runs(w.mission)] == [charter.RunStatus.COMPLETED]


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
