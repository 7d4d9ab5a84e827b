"""The example's graph without Charter: what LangGraph does alone when killed.

``python _langgraph_plain.py CONFIG.json``: the same tool-calling loop, model
(``ChatOpenAI`` at the fake provider) and checkpointer as
examples/langgraph_agent.py, with plain tools: ``pay`` sends the sandbox a key
of its own making (a fresh UUID, as a tool with no record to draw one from
does). ``step`` is ``start`` (the task on a new thread) or ``resume`` (the
same thread, from its checkpoint: ``invoke(None)``). With ``kill`` set, the
process SIGKILLs itself once the sandbox answered the payment, before the
tool returns: after the payment was applied, before LangGraph recorded it.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import uuid
from pathlib import Path
from typing import Any

import httpx
from langchain_core.messages import HumanMessage
from langchain_core.tools import tool
from langgraph.prebuilt import ToolNode

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import langgraph_agent as example


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())

    @tool
    def pay(payee: str, amount: int, reference: str) -> dict[str, Any]:
        """Pay ``amount`` cents to ``payee``."""
        body = {"amount": amount, "currency": "usd", "payee": payee, "reference": reference}
        headers = {"Idempotency-Key": str(uuid.uuid4())}
        paid = httpx.post(f"{cfg['sandbox_url']}/v1/payments", json=body, headers=headers)
        if cfg.get("kill"):
            os.kill(os.getpid(), signal.SIGKILL)
        payment: dict[str, Any] = paid.json()
        return payment

    tools = [example.quote, pay]
    thread = {"configurable": {"thread_id": cfg["thread"]}}
    with example.checkpointer(cfg["checkpoints"]) as saver:
        graph = example.build_graph(
            example.chat_model(cfg["model_url"]), ToolNode(tools), tools, saver
        )
        task = {"messages": [HumanMessage(cfg["task"])]} if cfg["step"] == "start" else None
        state = graph.invoke(task, thread, durability="sync")
    print(json.dumps({"completed": state["messages"][-1].content}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
