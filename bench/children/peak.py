"""Run a Python command in this process; at exit, write its peak RSS to a file.

``peak.py REPORT -m MODULE ARGS...``, ``peak.py REPORT -c CODE ARGS...`` and
``peak.py REPORT SCRIPT ARGS...`` behave as ``python`` given the same
arguments (``sys.argv``, ``sys.path[0]``, ``__main__``), then write the
process's peak resident set size, in bytes, to ``REPORT``.

The process reports its own peak because nothing outside it can: on Linux a
child's ``ru_maxrss`` (from ``wait4``, ``RUSAGE_CHILDREN`` or
``/usr/bin/time``) also takes in the peak of the address space it replaced at
``exec`` — the launching process's own, when it was spawned by ``vfork`` as
Python's ``subprocess`` does — while ``VmHWM`` belongs to the address space
``exec`` created. This script imports nothing that ``python -m`` would not (``os`` rather than
``pathlib``, which ``import charter`` does not load).
"""

from __future__ import annotations

import atexit
import os
import sys


def peak_rss_bytes() -> int:
    """This address space's peak resident set size (``VmHWM``)."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:  # noqa: PTH123
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024  # kB
    except OSError:
        pass
    import resource  # not Linux: the nearest the platform offers

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return rss if sys.platform == "darwin" else rss * 1024


def _report(path: str) -> None:
    with open(path, "w", encoding="ascii") as out:  # noqa: PTH123
        out.write(str(peak_rss_bytes()))


def main(report: str, args: list[str]) -> None:
    # Registered first, so it runs after every exit handler the command registers.
    atexit.register(_report, report)
    if args[:1] == ["-c"]:
        sys.argv, sys.path[0] = ["-c", *args[2:]], ""
        exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        return
    import runpy  # ``python -m`` loads it too

    if args[:1] == ["-m"]:
        sys.argv, sys.path[0] = [args[1], *args[2:]], os.getcwd()  # noqa: PTH109
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        where = os.path.dirname(os.path.abspath(args[0]))  # noqa: PTH100, PTH120
        sys.argv, sys.path[0] = list(args), where
        runpy.run_path(args[0], run_name="__main__")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
