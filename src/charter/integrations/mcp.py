"""MCP tool calls as attempts: every ``tools/call`` on a session is admitted,
written down before it is sent, sent exactly once, and settled (A1-A7).

:class:`McpTools` is an async adapter over an MCP ``ClientSession`` (or the
SDK's ``Client``). Its operations are the server's tools. A tool's effect
class comes from its annotations: ``readOnlyHint`` makes it ``read_only``;
anything else is ``unsafe`` (its uncertain call is never repeated, a person
decides). ``idempotent_keyed`` is only for a tool whose server really
deduplicates by the key Charter sends: declare it in ``keyed`` with the
server's dedupe window. Each call carries the attempt's idempotency key and
the fencing token in the request's ``_meta`` (``charter/idempotency_key``,
``charter/fencing_token``), and is made once (the SDK does not retry a call).

A tool's error result (``isError``) is read by the one rule of
:mod:`charter.attempts.classify`: the MCP SDK makes one from any exception
raised inside a tool, even after the tool acted, so for an ``unsafe`` or
``idempotent_keyed`` tool it proves nothing and the attempt is UNKNOWN (a
retry of the node blocks on it instead of calling the tool again); only a
``read_only`` tool's error settles FAILED.

Needs the ``mcp`` extra (``pip install 'charter[mcp]'``). Use it from an async
node, on the loop the session lives on::

    async with Client(server) as client:
        tools = await McpTools.connect(client)
        result = await ctx.aattempt(tools, "send_email", {"to": ...}, key="mail-1")
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Mapping
from typing import Any

from charter import (
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
    OutcomeUnknown,
    RecordedAttempt,
)
from charter.adapters.sending import sending
from charter.attempts.classify import error_answer
from charter.errors import MissingExtra

KEY_META = "charter/idempotency_key"
FENCE_META = "charter/fencing_token"


def _mcp_types() -> Any:
    try:
        import mcp_types  # noqa: PLC0415 - an optional extra, loaded when tools connect
    except ImportError:
        raise MissingExtra(
            "MCP tool calls need the MCP SDK: pip install 'charter[mcp]'", extra="mcp"
        ) from None
    return mcp_types


def effect_of(tool: Any, keyed: Mapping[str, int], effects: Mapping[str, EffectClass]) -> Operation:
    """A tool's declared effect class: an override, a keyed server, or its annotations."""
    if tool.name in keyed:
        return Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=keyed[tool.name])
    if tool.name in effects:
        return Operation(effects[tool.name])
    hints = tool.annotations
    read_only = hints is not None and hints.read_only_hint is True
    return Operation(EffectClass.READ_ONLY if read_only else EffectClass.UNSAFE)


class McpTools:
    """An MCP server's tools as Charter operations (see the module's text)."""

    def __init__(
        self,
        session: Any,
        tools: list[Any],
        *,
        name: str = "mcp",
        effects: Mapping[str, EffectClass] | None = None,
        keyed: Mapping[str, int] | None = None,
        costs: Mapping[str, Mapping[str, int]] | None = None,
        timeout_seconds: float = 60.0,
    ) -> None:
        self.session = session
        self.name = name
        self.tools = {t.name: t for t in tools}
        self.operations: Mapping[str, Operation] = {
            t.name: effect_of(t, keyed or {}, effects or {}) for t in tools
        }
        self.costs = dict(costs or {})
        self.timeout_seconds = timeout_seconds

    @classmethod
    async def connect(cls, session: Any, **options: Any) -> McpTools:
        """List the server's tools (every page) and adapt them."""
        types = _mcp_types()
        by_params = "params" in inspect.signature(session.list_tools).parameters
        tools: list[Any] = []
        cursor = None
        while True:
            if cursor is None:
                page = await session.list_tools()
            elif by_params:  # a ClientSession pages by request parameters
                page = await session.list_tools(params=types.PaginatedRequestParams(cursor=cursor))
            else:  # the SDK's Client pages by cursor
                page = await session.list_tools(cursor=cursor)
            tools += page.tools
            cursor = page.next_cursor
            if not cursor:
                return cls(session, tools, **options)

    def estimate(self, operation: str, request: Any) -> Estimate:
        return Estimate(dict(self.costs.get(operation, {"calls": 1})), f"{self.name}/declared")

    async def dispatch(self, send: Dispatch) -> Outcome:
        send.check_deadline()  # right before the call goes out (F3)
        # ... and again before its first byte, where the session's HTTP client
        # checks it (the gateway's: charter.adapters.sending.async_transport).
        with sending(send) as written:
            try:
                result = await self.session.call_tool(
                    send.operation,
                    send.request,
                    read_timeout_seconds=self.timeout_seconds,
                    meta={KEY_META: send.idempotency_key, FENCE_META: send.fencing_token},
                )
            except Exception:
                if written.refused is not None:  # nothing of the call went out
                    raise written.refused from None
                raise
        if written.refused is not None:
            raise written.refused
        types = _mcp_types()
        if not isinstance(result, types.CallToolResult):  # e.g. the server asks for input
            raise OutcomeUnknown(
                f"the tool answered {type(result).__name__}, not a result",
                evidence={"answer": result.model_dump(mode="json", by_alias=True)},
            )
        body = result.model_dump(mode="json", by_alias=True, exclude_none=True)
        if result.structured_content is None:  # the answer is the result, stored once
            value, receipt = body, None
        else:
            value, receipt = result.structured_content, _without(body, "structuredContent")
        if result.is_error:
            return error_answer(
                self.operations[send.operation],
                value,
                receipt=receipt,  # None when the answer is the result: stored once
                reason=f"tool {send.operation!r} answered with an error (isError)",
            )
        cost = self.estimate(send.operation, send.request).amounts
        return Outcome.succeeded(value, cost=cost, receipt=receipt)

    async def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        """MCP has no way to look a call up: a person decides (or, for a keyed
        tool, the engine replays it with its key)."""
        return Evidence.indeterminate({"mcp": f"{attempt.operation}: no lookup in MCP"})


def carries(request: Any, send: Dispatch) -> bool:
    """Whether an HTTP ``request`` is ``send``'s tool call (its ``_meta`` names
    the send's key): the one request of a send whose first byte is checked
    against its deadline (:func:`charter.adapters.sending.async_transport`)."""
    if request.method != "POST":
        return False
    try:  # the SDK sends its messages whole; a body still streaming is not one
        message = json.loads(request.content)
    except Exception:
        return False
    params = message.get("params") if isinstance(message, dict) else None
    meta = params.get("_meta") if isinstance(params, dict) else None
    return (
        message.get("method") == "tools/call"
        and isinstance(meta, dict)
        and meta.get(KEY_META) == send.idempotency_key
    )


def _without(body: dict[str, Any], key: str) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != key}
