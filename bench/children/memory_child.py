"""Open a store that holds many finished runs, execute one more, report peak RSS.

``memory_child.py STORE SPEC.json`` prints one JSON line with the process's
peak resident set size; ``memory_child.py --baseline`` only imports Charter.
"""

from __future__ import annotations

import json
import resource
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


def peak_rss_bytes() -> int:
    """This process's peak resident set size.

    ``VmHWM`` is per address space, so it starts afresh at ``exec``;
    ``ru_maxrss`` would carry over the parent's peak from the ``fork``.
    """
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def main(argv: list[str]) -> int:
    if argv[1:] == ["--baseline"]:
        print(json.dumps({"max_rss_bytes": peak_rss_bytes()}))
        return 0
    store, spec_path = argv[1], argv[2]
    spec = json.loads(Path(spec_path).read_text())
    config = charter.EngineConfig(credentials={"agent": spec["digest"]})
    with charter.Engine.open(store, config=config) as engine:
        agent = engine.authenticate(spec["credential"])
        ex = engine.start_run(spec["mission_id"], by=agent, segment_id="seg-1", plan=PLAN)
        ex.execute(PLAN, {"k": 1})
        status = engine.run(ex.run_id).status.value
    print(json.dumps({"max_rss_bytes": peak_rss_bytes(), "status": status}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
