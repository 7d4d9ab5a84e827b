"""Named crash points at every durable boundary of the attempt path.

The engine calls its hook with each name below. In production the hook is
``None`` and the cost is a single ``is None`` test; tests install a hook (see
:func:`charter.testing.kill_at`) that kills the process there, for real. A crash
*inside* an adapter call is the adapter's to stage (it is user code).
"""

from __future__ import annotations

from collections.abc import Callable

CrashHook = Callable[[str], None]

#: Every named point, in the order an attempt passes them.
POINTS: tuple[str, ...] = (
    "admission.before",  # nothing recorded yet
    "admission.after",  # PREPARED committed (approval path only)
    "dispatch.before",  # about to commit DISPATCHED
    "dispatch.after",  # DISPATCHED committed, adapter not yet called
    "settlement.before",  # the adapter answered, settlement not committed
    "settlement.after",  # settlement committed
    "node.completed.before",  # a node's checked result is about to commit
    "node.completed.after",  # a node's checked result is committed
    "wait.pending",  # a node's wait (W1) is committed pending; the node has not stopped
    "notice.sent",  # a webhook answered a notice (K3); its delivery is not marked yet
)

#: Around every physical commit of a write, whatever it records: the hook sees
#: each one, in order, so a sweep can stop a workload at its k-th commit.
COMMIT_POINTS: tuple[str, ...] = ("commit.before", "commit.after")
