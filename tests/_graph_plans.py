"""Plans for test_waits.py, importable by reference from a fresh process.

Run as a child process::

    python -c "import sys, _graph_plans; sys.exit(_graph_plans.main(sys.argv[1:]))" CONFIG.json

The configuration names the store, the credential digests, the agent's
credential, and either a mission and a plan reference (start a run) or a run
(resume it as a new segment, in this fresh process). ``kill_point`` arms a
SIGKILL at that crash point. The child prints JSON lines: the run, then
``result`` or ``blocked``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import charter
from charter.config import import_path
from charter.testing import kill_at


@charter.node
def ask(ctx: charter.Context, value: Any) -> dict[str, Any]:
    return {"budget": ctx.ask("budget", "What may the survey cost, in USD?", answer=int)}


@charter.node
def nap(ctx: charter.Context, value: Any) -> dict[str, Any]:
    ctx.sleep("cool-down", 2.0)
    return {"slept": True}


@charter.node
def hear(ctx: charter.Context, value: Any) -> dict[str, Any]:
    return {"heard": ctx.wait_for("arrival", "shipment.arrived")}


ask_plan = charter.Plan("ask", (ask,), ref="_graph_plans:ask_plan")
nap_plan = charter.Plan("nap", (nap,), ref="_graph_plans:nap_plan")
hear_plan = charter.Plan("hear", (hear,), ref="_graph_plans:hear_plan")


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    hook = kill_at(cfg["kill_point"]) if cfg.get("kill_point") else None
    config = charter.EngineConfig(credentials=cfg["digests"])
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        agent = engine.authenticate(cfg["credential"])
        if cfg.get("run_id") is None:
            plan = import_path(cfg["plan"])
            ex = engine.start_run(cfg["mission_id"], by=agent, segment_id="seg-1", plan=plan)
        else:
            # A run its nodes left waiting is let go: its owner's segment resumes it.
            segment = cfg.get("segment_id") or engine.run(cfg["run_id"]).owner_segment
            ex = engine.coordinator.resume(cfg["run_id"], segment, by=agent)
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        try:
            result = ex.execute()
        except charter.Blocked as exc:
            print(json.dumps({"blocked": exc.reason}), flush=True)
            return 0
        print(json.dumps({"result": result}), flush=True)
    return 0
