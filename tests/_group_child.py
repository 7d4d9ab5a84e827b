"""The child process of the group-commit kill test: threads making attempts
through one engine until the process is killed.

Run as ``python _group_child.py STORE DIGEST CREDENTIAL MISSION SENDS``. Four
threads each own a run and make attempts in a loop. The adapter appends each
idempotency key it is asked to send to the ``SENDS`` file (a line written with
one ``write``, so a kill cannot leave half of one) before answering. The child
prints ``ready`` once every thread has made one attempt, then goes on until it
is killed.
"""

from __future__ import annotations

import os
import sys
import threading

import charter
from charter.adapters import Dispatch, Outcome
from charter.testing import RecordingAdapter


class LoggingAdapter(RecordingAdapter):
    """Records every send in a file before it answers, as a target would."""

    def __init__(self, path: str) -> None:
        super().__init__()
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)

    def dispatch(self, send: Dispatch) -> Outcome:
        os.write(self._fd, (send.idempotency_key + "\n").encode())
        return super().dispatch(send)


def main(store: str, digest: str, cred: str, mission: str, sends: str) -> None:
    config = charter.EngineConfig(credentials={"agent": digest})
    engine = charter.Engine.open(store, config=config)
    agent = engine.authenticate(cred)
    adapter = LoggingAdapter(sends)
    started = threading.Barrier(5)

    def work(n: int) -> None:
        ex = engine.start_run(mission, by=agent, segment_id=f"seg-{n}")
        k = 0
        while True:
            ex.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")
            k += 1
            if k == 1:
                started.wait()

    for n in range(4):
        threading.Thread(target=work, args=(n,), daemon=True).start()
    started.wait()
    print("ready", flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    main(*sys.argv[1:6])
