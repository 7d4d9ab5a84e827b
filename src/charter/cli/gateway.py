"""``charter gateway``: serve the MCP gateway, or check its configuration (G1).

``charter gateway --config gateway.toml`` serves streamable HTTP on
``--host``/``--port`` (``/mcp``), or the configuration's stdio client with
``--stdio``; ``charter gateway check --config gateway.toml`` reads the file,
connects to every upstream and prints one line per problem (exit 1), or that
all is well. Here ``--config`` names the gateway's file; the engine's own
configuration and store are named in its ``[engine]`` table (or found as for
every command: ``--store``, ``$CHARTER_CONFIG``, ``./charter.toml``).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Mapping
from typing import Any

from charter.errors import CharterError, ConfigError, UsageError

COMMANDS = {
    "gateway": "serve MCP clients in front of upstream MCP servers, each tool call an attempt "
    "(extra charter[mcp]); 'check' validates a gateway configuration",
}


def gateway_arguments(cmd: Mapping[str, argparse.ArgumentParser]) -> None:
    g = cmd["gateway"]
    g.add_argument("action", nargs="?", choices=["serve", "check"], default="serve",
                   help="serve (default), or check the configuration and upstreams")  # fmt: skip
    g.add_argument("--stdio", action="store_true", help="serve the configured stdio client")
    g.add_argument("--host", default="127.0.0.1", help="HTTP address (default loopback)")
    g.add_argument("--port", type=int, default=8766, help="HTTP port (default 8766)")
    g.add_argument("--instance", default="gateway",
                   help="this gateway's name in its segments (default 'gateway')")  # fmt: skip


def run_gateway(args: argparse.Namespace) -> int:
    """The gateway command; its exit status."""
    import asyncio  # noqa: PLC0415 - loaded when run: `charter --help` starts no event loop

    from charter import Engine, EngineConfig  # noqa: PLC0415 - loaded when run
    from charter.gateway import Gateway, GatewayConfig  # noqa: PLC0415 - the mcp extra, when run

    if not args.config:
        raise UsageError("charter gateway needs --config GATEWAY.toml (see docs/gateway.md)")
    config = GatewayConfig.from_file(args.config)
    engine_config = (
        EngineConfig.from_file(config.engine_config)
        if config.engine_config
        else EngineConfig.discover()
    )
    store = config.store or args.store
    with Engine.open(store, config=engine_config, create=False) as engine:
        gateway = Gateway(engine, config, instance=args.instance)
        if args.action == "check":
            return asyncio.run(_check(gateway))
        try:
            asyncio.run(_serve(gateway, args))
        except BaseExceptionGroup as group:
            raise _alone(group) from None
    return 0


def _alone(group: BaseExceptionGroup[BaseException]) -> BaseException:
    """The upstreams' sessions run in task groups, which wrap what the serving
    raised: a lone Charter error (a port that cannot be bound) is itself, typed;
    anything else stays the group."""
    inner: BaseException = group
    while isinstance(inner, BaseExceptionGroup) and len(inner.exceptions) == 1:
        inner = inner.exceptions[0]
    return inner if isinstance(inner, CharterError) else group


async def _check(gateway: Any) -> int:
    from charter.gateway.config import problems  # noqa: PLC0415 - the mcp extra

    try:
        async with gateway.connected():
            listed = {n: list(u.tools) for n, u in gateway.upstreams.items()}
    except Exception as exc:  # an upstream that cannot be reached is a problem to report
        print(f"an upstream could not be reached: {type(exc).__name__}: {exc}")
        return 1
    found = problems(gateway.config, listed)
    for mission in {c.mission for c in gateway.config.clients.values()}:
        try:
            gateway.engine.mission(mission)
        except CharterError:
            found.append(f"mission {mission} is not in this store")
    for line in found:
        print(line)
    if not found:
        tools = sum(len(t) for t in listed.values())
        print(f"ok: {len(listed)} upstream(s), {tools} tool(s), {len(gateway.config.clients)} "
              "client(s)")  # fmt: skip
    return 1 if found else 0


async def _serve(gateway: Any, args: argparse.Namespace) -> None:
    async with gateway.connected():
        if args.stdio:
            await gateway.serve_stdio()
            return
        try:
            import uvicorn  # noqa: PLC0415 - the server extra
        except ImportError:
            raise ConfigError(
                "an HTTP gateway needs uvicorn: pip install 'charter[server]'"
            ) from None
        from charter.server import announcing, bound  # noqa: PLC0415 - the server extra

        def say(base: str) -> None:  # once the port is bound: port 0 says which it is
            print(f"gateway: {base}/mcp (Ctrl-C stops it)", file=sys.stderr, flush=True)

        config = uvicorn.Config(
            gateway.http_app(), host=args.host, port=args.port, log_level="warning"
        )
        server = announcing(config, say)
        with bound(server):
            await server.serve()
