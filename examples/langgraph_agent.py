"""A LangGraph agent as a Charter mission: a model, a price lookup, a payment.

The graph is LangGraph's tool-calling loop (an ``agent`` node calling a chat
model, a ``ToolNode``, ``tools_condition`` between them), compiled with
LangGraph's own checkpointer, SQLite or PostgreSQL, which stays the graph's
memory (:mod:`charter.integrations.langgraph`):

- every model call (``ChatOpenAI``) is a ``read_only`` attempt ``chat.chat``,
  priced from its usage in micro-dollars and counted in input and output tokens;
- ``quote`` looks a price up: ``read_only``;
- ``pay`` pays through the payments sandbox with the attempt's idempotency key
  and fencing token: ``idempotent_keyed``, its cost the amount paid, and a
  lost call looked up by its key.

Run by ``tests/test_example_langgraph.py`` across processes, one step per
process, as ``python langgraph_agent.py CONFIG.json`` (the test writes the
configuration: the store, the checkpointer's database, the model's and the
sandbox's URLs): start a run, or resume one (``run``) as a segment; the step
prints the run's id, then the agent's answer. The graph's thread is the
run's node (``<run>/clerk``), so a resumed run goes on from its checkpoint.

Needs ``pip install 'charter[langgraph,http]'``: LangGraph, its checkpointers,
``langchain-openai``, and httpx, which the payments sandbox is reached with.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import HumanMessage, SystemMessage
from langchain_core.tools import tool
from langchain_openai import ChatOpenAI
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.postgres import PostgresSaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import START, MessagesState, StateGraph
from langgraph.prebuilt import tools_condition

import charter
from charter import EffectClass, Evidence, Operation, Outcome, RecordedAttempt
from charter.adapters.models import ModelUnits
from charter.integrations.langgraph import GovernedTools, ToolNode, current_send, invoke
from charter.integrations.langgraph_models import ChatModelCalls
from charter.testing import kill_at

PRICES = {"survey": 12_00}  # in cents
MICROS_PER_CENT = 10_000  # the allowance counts dollars in micro-dollars
MAX_TOKENS = 200

CONTRACT = {
    "objective": "Buy the survey the team needs",
    "principals": {
        "agent": {"run": ["chat.*", "tools.*"]},
        "ops": ["approve", "consume", "resolve", "stop", "run", "raise_limit"],
    },
    "allowance": {"usd": 50_000_000, "input_tokens": 20_000, "output_tokens": 1_000},
    "units": {"usd": {"scale": 6, "name": "USD"}},
}


@tool
def quote(item: str) -> int:
    """The price of ``item``, in cents."""
    return PRICES[item]


def paying(sandbox_url: str) -> Any:
    """The ``pay`` tool: a payment through the sandbox, with the attempt's key."""

    @tool
    def pay(payee: str, amount: int, reference: str) -> dict[str, Any]:
        """Pay ``amount`` cents to ``payee``."""
        send = current_send()
        headers = {"Idempotency-Key": send.idempotency_key, "X-Fencing-Token": send.fencing_token}
        body = {"amount": amount, "currency": "usd", "payee": payee, "reference": reference}
        paid = httpx.post(f"{sandbox_url}/v1/payments", json=body, headers=headers)
        paid.raise_for_status()
        payment: dict[str, Any] = paid.json()
        return payment

    return pay


def tools(sandbox_url: str) -> GovernedTools:
    """The agent's tools as Charter operations (an operator reconciles with these)."""

    def cost(payment: dict[str, Any]) -> dict[str, int]:
        return {"usd": int(payment["amount"]) * MICROS_PER_CENT}

    def lookup(attempt: RecordedAttempt) -> Evidence:
        """The sandbox by key: a payment it holds, or the proof it holds none."""
        found = httpx.get(f"{sandbox_url}/v1/payments/by-key/{attempt.idempotency_key}")
        if found.status_code == 404:
            return Evidence.not_applied({"lookup": "no payment for this key"})
        found.raise_for_status()
        return Evidence.applied(Outcome.succeeded(found.json(), cost=cost(found.json())))

    return GovernedTools(
        [quote, paying(sandbox_url)],
        effects={
            "quote": EffectClass.READ_ONLY,
            "pay": Operation(EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=86_400),
        },
        costs={"pay": cost},
        lookups={"pay": lookup},
    )


def build_graph(
    model: Any, tool_node: Any, tool_list: list[Any], saver: BaseCheckpointSaver
) -> Any:
    """LangGraph's tool-calling loop on ``model`` and ``tool_node``."""
    bound = model.bind_tools(tool_list)

    def agent(state: MessagesState) -> dict[str, Any]:
        prompt = SystemMessage("Find the survey's price, pay the survey vendor, then say so.")
        return {"messages": [bound.invoke([prompt, *state["messages"]])]}

    graph = StateGraph(MessagesState)
    graph.add_node("agent", agent)
    graph.add_node("tools", tool_node)
    graph.add_edge(START, "agent")
    graph.add_conditional_edges("agent", tools_condition)
    graph.add_edge("tools", "agent")
    return graph.compile(checkpointer=saver)


def chat_model(model_url: str) -> ChatOpenAI:
    return ChatOpenAI(
        model="gpt-4o-mini", base_url=model_url, api_key="sk-test", max_tokens=MAX_TOKENS,
        max_retries=0,
    )  # fmt: skip


@contextmanager
def checkpointer(address: str) -> Iterator[BaseCheckpointSaver]:
    """LangGraph's saver on ``address``: a PostgreSQL URL, or a SQLite file."""
    if address.startswith("postgresql://"):
        with PostgresSaver.from_conn_string(address) as saver:
            saver.setup()
            yield saver
    else:
        with SqliteSaver.from_conn_string(address) as saver:
            yield saver


def build_plan(model_url: str, sandbox_url: str, saver: BaseCheckpointSaver) -> charter.Plan:
    calls = ChatModelCalls(chat_model(model_url), units=ModelUnits())
    governed = tools(sandbox_url)
    graph = build_graph(calls.model, ToolNode(governed), governed.tools, saver)

    @charter.node
    def clerk(ctx: charter.Context, task: str) -> str:
        state = invoke(ctx, graph, {"messages": [HumanMessage(task)]})
        return str(state["messages"][-1].content)

    return charter.Plan("clerk", (clerk,))


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    hook = kill_at(cfg["kill_at"], cfg["nth"]) if cfg.get("kill_at") else None
    config = charter.EngineConfig(credentials=cfg["digests"])
    with (
        charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine,
        checkpointer(cfg["checkpoints"]) as saver,
    ):
        me = engine.authenticate(cfg["credential"])
        ex = (
            engine.coordinator.resume(cfg["run"], cfg["segment"], by=me)
            if "run" in cfg
            else engine.start_run(cfg["mission"], by=me, segment_id="seg-1", input=cfg["task"])
        )
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        try:
            result = ex.execute(build_plan(cfg["model_url"], cfg["sandbox_url"], saver))
        except charter.Blocked as blocked:
            print(json.dumps({"blocked": blocked.reason}), flush=True)
            return 0
        print(json.dumps({"completed": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
