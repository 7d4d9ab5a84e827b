"""The child process of ``test_tally.py``: one executor settling attempts on one
run until it is killed at a crash point.

Run as ``python _tally_child.py CONFIG.json``; the configuration names the store,
the credential digests, the agent's credential, the mission, the crash point and
how many times it passes it before the SIGKILL. It prints the run's id first.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import charter
from charter.testing import RecordingAdapter, kill_at

#: More attempts than the kill can wait for: the process never ends by itself.
ATTEMPTS = 200


def main() -> None:
    config = json.loads(Path(sys.argv[1]).read_text())
    engine = charter.Engine.open(
        config["store"],
        config=charter.EngineConfig(credentials=config["digests"]),
        crash_hook=kill_at(config["point"], config["nth"]),
    )
    agent = engine.authenticate(config["agent"])
    ex = engine.start_run(config["mission"], by=agent, segment_id="child")
    print(ex.run_id, flush=True)
    adapter = RecordingAdapter(costs={"write": {"usd": 10, "calls": 1}})
    for n in range(ATTEMPTS):
        ex.perform(adapter, "write", {"n": n}, effect_key=f"e{n}")
    sys.exit(2)  # the crash point was never reached


if __name__ == "__main__":
    main()
