"""The conformance kit on the gateway's upstream adapter (A3, A5, A10, S3, G2).

:func:`charter.conformance.check_adapter` plays an HTTP target; the gateway's
adapter (:class:`~charter.gateway.upstream.UpstreamTools`) speaks MCP. So an
MCP server stands in front of the kit's scripted target (tests/_kit_upstream.py:
``create`` forwards the call with the key from ``_meta``, ``get_thing`` finds a
thing by its key), connected as the gateway connects to an upstream
(:func:`~charter.gateway.upstream.connected`, its rules from a gateway file),
over stdio with the target's API key in its environment and over streamable
HTTP with it as the bearer token the gateway presents. Every case is driven
through a real engine; the target's records say what was applied.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from _clocks import Stalls
from charter import Dispatch, NotApplied
from charter.conformance import CASES, check_adapter
from charter.conformance.http_target import HUGE_BYTES, ScriptedHttp
from charter.gateway.config import GatewayConfig
from charter.gateway.upstream import UpstreamTools, connected

pytestmark = pytest.mark.timeout(600)  # many cases, each through an MCP server process

UPSTREAM = Path(__file__).resolve().parent / "_kit_upstream.py"
REQUEST = {"amount": 5_00, "currency": "usd", "payee": "acme", "reference": "inv-1"}
CREATE = {
    "effect": "idempotent_keyed",
    "dedupe_window_seconds": 86_400,
    "estimate": {"usd_cents": "amount"},
    "cost": {"usd_cents": "amount"},
    "lookup": "get_thing",
    "lookup_key": "key",  # the kit's target files each thing under "key"
}
#: What an MCP tool cannot say: that nothing was done. Its error result may
#: follow the effect (the MCP SDK makes one of any exception), so the gateway
#: reads it as UNKNOWN for a tool that is not read only (A3): a refusal before
#: anything was applied is not a case MCP lets the upstream play.
NOT_IN_MCP = ("refused_before_applying",)


class ThroughMcp:
    """The scripted target behind the MCP upstream: the kit's :class:`Target`,
    less the cases an MCP tool cannot play (:data:`NOT_IN_MCP`)."""

    def __init__(self, scripted: ScriptedHttp) -> None:
        self.scripted = scripted

    @property
    def secret(self) -> str:
        return self.scripted.secret

    def arm(self, case: str) -> bool:
        return case not in NOT_IN_MCP and self.scripted.arm(case)

    def applied(self, key: str) -> int:
        return self.scripted.applied(key)

    def received(self, key: str) -> int:
        return self.scripted.received(key)


class OnItsLoop:
    """The upstream's session, called from any event loop: each call is carried
    to the loop the session lives on, where the gateway makes all of its calls.
    The kit sends synchronously, each send awaited on a private loop."""

    def __init__(self, session: Any, loop: asyncio.AbstractEventLoop) -> None:
        self.session, self.loop = session, loop

    async def call_tool(self, *args: Any, **options: Any) -> Any:
        if asyncio.get_running_loop() is self.loop:
            return await self.session.call_tool(*args, **options)
        carried = asyncio.run_coroutine_threadsafe(
            self.session.call_tool(*args, **options), self.loop
        )
        return await asyncio.wrap_future(carried)


@contextlib.contextmanager
def upstream_tools(upstream: dict[str, Any]) -> Iterator[UpstreamTools]:
    """The gateway's adapter for ``upstream`` (a ``[upstreams.things]`` table),
    its session open on a loop of its own, as a gateway holds it while it serves."""
    config = GatewayConfig.from_mapping(
        {"upstreams": {"things": upstream}, "tools": {"things.create": CREATE}}
    )
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    opened: concurrent.futures.Future[UpstreamTools] = concurrent.futures.Future()
    done = asyncio.Event()

    async def hold() -> None:
        try:
            async with connected(config.upstreams["things"], config) as tools:
                opened.set_result(tools)
                await done.wait()
        except BaseException as exc:
            if not opened.done():
                opened.set_exception(exc)
            raise

    held = asyncio.run_coroutine_threadsafe(hold(), loop)
    try:
        tools = opened.result(timeout=60)
        tools.session = OnItsLoop(tools.session, loop)
        yield tools
    finally:
        loop.call_soon_threadsafe(done.set)
        with contextlib.suppress(Exception):
            held.result(timeout=30)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(timeout=10)
        loop.close()


@contextlib.contextmanager
def served(url: str) -> Iterator[str]:
    """The upstream MCP server over streamable HTTP on loopback: its /mcp address."""
    proc = subprocess.Popen(
        [sys.executable, str(UPSTREAM), url, "--http", "0"], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None
    try:
        base = proc.stdout.readline().strip()  # once it listens, on the port it was given
        assert base.startswith("http://127.0.0.1:"), "the upstream did not start"
        yield f"{base}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)
        proc.stdout.close()


@contextlib.contextmanager
def kit_upstream(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[ScriptedHttp, UpstreamTools]]:
    """The scripted target, with a secret of its own (none made before in this
    process), and the gateway's adapter for the MCP server in front of it."""
    secret = f"sk-gateway-kit-{uuid.uuid4().hex}"
    # The MCP SDK's stdio reader joins a line's chunks again at every chunk, so
    # a 50 MB answer costs it from seconds to minutes: 4 MB is 64 times the
    # kit's bound on what is stored, and the same case (docs/gateway.md).
    huge = 4 << 20 if transport == "stdio" else HUGE_BYTES
    with (
        ScriptedHttp(secret=secret, stall=5.0, huge=huge) as scripted,
        contextlib.ExitStack() as stack,
    ):
        if transport == "stdio":
            monkeypatch.setenv("KIT_API_KEY", secret)
            command = [sys.executable, str(UPSTREAM), scripted.url]
            upstream: dict[str, Any] = {
                "command": command,
                "env": {"KIT_API_KEY": "env:KIT_API_KEY"},
            }
        else:
            monkeypatch.setenv("KIT_BEARER", f"Bearer {secret}")
            url = stack.enter_context(served(scripted.url))
            upstream = {"url": url, "headers": {"Authorization": "env:KIT_BEARER"}}
        yield scripted, stack.enter_context(upstream_tools(upstream))


