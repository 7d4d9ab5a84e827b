"""Charter's side of "a fresh process resumes after SIGKILL".

``resume_charter.py crash DIR`` starts a run of a two-node plan and dies by
SIGKILL when the second node starts (the first one completed, its attempt
settled). ``resume_charter.py resume DIR`` is the fresh process: it opens the
store, resumes the run as a new segment (recover + resume policy) and prints
``RESUMED`` when the second node starts again.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

import charter
from charter.testing import RecordingAdapter, credential

ADAPTER = RecordingAdapter()
#: The first process dies at the second step; the fresh one carries on.
CRASH = sys.argv[1:2] == ["crash"]
CONTRACT = {
    "objective": "benchmark: resume after a kill",
    "principals": {"agent": {"run": ["recorder.*"]}},
    "allowance": {"calls": 1_000},
}


@charter.node
def first(ctx: charter.Context, value: Any) -> Any:
    return ctx.attempt(ADAPTER, "write", {"step": 1, "input": value})


@charter.node
def second(ctx: charter.Context, value: Any) -> Any:
    if CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    print("RESUMED", flush=True)
    return ctx.attempt(ADAPTER, "write", {"step": 2, "previous": value})


PLAN = charter.Plan("bench-resume", (first, second))


def crash(workdir: Path) -> None:
    cred, digest = credential("agent")
    # A short lease so the next owner may take over soon after the kill.
    config = charter.EngineConfig(
        credentials={"agent": digest}, lease_seconds=1.0, send_deadline_seconds=1.0
    )
    engine = charter.Engine.open(str(workdir / "charter.db"), config=config)
    agent = engine.authenticate(cred)
    mission = engine.create_mission(CONTRACT, by=agent)
    ex = engine.start_run(mission, by=agent, segment_id="seg-1", plan=PLAN, input={"k": 0})
    spec = {"credential": cred, "digest": digest, "run_id": ex.run_id}
    (workdir / "charter.json").write_text(json.dumps(spec))
    ex.execute(PLAN)


def resume(workdir: Path) -> None:
    spec = json.loads((workdir / "charter.json").read_text())
    config = charter.EngineConfig(credentials={"agent": spec["digest"]})
    with charter.Engine.open(str(workdir / "charter.db"), config=config) as engine:
        agent = engine.authenticate(spec["credential"])
        ex = engine.coordinator.resume(spec["run_id"], "seg-2", by=agent)
        ex.execute(PLAN)
        print("DONE", engine.run(spec["run_id"]).status.value, flush=True)


def main(argv: list[str]) -> int:
    workdir = Path(argv[2])
    (crash if CRASH else resume)(workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
