"""LangGraph's side of "a fresh process resumes after SIGKILL".

``resume_langgraph.py crash DIR`` runs a two-node graph (``durability="sync"``,
``SqliteSaver``) and dies by SIGKILL when the second node starts.
``resume_langgraph.py resume DIR`` is the fresh process: it invokes the graph
again on the same thread with no input, so it continues from the last
checkpoint, and prints ``RESUMED`` when the second node starts.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import sys
from pathlib import Path
from typing import TypedDict

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph

#: The first process dies at the second step; the fresh one carries on.
CRASH = sys.argv[1:2] == ["crash"]


class State(TypedDict):
    v: int


def first(state: State) -> dict[str, int]:
    return {"v": state["v"] + 1}


def second(state: State) -> dict[str, int]:
    if CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    print("RESUMED", flush=True)
    return {"v": state["v"] + 1}


def main(argv: list[str]) -> int:
    workdir = Path(argv[2])
    builder = StateGraph(State)
    builder.add_node("first", first)
    builder.add_node("second", second)
    builder.add_edge(START, "first")
    builder.add_edge("first", "second")
    builder.add_edge("second", END)
    conn = sqlite3.connect(str(workdir / "langgraph.sqlite"), check_same_thread=False)
    graph = builder.compile(checkpointer=SqliteSaver(conn))
    config: RunnableConfig = {"configurable": {"thread_id": "bench-resume"}}
    start: State | None = None if not CRASH else {"v": 0}
    out = graph.invoke(start, config, durability="sync")
    print("DONE", out["v"], flush=True)
    conn.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
