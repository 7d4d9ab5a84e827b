"""An MCP server in front of the conformance kit's scripted HTTP target.

``python tests/_kit_upstream.py TARGET_URL`` serves, over stdio (``--http
PORT``: streamable HTTP on 127.0.0.1), the two tools a gateway's upstream
needs for the kit to drive it, written as an MCP server over an HTTP API is
(src/charter/sandbox/mcp.py is one):

- ``create(amount, currency, payee, reference)``: ``POST /v1/things`` with the
  idempotency key the caller put in ``_meta`` and the API key the server was
  given (``KIT_API_KEY`` in its environment; over HTTP, the bearer token its
  client presented); an error result for any answer but a thing.
- ``get_thing(idempotency_key)``: the thing made with that key, found in the
  target's list; an error result when the list holds no thing with that key
  (empty, another client's, several others) or the lookup fails.

Each request to the target gives up after ``TIMEOUT`` seconds, so the target's
held answers (the ``timeout`` cases) end as an error result of the tool.
"""

from __future__ import annotations

import argparse
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

from charter.server import announcing

KEY_META = "charter/idempotency_key"
TIMEOUT = 0.5
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ask(url: str, token: str, body: Any = None, key: str | None = None) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method="GET" if body is None else "POST")
    request.add_header("Authorization", f"Bearer {token}")
    if data is not None:
        request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Idempotency-Key", key)
    try:
        with _OPENER.open(request, timeout=TIMEOUT) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{exc.code}: {exc.read().decode(errors='replace')}") from None


def _token(ctx: Context) -> str:
    """The API key: this server's own (stdio), or its client's bearer token (HTTP)."""
    request = getattr(ctx.request_context, "request", None)
    header = "" if request is None else request.headers.get("authorization", "")
    if header.lower().startswith("bearer "):
        return header[len("bearer ") :]
    return os.environ["KIT_API_KEY"]


def build(base: str) -> MCPServer:
    server = MCPServer("things", log_level="CRITICAL")  # its errors are results, read by the kit
    api = base.rstrip("/") + "/v1/things"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
    def create(
        amount: int, currency: str, payee: str, reference: str, ctx: Context
    ) -> dict[str, Any]:
        """Create a thing of ``amount`` for ``payee``, once per idempotency key."""
        key = (ctx.request_context.meta or {}).get(KEY_META)
        if not isinstance(key, str) or not key:
            raise ValueError(f"create needs an idempotency key in _meta[{KEY_META!r}]")
        body = {"amount": amount, "currency": currency, "payee": payee, "reference": reference}
        thing: dict[str, Any] = _ask(api, _token(ctx), body, key)
        return thing

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def get_thing(idempotency_key: str, ctx: Context) -> dict[str, Any]:
        """The thing made with ``idempotency_key`` (an error when there is none)."""
        query = urllib.parse.urlencode({"key": idempotency_key})
        found = _ask(f"{api}?{query}", _token(ctx))
        mine = [t for t in found["data"] if t.get("key") == idempotency_key]
        if len(mine) != 1:
            raise LookupError(f"no thing was made with key {idempotency_key!r}")
        return dict(mine[0])

    return server


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--http", type=int, metavar="PORT")
    args = parser.parse_args()
    server = build(args.url)
    if args.http is None:
        server.run("stdio")
    else:
        # Its port on the first line once bound (port 0: the one the system chose).
        config = uvicorn.Config(server.streamable_http_app(), host="127.0.0.1", port=args.http)
        announcing(config, lambda base: print(base, flush=True)).run()


if __name__ == "__main__":
    main()
