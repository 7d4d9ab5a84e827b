"""Whether the process that held a run is provably gone (R1).

A run's lease is how another worker knows its owner may be dead: it waits the
lease out. When the owner ran on *this* machine, the wait is needless once the
owner's process is gone, and the operating system can say so: the run records
which process holds it (the host, the pid, and the process's start time), and
a worker on the same host, booted once, in the same pid namespace, reads
``/proc``. The owner is provably dead when its pid is gone, is a zombie, or
now belongs to a process that started later (the pid was reused). Anything
else — another host, another boot, another container, no ``/proc`` — proves
nothing, and the lease rules stand.

A process may hold a run only while it is itself: a segment refuses to write
from a forked child (see :class:`charter.runs.ownership.Segment`), so a dead
parent cannot leave a child sending on its behalf.
"""

from __future__ import annotations

import json
import os
import socket
from dataclasses import dataclass
from pathlib import Path

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessIdentity:
    """One OS process, told apart from any later one that reuses its pid."""

    host: str
    pid: int
    started: str

    def to_json(self) -> str:
        return json.dumps({"host": self.host, "pid": self.pid, "started": self.started})

    @classmethod
    def from_json(cls, text: str | None) -> ProcessIdentity | None:
        """The identity recorded, or ``None`` for none or one this code cannot read."""
        try:
            data = json.loads(text or "null")
            identity = cls(str(data["host"]), int(data["pid"]), str(data["started"]))
        except (TypeError, ValueError, KeyError):
            return None
        return identity if identity.pid > 0 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _host() -> str | None:
    """This machine, this boot, this pid namespace; ``None`` without ``/proc``."""
    boot = _read(_PROC / "sys/kernel/random/boot_id")
    try:
        namespace = str((_PROC / "self/ns/pid").readlink())
    except OSError:
        return None
    return None if boot is None else f"{socket.gethostname()}/{boot}/{namespace}"


def _stat(pid: int) -> tuple[str, str] | None:
    """A process's state letter and start time (clock ticks after boot), or ``None``."""
    text = _read(_PROC / str(pid) / "stat")
    if text is None:
        return None
    fields = text[text.rfind(")") + 2 :].split()  # after the name, which may hold anything
    return fields[0], fields[19]


def current() -> ProcessIdentity | None:
    """This process, or ``None`` where it cannot be told apart (no ``/proc``)."""
    pid = os.getpid()
    if pid not in _CURRENT:  # a fork is another process: it reads its own
        host, stat = _host(), _stat(pid)
        _CURRENT[pid] = (
            None if host is None or stat is None else ProcessIdentity(host, pid, stat[1])
        )
    return _CURRENT[pid]


_CURRENT: dict[int, ProcessIdentity | None] = {}


def process_json() -> str | None:
    """This process's identity as the store records it beside a claim."""
    me = current()
    return None if me is None else me.to_json()


def owner_dead(recorded: str | None) -> bool:
    """Whether the process recorded as holding a run (its JSON) is certainly gone."""
    return provably_dead(ProcessIdentity.from_json(recorded))


def provably_dead(recorded: ProcessIdentity | None) -> bool:
    """Whether the recorded process is certainly gone; ``False`` whenever unsure."""
    if recorded is None or recorded.host != _host():
        return False
    stat = _stat(recorded.pid)
    if stat is None:
        return not (_PROC / str(recorded.pid)).exists()
    state, started = stat
    return state in ("Z", "X") or started != recorded.started
