"""DBOS's side of "a fresh process resumes after SIGKILL".

``resume_dbos.py crash DIR`` runs a two-step workflow and dies by SIGKILL when
the second step starts. ``resume_dbos.py resume DIR`` is the fresh process:
``DBOS.launch()`` recovers the pending workflow (same executor, same
application version), the first step's recorded output is replayed, and
``RESUMED`` is printed when the second step starts.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from dbos import DBOS, SetWorkflowID

#: The first process dies at the second step; the fresh one carries on.
CRASH = sys.argv[1:2] == ["crash"]
WORKFLOW_ID = "bench-resume"


@DBOS.step()
def first() -> int:
    return 1


@DBOS.step()
def second() -> int:
    if CRASH:
        os.kill(os.getpid(), signal.SIGKILL)
    print("RESUMED", flush=True)
    return 2


@DBOS.workflow()
def flow() -> int:
    return int(first() + second())


def main(argv: list[str]) -> int:
    workdir = Path(argv[2])
    url = f"sqlite:///{workdir / 'dbos.sqlite'}"
    DBOS(config={"name": "charter-bench-resume", "system_database_url": url})
    DBOS.launch()
    try:
        if CRASH:
            with SetWorkflowID(WORKFLOW_ID):
                flow()
        else:
            result = DBOS.retrieve_workflow(WORKFLOW_ID).get_result()
            print("DONE", result, flush=True)
    finally:
        DBOS.destroy()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
