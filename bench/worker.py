"""Run one measurement in its own process: ``worker.py TASK OUT.json ARGS.json``.

Each framework is measured in a process of its own, so that no peer's
threads, caches or imports weigh on another's figures (DBOS, for one, is a
process-wide singleton with background threads).
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _tasks() -> dict[str, Callable[..., Any]]:
    import auditverify
    import charter_bench
    import fleet
    import gateway
    import peers
    import remote
    import streams
    import wakes

    return {
        "charter.attempts": charter_bench.attempt_overhead,
        "charter.concurrent": charter_bench.concurrent_attempts,
        "charter.streams.postgres": streams.postgres_streams,
        "charter.fleet.postgres": fleet.measure,
        "charter.wakes": wakes.measure,
        "charter.remote": remote.measure,
        "charter.gateway": gateway.measure,
        "charter.profile": charter_bench.profile_attempts,
        "charter.recovery": charter_bench.recovery,
        "charter.memory": charter_bench.memory,
        "charter.startup": charter_bench.startup,
        "charter.audit_verify": auditverify.audit_verify,
        "floor.sqlite": peers.floor_sqlite,
        "floor.postgres": peers.floor_postgres,
        "dbos": peers.dbos_steps,
        "langgraph.sqlite": peers.langgraph_sqlite,
        "langgraph.postgres": peers.langgraph_postgres,
    }


def main(argv: list[str]) -> int:
    task, out, args = argv[1], Path(argv[2]), json.loads(Path(argv[3]).read_text())
    # The machine's load beside every figure: a figure taken while other work
    # ran says so (1-minute load average before and after the task).
    before = os.getloadavg()[0]
    result = _tasks()[task](**args)
    if isinstance(result, dict) and "sample" in result:
        result["load"] = [before, os.getloadavg()[0]]
    out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
