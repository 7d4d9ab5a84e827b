"""The payments sandbox as an MCP server: what the gateway's five-minute start fronts.

``python -m charter.sandbox.mcp URL`` serves, over stdio, three tools on the
sandbox at ``URL`` (``--http PORT``: streamable HTTP on 127.0.0.1 instead):

- ``pay(payee, amount, currency, reference)``: ``POST /v1/payments`` with the
  idempotency key and fencing token the caller put in the call's ``_meta``
  (``charter/idempotency_key``, ``charter/fencing_token``); a call without a
  key is refused before anything is sent. Annotated idempotent: the sandbox
  answers the same key with the first payment.
- ``get_payment(idempotency_key)``: the payment made with that key, or an
  error result when there is none (read only).
- ``list_payments(reference)``: the payments with a client reference (read only).

An MCP server like any other, written on the MCP SDK's ``MCPServer`` (the
``mcp`` extra); it knows nothing of Charter but the two ``_meta`` keys it forwards.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.parse
import urllib.request
from typing import Any

from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

KEY_META = "charter/idempotency_key"
FENCE_META = "charter/fencing_token"
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _ask(
    url: str, method: str = "GET", body: Any = None, headers: dict[str, str] | None = None
) -> Any:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with _OPENER.open(request, timeout=30) as answer:
            return json.load(answer)
    except urllib.error.HTTPError as exc:
        raise RuntimeError(f"{exc.code}: {exc.read().decode(errors='replace')}") from None


def build(base: str) -> MCPServer:
    """The MCP server over the sandbox at ``base``."""
    server = MCPServer("payments")
    api = base.rstrip("/") + "/v1/payments"

    @server.tool(annotations=ToolAnnotations(idempotent_hint=True, destructive_hint=False))
    def pay(payee: str, amount: int, currency: str, reference: str, ctx: Context) -> dict[str, Any]:
        """Pay ``amount`` (in the currency's smallest unit) to ``payee``."""
        meta = dict(ctx.request_context.meta or {})
        key = meta.get(KEY_META)
        if not isinstance(key, str) or not key:
            raise ValueError(f"pay needs an idempotency key in _meta[{KEY_META!r}]")
        headers = {"Idempotency-Key": key}
        fence = meta.get(FENCE_META)
        if isinstance(fence, str):
            headers["X-Fencing-Token"] = fence
        body = {"payee": payee, "amount": amount, "currency": currency, "reference": reference}
        paid: dict[str, Any] = _ask(api, "POST", body, headers)
        return paid

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def get_payment(idempotency_key: str) -> dict[str, Any]:
        """The payment made with ``idempotency_key`` (an error when there is none)."""
        found: dict[str, Any] = _ask(f"{api}/by-key/{urllib.parse.quote(idempotency_key)}")
        return found

    @server.tool(annotations=ToolAnnotations(read_only_hint=True))
    def list_payments(reference: str) -> list[dict[str, Any]]:
        """The payments made with a client ``reference``."""
        found = _ask(f"{api}?{urllib.parse.urlencode({'reference': reference})}")
        return list(found["data"])

    return server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m charter.sandbox.mcp")
    parser.add_argument("url", help="the sandbox's base URL, e.g. http://127.0.0.1:8080")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP")
    args = parser.parse_args(argv)
    server = build(args.url)
    if args.http is None:
        server.run("stdio")
    else:
        server.run("streamable-http", host="127.0.0.1", port=args.http)


if __name__ == "__main__":
    main()
