"""The governed MCP gateway (G1-G4): any MCP client's tool calls as Charter attempts.

``charter gateway --config gateway.toml`` serves MCP to clients over stdio or
streamable HTTP and fronts upstream MCP servers; every ``tools/call`` is an
attempt under the client's mission (docs/gateway.md). In Python::

    config = GatewayConfig.from_file("gateway.toml")
    gateway = Gateway(engine, config)
    async with gateway.connected():
        app = gateway.http_app()     # an ASGI app: serve it with uvicorn

Needs the ``mcp`` extra (``pip install 'charter[mcp]'``).
"""

from charter.gateway.config import GatewayConfig
from charter.gateway.server import Gateway

__all__ = ["Gateway", "GatewayConfig"]
