"""The peak memory of one Python command, its own and no other process's.

Every peak RSS on the bench's page comes from :func:`run_python`: the command
runs under ``children/peak.py``, which reads ``VmHWM`` in the command's own
process as it exits. Linux's ``ru_maxrss`` for a child (``wait4``,
``RUSAGE_CHILDREN``) would also take in the launching process's peak, and
``RUSAGE_CHILDREN`` every earlier child's besides.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from timing import clock

WRAPPER = Path(__file__).resolve().parent / "children" / "peak.py"


@dataclass(frozen=True)
class Finished:
    """One command, run to its end."""

    seconds: float  # from start to exit, the wrapper's few lines included
    peak_bytes: int
    returncode: int
    stdout: str
    stderr: str


def installed_env() -> dict[str, str]:
    """The environment with Python's bytecode cache on, as an installed package has it.

    Without the cache every process compiles every module it imports, which
    costs time and raises its peak memory (by about 5 MB for ``import charter``).
    The first run writes the cache, so each measurement starts with a warm-up.
    """
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


def run_python(
    args: list[str],
    *,
    python: str = sys.executable,
    cwd: Path | str | None = None,
    env: dict[str, str] | None = None,
) -> Finished:
    """``python *args`` in a process of its own; its wall time, peak RSS and output.

    Output goes to files, not pipes, so a command that writes much never
    waits on a reader."""
    with (
        tempfile.TemporaryDirectory(prefix="peak-") as scratch,
        tempfile.TemporaryFile("w+") as out,
        tempfile.TemporaryFile("w+") as err,
    ):
        report = Path(scratch) / "peak"
        t0 = clock()
        proc = subprocess.run(
            [python, str(WRAPPER), str(report), *args],
            stdout=out,
            stderr=err,
            cwd=cwd,
            env=env,
            check=False,
        )
        seconds = clock() - t0
        out.seek(0)
        err.seek(0)
        stdout, stderr = out.read(), err.read()
        if not report.exists():
            raise RuntimeError(
                f"`python {' '.join(args)}` exited ({proc.returncode}) without reporting "
                f"its peak memory (did it call os._exit?): {stderr[-2000:]}"
            )
        peak = int(report.read_text())
    return Finished(seconds, peak, proc.returncode, stdout, stderr)