#: The case the last test plays on its own: the credential the gateway hands its upstream.
ECHOED = "echo_in_body"


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_A3_A5_G2_the_gateways_upstream_adapter_passes_the_kit(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken A3/A5/G2: the gateway's adapter reads an error or a lost answer
    after the upstream applied the call as anything but UNKNOWN, sends without
    the attempt's key, reads a lookup that is not this call's as applied, or
    lets a same-key replay apply it twice."""
    with kit_upstream(transport, monkeypatch) as (scripted, tools):
        cases = tuple(c for c in CASES if c != ECHOED)
        report = check_adapter(
            tools, ThroughMcp(scripted), operation="create", request=REQUEST, cases=cases
        )
    assert report.not_played == list(NOT_IN_MCP)
    assert max(scripted.applies.values()) == 1  # nothing applied twice, the lost ones included
    assert scripted.receipts[""] == 0  # every send carried a key


@pytest.mark.parametrize("transport", ["stdio", "http"])
def test_S3_an_upstream_echoing_the_gateways_credential_gets_nothing_stored(
    transport: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The target echoes the API key the gateway handed its upstream (its
    ``env``, or the bearer header) in the body the tool answers with; the store
    must not hold it."""
    with kit_upstream(transport, monkeypatch) as (scripted, tools):
        check_adapter(
            tools,
            ThroughMcp(scripted),
            operation="create",
            request=REQUEST,
            cases=(ECHOED,),
        )


def test_F3_a_gateway_call_whose_deadline_passed_before_its_first_byte_sends_nothing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken F3: the gateway's adapter checks the deadline, then the MCP SDK
    hands the call to a task of its own, which takes a connection and writes;
    a pause in between (here the clock passing the deadline right after the
    adapter's own check) sends the call after its deadline. The socket's check
    refuses it before its first byte: ``NotApplied``, the target received
    nothing of it, and the session carries on with the next call."""
    with kit_upstream("http", monkeypatch) as (scripted, tools):
        clock = Stalls(checks=1_000)

        def send(name: str) -> Dispatch:
            return Dispatch(
                name,
                "create",
                {**REQUEST, "reference": name},
                f"key-{name}",
                "run_x",
                1,
                send_deadline_us=clock.now_us() + 30_000_000,
                deadline_monotonic_us=clock.monotonic_us() + 30_000_000,
                clock=clock,
            )

        assert asyncio.run(tools.dispatch(send("att_first"))).status == "succeeded"
        late = send("att_late")
        clock.checks = 1  # the adapter's own check passes; the socket's finds it late
        with pytest.raises(NotApplied, match="deadline"):
            asyncio.run(tools.dispatch(late))
        clock.checks = 1_000  # no more pauses
        assert asyncio.run(tools.dispatch(send("att_after"))).status == "succeeded"
    assert scripted.received("key-att_late") == 0
    assert (scripted.received("key-att_first"), scripted.received("key-att_after")) == (1, 1)


def test_A3_F3_a_gateway_call_whose_deadline_passed_once_its_first_byte_went_out_is_answered(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken A3: the socket checks the deadline at every write, so a deadline
    passing between the call's headers and its body refuses the rest as
    ``NotApplied`` when the upstream may already act on what it received.
    Checked before the first byte only, the call goes out whole and its answer
    settles it."""
    with kit_upstream("http", monkeypatch) as (scripted, tools):
        clock = Stalls(checks=1_000)
        send = Dispatch(
            "att_sent",
            "create",
            dict(REQUEST),
            "key-att_sent",
            "run_x",
            1,
            send_deadline_us=clock.now_us() + 30_000_000,
            deadline_monotonic_us=clock.monotonic_us() + 30_000_000,
            clock=clock,
        )
        clock.checks = 2  # the adapter's check and the first byte's pass; then it is late
        outcome = asyncio.run(tools.dispatch(send))
    assert outcome.status == "succeeded"
    assert scripted.received("key-att_sent") == 1
