"""An upstream MCP server's tools as one Charter adapter, governed by the gateway's rules (G2).

:class:`UpstreamTools` is :class:`~charter.integrations.mcp.McpTools` (each
call carries the attempt's key and fencing token in ``_meta``, an error
result is read by A3) with what the gateway's file declares per tool: the
effect class when the annotations do not say it, an estimate (a whole
number, or an argument of the call), the actual cost read from the result,
and a lookup tool that finds a call by its key after a crash (R7). The
adapter's name is the upstream's, its operations the upstream's tools, so a
call's scope is ``upstream.tool``, what the contract's ``run`` patterns name.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from collections.abc import AsyncIterator, Mapping
from typing import Any

from charter.adapters import Dispatch, EffectClass, Estimate, Evidence, Outcome, RecordedAttempt
from charter.adapters.sending import async_transport
from charter.errors import AdapterError, MissingExtra
from charter.gateway.config import GatewayConfig, ToolRule, Upstream, secret
from charter.integrations.mcp import McpTools, carries

LOOKUP_ARGUMENT = "idempotency_key"


class UpstreamTools(McpTools):
    """An upstream's tools with the gateway's rules (see the module's text)."""

    def __init__(self, session: Any, tools: list[Any], *, name: str, config: GatewayConfig) -> None:
        self.rules = {t.name: config.rule(f"{name}.{t.name}") for t in tools}
        self.loop = asyncio.get_running_loop()
        super().__init__(
            session,
            tools,
            name=name,
            effects={n: r.effect for n, r in self.rules.items() if r.effect is not None},
            keyed={
                n: r.dedupe_window_seconds
                for n, r in self.rules.items()
                if r.effect is EffectClass.IDEMPOTENT_KEYED and r.dedupe_window_seconds
            },
        )

    def estimate(self, operation: str, request: Any) -> Estimate:
        rule = self.rules.get(operation, ToolRule(operation))
        amounts = {u: _whole(request, v, "argument") for u, v in rule.estimate.items()}
        return Estimate(amounts, f"gateway/{self.name}.{operation}")

    async def dispatch(self, send: Dispatch) -> Outcome:
        outcome = await super().dispatch(send)
        rule = self.rules.get(send.operation, ToolRule(send.operation))
        if outcome.status != "succeeded" or not rule.cost:
            return outcome
        return dataclasses.replace(outcome, cost=self._cost(rule, send.request, outcome.result))

    def _cost(self, rule: ToolRule, request: Any, result: Any) -> dict[str, int]:
        """The estimate, with each unit the rule reads from the result replaced
        by what the result says was taken (L2)."""
        held = {u: _whole(request, v, "argument") for u, v in rule.estimate.items()}
        return {**held, **{u: _whole(result, f, "result field") for u, f in rule.cost.items()}}

    async def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        """The rule's lookup tool, asked by the attempt's key: a record found
        whose ``lookup_key`` field is that key is the call applied at its cost;
        anything else (none, an error, another call's record) proves nothing (R7). The
        upstream's session lives on the gateway's event loop: a reconcile the
        engine awaits on a loop of its own (a takeover in a worker thread) is
        carried over to it."""
        if asyncio.get_running_loop() is not self.loop:
            hop = asyncio.run_coroutine_threadsafe(self._looked_up(attempt), self.loop)
            return await asyncio.wrap_future(hop)
        return await self._looked_up(attempt)

    async def _looked_up(self, attempt: RecordedAttempt) -> Evidence:
        rule = self.rules.get(attempt.operation, ToolRule(attempt.operation))
        if rule.lookup is None:
            return await super().reconcile(attempt)
        found = await self.session.call_tool(
            rule.lookup,
            {LOOKUP_ARGUMENT: attempt.idempotency_key},
            read_timeout_seconds=self.timeout_seconds,
        )
        record = getattr(found, "structured_content", None)
        if getattr(found, "is_error", True) or not isinstance(record, Mapping) or not record:
            return Evidence.indeterminate({"lookup": rule.lookup, "found": None})
        if record.get(rule.lookup_key) != attempt.idempotency_key:  # another call's record
            return Evidence.indeterminate({"lookup": rule.lookup, "not_this_call": dict(record)})
        cost = self._cost(rule, attempt.request, record)
        outcome = Outcome.succeeded(dict(record), cost=cost, receipt={"lookup": rule.lookup})
        return Evidence.applied(outcome, detail={"lookup": rule.lookup})


def _whole(source: Any, spec: int | str, kind: str) -> int:
    """A whole amount: ``spec`` itself, or the field ``spec`` (dotted) of ``source``."""
    if isinstance(spec, int):
        return spec
    value: Any = source
    for part in spec.split("."):
        value = value.get(part) if isinstance(value, Mapping) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise AdapterError(f"the {kind} {spec!r} must be a whole amount, got {value!r}")
    return value


@contextlib.asynccontextmanager
async def connected(upstream: Upstream, config: GatewayConfig) -> AsyncIterator[UpstreamTools]:
    """The upstream's session, open while the gateway serves, and its tools."""
    try:
        from mcp import Client, StdioServerParameters  # noqa: PLC0415 - the mcp extra
    except ImportError:
        raise MissingExtra(
            "the gateway needs the MCP SDK: pip install 'charter[mcp]'", extra="mcp"
        ) from None
    async with contextlib.AsyncExitStack() as stack:
        if upstream.url is not None:
            import httpcore2  # noqa: PLC0415 - the MCP SDK's own HTTP client, and its core
            import httpx2  # noqa: PLC0415
            from mcp.client.streamable_http import streamable_http_client  # noqa: PLC0415

            headers = {
                k: secret(v) if v.startswith("env:") else v for k, v in upstream.headers.items()
            }
            # The transport does not close a client it is given: closed here, last.
            # A call's first byte waits for no connection past its deadline (F3).
            checked = async_transport(httpx2, httpcore2, carries)
            http = await stack.enter_async_context(
                httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(60.0), transport=checked)
            )
            server: Any = streamable_http_client(upstream.url, http_client=http)
        else:
            command, *args = upstream.command
            env = {k: secret(v) for k, v in upstream.env.items()}
            server = StdioServerParameters(command=command, args=args, env=env or None)
        client = await stack.enter_async_context(Client(server, cache=None))
        tools = await UpstreamTools.connect(client, name=upstream.name, config=config)
        assert isinstance(tools, UpstreamTools)
        yield tools
