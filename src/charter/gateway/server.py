"""``charter gateway``: an MCP server in front of upstream MCP servers (G1-G4).

Any MCP client connects to the gateway as to any MCP server: over stdio (one
local client, named by the configuration) or streamable HTTP (many, each with
its Charter credential as its bearer token). The gateway connects to every
upstream once, and answers:

- ``tools/list`` with the upstreams' tools the client's principal may run
  under its mission's current contract (``run`` on ``upstream.tool``), with
  their schemas and annotations, named ``upstream.tool`` (or with the file's
  ``separator``: ``upstream__tool`` for models that take no dot in a name);
- ``tools/call`` through :class:`~charter.gateway.calls.Calls`: each call an
  attempt under the contract, answered with the upstream's result, or with a
  result of the gateway's own (``isError``, and ``structuredContent.charter``
  saying why and what to do next) that the model can read.

A stranger (no credential, a wrong one, a principal the file does not serve),
a tool outside the principal's patterns and a malformed request are refused
before anything is written; over HTTP the credential is checked before the
body is read, and a body has a size limit (P4).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from typing import Any

from charter import Engine, Principal, Right
from charter.errors import CharterError, ConfigError, MissingExtra
from charter.gateway.calls import Answer, Calls, call_key
from charter.gateway.config import GatewayConfig, secret
from charter.gateway.upstream import UpstreamTools, connected

_log = logging.getLogger("charter.gateway")

#: The largest request body the HTTP gateway reads (bytes): a tool's arguments
#: and nothing near a stranger's upload (P4).
MAX_BODY = 1 << 20

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]


def _mcp() -> Any:
    try:
        import mcp_types  # noqa: PLC0415 - the mcp extra, loaded when a gateway starts
    except ImportError:
        needs = "the gateway needs the MCP SDK: pip install 'charter[mcp]'"
        raise MissingExtra(needs, extra="mcp") from None
    return mcp_types


class Gateway:
    """The gateway over one engine and one configuration (see the module's text)."""

    def __init__(self, engine: Engine, config: GatewayConfig, *, instance: str = "gateway") -> None:
        self.engine = engine
        self.config = config
        self.calls = Calls(engine, config, instance)
        self.upstreams: dict[str, UpstreamTools] = {}
        self.refused = 0  # requests refused before anything was read or written
        self._known: dict[str, Principal] = {}

    @contextlib.asynccontextmanager
    async def connected(self) -> AsyncIterator[Gateway]:
        """Connect to every upstream and list its tools; close them on exit."""
        async with contextlib.AsyncExitStack() as stack:
            for name, upstream in self.config.upstreams.items():
                self.upstreams[name] = await stack.enter_async_context(
                    connected(upstream, self.config)
                )
            looked = await asyncio.to_thread(self.calls.sweep, self.upstreams)
            if looked:
                _log.info("looked up %d call(s) left in flight by an earlier gateway", looked)
            yield self
            self.upstreams.clear()

    # -- who calls ----------------------------------------------------------------------
    def principal(self, credential: str) -> Principal:
        """The principal a credential proves, known to this gateway's file."""
        known = self._known.get(credential)
        if known is not None:
            return known
        who = self.engine.authenticate(credential, audit=False)
        if who.name not in self.config.clients:
            raise ConfigError(f"principal {who.name!r} is not a client of this gateway")
        if len(self._known) < 10_000:
            self._known[credential] = who
        return who

    def allowed(self, who: Principal) -> list[tuple[str, Any]]:
        """The ``(upstream, tool)`` pairs ``who`` may run under its mission's contract."""
        contract = self.engine.contract(self.config.clients[who.name].mission)
        return [
            (u, tool)
            for u, tools in self.upstreams.items()
            for tool in tools.tools.values()
            if contract.allows(who.name, Right.RUN, f"{u}.{tool.name}")
        ]

    # -- the MCP server -------------------------------------------------------------------
    def server(self, stdio_principal: Principal | None = None) -> Any:
        """The MCP server (the SDK's low-level ``Server``) whose handlers govern each call."""
        from mcp.server.lowlevel import Server  # noqa: PLC0415 - the mcp extra

        types = _mcp()

        def who_calls(ctx: Any) -> Principal:
            if stdio_principal is not None:
                return stdio_principal
            request = getattr(ctx, "request", None)
            header = "" if request is None else request.headers.get("authorization", "")
            scheme, _, token = header.partition(" ")
            if scheme.lower() != "bearer" or not token:
                raise _error(types.INVALID_REQUEST, "a Charter credential is needed (Bearer)")
            try:
                return self.principal(token.strip())
            except CharterError as exc:
                raise _error(types.INVALID_REQUEST, exc.message) from None

        async def list_tools(ctx: Any, params: Any) -> Any:
            who = who_calls(ctx)
            tools = [
                tool.model_copy(update={"name": f"{u}{self.config.separator}{tool.name}"})
                for u, tool in self.allowed(who)
            ]
            return types.ListToolsResult(tools=tools)

        async def call_tool(ctx: Any, params: Any) -> Any:
            who = who_calls(ctx)
            upstream, tool = self._tool(who, params.name, types)
            arguments = params.arguments or {}
            meta = dict(params.meta or {})
            rule = self.config.rule(f"{upstream.name}.{tool}")
            session = getattr(getattr(ctx, "session", None), "session_id", None)
            key = call_key(
                tool,
                arguments,
                meta,
                same_call_seconds=rule.same_call_seconds,
                request=f"{session}:{ctx.request_id}" if session else _unique(),
            )
            mission = self.config.clients[who.name].mission
            answer = await self.calls.call(
                who, mission=mission, tools=upstream, tool=tool, arguments=arguments, key=key
            )
            return _result(answer, types)

        return Server("charter-gateway", on_list_tools=list_tools, on_call_tool=call_tool)

    def _tool(self, who: Principal, name: str, types: Any) -> tuple[UpstreamTools, str]:
        """The upstream and tool ``name`` names, if ``who`` may run it; else the
        same error as for a tool that does not exist (nothing is told of it)."""
        upstream_name, sep, tool = name.partition(self.config.separator)
        upstream = self.upstreams.get(upstream_name)
        known = sep and upstream is not None and tool in upstream.tools
        contract = self.engine.contract(self.config.clients[who.name].mission)
        if not known or not contract.allows(who.name, Right.RUN, f"{upstream_name}.{tool}"):
            raise _error(types.INVALID_PARAMS, f"unknown tool {name!r}")
        assert upstream is not None
        return upstream, tool

    # -- transports -----------------------------------------------------------------------
    async def serve_stdio(self) -> None:
        """Serve the configuration's stdio client on this process's stdin/stdout."""
        from mcp.server.stdio import stdio_server  # noqa: PLC0415 - the mcp extra

        name = self.config.stdio_client
        client = None if name is None else self.config.clients[name]
        if client is None or client.credential is None:
            raise ConfigError("a stdio gateway needs [gateway] stdio_client with a credential")
        who = self.principal(secret(client.credential))
        server = self.server(stdio_principal=who)
        async with stdio_server() as (read, write):
            await server.run(read, write, server.create_initialization_options())

    def http_app(self) -> Any:
        """The streamable HTTP app at ``/mcp``, behind the gateway's own door: the
        credential is checked before the body is read, and the body is bounded."""
        server = self.server()
        inner = server.streamable_http_app(
            max_request_body_size=MAX_BODY, session_idle_timeout=600.0
        )

        async def door(scope: Scope, receive: Receive, send: Send) -> None:
            if scope["type"] == "http" and not self._admitted(scope):
                self.refused += 1
                await _plain(send, 401, b'{"error": "a Charter credential is needed (Bearer)"}')
                return
            await inner(scope, receive, send)

        return door

    def _admitted(self, scope: Scope) -> bool:
        headers = dict(scope.get("headers") or [])
        scheme, _, token = headers.get(b"authorization", b"").decode("latin-1").partition(" ")
        if scheme.lower() != "bearer" or not token:
            return False
        try:
            self.principal(token.strip())
        except CharterError:
            return False
        return True


def _error(code: int, message: str) -> Exception:
    from mcp.shared.exceptions import MCPError  # noqa: PLC0415 - the mcp extra

    return MCPError(code, message)


def _result(answer: Answer, types: Any) -> Any:
    """The client's ``CallToolResult``: the upstream's, or the gateway's own word."""
    if answer.result is not None:
        return types.CallToolResult.model_validate(dict(answer.result))
    said = dict(answer.charter or {})
    text = said.get("message") or said.get("status") or "refused"
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=str(text))],
        structured_content={"charter": said},
        is_error=True,
    )


def _unique() -> str:
    import uuid  # noqa: PLC0415 - only a call with no identity of its own needs one

    return uuid.uuid4().hex


async def _plain(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
