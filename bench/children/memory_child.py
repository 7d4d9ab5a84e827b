"""Open a store that holds many finished runs, execute one more.

``memory_child.py STORE SPEC.json`` prints one JSON line with the new run's
status. The bench runs it under ``peak.py``, which reports its peak RSS.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import charter
from charter.testing import RecordingAdapter

ADAPTER = RecordingAdapter()


@charter.node
def act(ctx: charter.Context, value: Any) -> Any:
    return ctx.attempt(ADAPTER, "write", value)


PLAN = charter.Plan("bench-memory", (act,))


def main(argv: list[str]) -> int:
    store, spec_path = argv[1], argv[2]
    spec = json.loads(Path(spec_path).read_text())
    config = charter.EngineConfig(credentials={"agent": spec["digest"]})
    with charter.Engine.open(store, config=config) as engine:
        agent = engine.authenticate(spec["credential"])
        ex = engine.start_run(spec["mission_id"], by=agent, segment_id="seg-1", plan=PLAN)
        ex.execute(PLAN, {"k": 1})
        status = engine.run(ex.run_id).status.value
    print(json.dumps({"status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
