"""One step of an example mission, in the process that runs it.

``python EXAMPLE.py CONFIG.json``: the configuration (written by the example's
test) names the store, the credential, the model's and the sandbox's URLs,
and either a mission to start a run on (``task`` its input) or a run to
resume as a segment. The step prints the run's id, then the plan's result;
a ``kill_at`` in the configuration kills it at that crash point.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import charter
from charter.testing import kill_at


def main(argv: list[str], build_plan: Callable[[str, str], charter.Plan]) -> int:
    """Run the plan ``build_plan(model_url, sandbox_url)`` for one step."""
    cfg = json.loads(Path(argv[0]).read_text())
    hook = kill_at(cfg["kill_at"], cfg["nth"]) if cfg.get("kill_at") else None
    config = charter.EngineConfig(credentials=cfg["digests"])
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        me = engine.authenticate(cfg["credential"])
        ex = (
            engine.coordinator.resume(cfg["run"], cfg["segment"], by=me)
            if "run" in cfg
            else engine.start_run(cfg["mission"], by=me, segment_id="seg-1", input=cfg["task"])
        )
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        result = ex.execute(build_plan(cfg["model_url"], cfg["sandbox_url"]))  # or Blocked, said
        print(json.dumps({"completed": result}), flush=True)
    return 0
