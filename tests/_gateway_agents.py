"""Agent frameworks' own MCP clients on `charter gateway`, their models the loopback fake.

The OpenAI Agents SDK (``agents.mcp``) and PydanticAI (``pydantic_ai.mcp``)
connect to the gateway as to any MCP server, over stdio or streamable HTTP,
nothing of Charter in the agent. The fake provider (tests/_fake_models.py)
plays the model: offered the gateway's tools, it asks for ``payments.pay``
under whatever name the framework offered it, then says what the tool
answered. The gateway names tools ``upstream.tool``; OpenAI's API refuses a
function name with a dot (it must match :data:`OPENAI_NAME`), so each
framework is shown with its own way of offering the model other names.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Coroutine
from typing import Any

from _fake_models import FakeProvider, function_call
from _gateway_world import World

#: A function name OpenAI's API accepts (chat completions and responses alike).
OPENAI_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
#: The gateway's name of the tool the model asks for.
TOOL = "payments.pay"
PAYMENT: dict[str, Any] = {"payee": "acme", "amount": 2_500, "currency": "usd", "reference": "a-1"}
#: The gateway, over stdio, starts a Python process that opens the store and
#: starts its upstream before it answers ``initialize``: on a loaded machine
#: longer than the frameworks' default of 5 s.
CONNECT_SECONDS = 60.0


def the_tool(offered: list[str]) -> str:
    """The offered name of the gateway's ``payments.pay`` (as is, or as the
    framework renamed it: its dot, and anything before it, replaced)."""
    [name] = [n for n in offered if re.sub(r"[^a-zA-Z0-9]+", "_", n).endswith("payments_pay")]
    return name


def said(output: str) -> str:
    """What the model says once the tool answered: the payment's id it was shown."""
    found = re.search(r"pay_[0-9]+", output)
    return f"paid {found.group(0) if found else 'nothing'}"


def responses_turns(kind: str, body: Any) -> list[dict[str, Any]]:
    """A Responses API model's turns: ask for the payment, then say what it returned."""
    outputs = [i for i in body["input"] if i.get("type") == "function_call_output"]
    if not outputs:
        name = the_tool([t["name"] for t in body["tools"]])
        return [function_call("call_pay", name, PAYMENT)]
    text = said(json.dumps(outputs[0]["output"]))
    content = [{"type": "output_text", "text": text, "annotations": []}]
    return [{"type": "message", "id": "m", "status": "completed", "role": "assistant",
             "content": content}]  # fmt: skip


def chat_turns(body: dict[str, Any]) -> dict[str, Any]:
    """A chat completions model's turns: ask for the payment, then say what it returned."""
    results = [m for m in body["messages"] if m["role"] == "tool"]
    if not results:
        name = the_tool([t["function"]["name"] for t in body["tools"]])
        call = {"id": "call_pay", "type": "function",
                "function": {"name": name, "arguments": json.dumps(PAYMENT)}}  # fmt: skip
        return {"role": "assistant", "content": None, "tool_calls": [call]}
    return {"role": "assistant", "content": said(json.dumps(results[0]["content"]))}


def offered(fake: FakeProvider) -> list[list[str]]:
    """The tool names each request the model received offered it."""
    return [
        sorted(t.get("name") or t["function"]["name"] for t in r.body.get("tools", []))
        for r in fake.received
    ]


async def openai_agents(w: World, fake: FakeProvider, transport: str, *, rename: bool) -> str:
    """The Agents SDK's agent, its MCP server the gateway; ``rename``: the SDK's
    ``include_server_in_tool_names`` (``mcp_gateway__payments_pay``)."""
    from agents import Agent, RunConfig, Runner
    from agents.mcp import MCPServerStdio, MCPServerStreamableHttp
    from agents.models.openai_responses import OpenAIResponsesModel
    from openai import AsyncOpenAI

    server: MCPServerStdio | MCPServerStreamableHttp
    if transport == "stdio":
        command, *args = w.command("--stdio")
        params = {"command": command, "args": args, "env": w.env()}
        server = MCPServerStdio(
            params, name="gateway", client_session_timeout_seconds=CONNECT_SECONDS
        )
    else:
        auth = {"Authorization": f"Bearer {w.creds['agent']}"}
        server = MCPServerStreamableHttp(
            {"url": w.url, "headers": auth},
            name="gateway",
            client_session_timeout_seconds=CONNECT_SECONDS,
        )
    async with AsyncOpenAI(base_url=fake.url + "/v1", api_key="sk-test") as client, server:
        agent = Agent(
            name="clerk",
            instructions="Pay what you are asked to pay.",
            model=OpenAIResponsesModel("gpt-4o-mini", client),
            mcp_servers=[server],
            mcp_config={"include_server_in_tool_names": rename},
        )
        result = await Runner.run(
            agent, "Pay acme 25 USD.", run_config=RunConfig(tracing_disabled=True)
        )
        return str(result.final_output)


async def pydantic_ai(w: World, fake: FakeProvider, transport: str, *, rename: bool) -> str:
    """PydanticAI's agent with an ``MCPToolset`` on the gateway; ``rename``: the
    toolset ``renamed`` to names without the dot."""
    from fastmcp.client.transports import StdioTransport
    from pydantic_ai import Agent
    from pydantic_ai.mcp import MCPToolset
    from pydantic_ai.models.openai import OpenAIChatModel
    from pydantic_ai.providers.openai import OpenAIProvider

    if transport == "stdio":
        command, *args = w.command("--stdio")
        log = w.tmp / "gateway-stdio.log"
        stdio = StdioTransport(command, args, env=w.env(), keep_alive=False, log_file=log)
        toolset: Any = MCPToolset(stdio, init_timeout=CONNECT_SECONDS)
    else:
        auth = {"Authorization": f"Bearer {w.creds['agent']}"}
        toolset = MCPToolset(w.url, headers=auth, init_timeout=CONNECT_SECONDS)
    if rename:
        names = ("payments.pay", "payments.get_payment")
        toolset = toolset.renamed({n.replace(".", "_"): n for n in names})
    provider = OpenAIProvider(base_url=fake.url + "/v1", api_key="sk-test")
    agent = Agent(OpenAIChatModel("gpt-4o-mini", provider=provider), toolsets=[toolset])
    async with agent:
        return str((await agent.run("Pay acme 25 USD.")).output)


#: Each framework's agent, and the fake model's turns in the wire format it speaks.
FRAMEWORKS: dict[str, tuple[Callable[..., Coroutine[Any, Any, str]], dict[str, Any]]] = {
    "openai-agents": (openai_agents, {"script": responses_turns}),
    "pydantic-ai": (pydantic_ai, {"chat": chat_turns}),
}
