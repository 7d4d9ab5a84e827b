"""A fresh process resumes after SIGKILL: wall time from its start to the resumed node.

For each framework and repetition, in a new directory:

1. a first process runs a two-step unit (Charter plan, DBOS workflow,
   LangGraph graph) and kills itself with SIGKILL when the second step
   starts — the first step is durably done;
2. after a pause of ``PAUSE`` seconds (Charter's crashed owner had a 1 s
   lease; every framework gets the same pause, and it is not timed)
3. a fresh process is started and timed from ``Popen`` until it prints
   ``RESUMED`` from the second step — interpreter start, imports, opening the
   store, recovery and replay of the first step included. The time until it
   exits (second step finished, run completed) is kept as well.

The children live in ``bench/children/`` and import only their framework.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import Any

from timing import Sample, clock

HERE = Path(__file__).resolve().parent
CHILDREN = HERE / "children"
PAUSE = 1.5
MARKER = "RESUMED"


def once(framework: str, python: str, workdir: Path) -> tuple[float, float]:
    """One kill and one timed fresh start; returns (to the resumed node, to exit)."""
    child = CHILDREN / f"resume_{framework}.py"
    workdir.mkdir(parents=True)
    crashed = subprocess.run(
        [python, str(child), "crash", str(workdir)],
        check=False,
        capture_output=True,
        text=True,
        timeout=300,
    )
    if crashed.returncode != -signal.SIGKILL:
        raise RuntimeError(
            f"{framework}: the first process was meant to die by SIGKILL, it exited "
            f"{crashed.returncode}:\n{crashed.stderr[-2000:]}"
        )
    time.sleep(PAUSE)
    errors = workdir / "resume.stderr"
    with errors.open("w") as log:
        t0 = clock()
        proc = subprocess.Popen(
            [python, str(child), "resume", str(workdir)],
            stdout=subprocess.PIPE,
            stderr=log,
            text=True,
        )
        assert proc.stdout is not None
        resumed = None
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if resumed is None and line.strip() == MARKER:
                resumed = clock() - t0
        code = proc.wait(timeout=300)
        done = clock() - t0
    if resumed is None or code != 0 or not any(x.startswith("DONE") for x in lines):
        raise RuntimeError(
            f"{framework}: the fresh process did not resume (exit {code}):\n"
            + "".join(lines)
            + errors.read_text()[-2000:]
        )
    return resumed, done


def measure(
    frameworks: list[str], python: str, workdir: Path, warmup: int, reps: int
) -> dict[str, Any]:
    """Interleaved: each repetition kills and resumes every framework in turn."""
    resumed = {f: Sample("s") for f in frameworks}
    to_exit = {f: Sample("s") for f in frameworks}
    for i in range(warmup + reps):
        for f in frameworks:
            first, done = once(f, python, workdir / f"{f}-{i}")
            kept = "warmup" if i < warmup else "values"
            getattr(resumed[f], kept).append(first)
            getattr(to_exit[f], kept).append(done)
    return {
        f: {"sample": resumed[f].to_dict(), "to_exit": to_exit[f].to_dict()} for f in frameworks
    }
