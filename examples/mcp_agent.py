"""An agent on Charter whose tools are an MCP server's: a price lookup, a payment.

The agent step (``clerk``) calls a model through Charter's OpenAI adapter
(:mod:`charter.adapters.models.openai`, at ``model_url``) and the tools of an
MCP server it starts in process (the MCP SDK's server, reached through the
SDK's client, adapted by :class:`charter.integrations.mcp.McpTools`), under
an allowance in USD (micro-dollars) and tokens:

- every model call is a ``read_only`` attempt, priced from its usage;
- ``quote`` is annotated ``readOnlyHint``: ``read_only``;
- ``pay`` pays through the payments sandbox with the idempotency key and
  fencing token Charter sends in the call's ``_meta``; the sandbox
  deduplicates by that key, so it is declared ``idempotent_keyed``, and its
  cost is the amount paid.

MCP has no way to look a call up, so a payment lost in a crash is settled by
a person, with the sandbox's record as evidence.

Run by ``tests/test_example_mcp.py`` across processes, one step per process,
as ``python mcp_agent.py CONFIG.json`` (the test writes the configuration:
the store, the model's and the sandbox's URLs): start a run, or resume one
(``run``) as a segment; the step prints the run's id, then the agent's answer.

Needs ``pip install 'charter[mcp,openai,http]'``: the MCP SDK, the OpenAI model
adapter, and httpx, which the payments sandbox is reached with.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import _step as step
import httpx
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer
from mcp_types import ToolAnnotations

import charter
from charter import Estimate
from charter.adapters.models.openai import OpenAIModels
from charter.integrations.mcp import FENCE_META, KEY_META, McpTools

PRICES = {"survey": 12_00}  # in cents
MICROS_PER_CENT = 10_000  # the allowance counts dollars in micro-dollars
MAX_TOKENS = 200
TURNS = 6  # model calls a task may take

CONTRACT = {
    "objective": "Buy the survey the team needs",
    "principals": {
        "agent": {"run": ["models.*", "tools.*"]},
        "ops": ["approve", "resolve", "stop", "run"],
    },
    "allowance": {"usd": 50_000_000, "input_tokens": 20_000, "output_tokens": 2_000},
    "units": {"usd": {"scale": 6, "name": "USD"}},
}


def server(sandbox_url: str) -> MCPServer:
    """The MCP server the agent's tools live on."""
    desk = MCPServer("desk")

    @desk.tool(annotations=ToolAnnotations(read_only_hint=True))
    def quote(item: str) -> int:
        """The price of ``item``, in cents."""
        return PRICES[item]

    @desk.tool()
    async def pay(payee: str, amount: int, reference: str, ctx: Context) -> dict[str, Any]:
        """Pay ``amount`` cents to ``payee``, once per Charter attempt."""
        meta = ctx.request_context.meta or {}
        headers = {"Idempotency-Key": meta[KEY_META], "X-Fencing-Token": meta[FENCE_META]}
        body = {"amount": amount, "currency": "usd", "payee": payee, "reference": reference}
        async with httpx.AsyncClient(base_url=sandbox_url, timeout=5.0) as http:
            paid = await http.post("/v1/payments", json=body, headers=headers)
        paid.raise_for_status()
        payment: dict[str, Any] = paid.json()
        return payment

    return desk


class Tools(McpTools):
    """The desk's tools, ``pay`` charged the amount it pays (the declared costs
    of :class:`McpTools` are fixed per tool)."""

    def estimate(self, operation: str, request: Any) -> Estimate:
        if operation == "pay":
            return Estimate({"usd": int(request["amount"]) * MICROS_PER_CENT}, "desk/amount")
        return Estimate({}, "desk/free")


def answer(value: Any) -> str:
    """A tool's result as the model reads it (the SDK wraps a bare value in ``result``)."""
    return json.dumps(value["result"] if isinstance(value, dict) and "result" in value else value)


def build_plan(model_url: str, sandbox_url: str) -> charter.Plan:
    models = OpenAIModels(base_url=model_url, api_key="sk-test", name="models")

    @charter.node
    async def clerk(ctx: charter.Context, task: str) -> str:
        # The session belongs to this node's event loop: opened and closed here.
        async with Client(server(sandbox_url)) as client:
            tools = await Tools.connect(client, name="tools", keyed={"pay": 86_400})
            functions = [
                {
                    "type": "function",
                    "function": {
                        "name": t.name,
                        "description": t.description,
                        "parameters": t.input_schema,
                    },
                }
                for t in tools.tools.values()
            ]
            messages: list[dict[str, Any]] = [{"role": "user", "content": task}]
            for turn in range(TURNS):
                request = {
                    "model": "gpt-4o-mini",
                    "messages": messages,
                    "tools": functions,
                    "max_tokens": MAX_TOKENS,
                }
                done = await ctx.aattempt(models, "chat", request, key=f"turn-{turn}")
                message = done["choices"][0]["message"]
                messages.append(message)
                if not message.get("tool_calls"):
                    return str(message["content"])
                for call in message["tool_calls"]:
                    name, args = call["function"]["name"], json.loads(call["function"]["arguments"])
                    value = await ctx.aattempt(tools, name, args, key=call["id"])
                    messages.append(
                        {"role": "tool", "tool_call_id": call["id"], "content": answer(value)}
                    )
        raise RuntimeError(f"the agent did not finish in {TURNS} model calls")

    return charter.Plan("clerk", (clerk,))


if __name__ == "__main__":
    sys.exit(step.main(sys.argv[1:], build_plan))
