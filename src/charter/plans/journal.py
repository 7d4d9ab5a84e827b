"""What a run's nodes recorded, for reading: node executions and the journal (N1, A6).

A node execution is one try of one node in one run: its status, its checked
result and that result's hash (N1), and how often it crashed its process
(R6). The journal holds, per execution and in order, the nondeterministic
values a node asked for (``ctx.now()``, ``ctx.random()``, ``ctx.uuid()``), which
a replay returns unchanged (A6). These are plain records, read for operators
and tests on any store through :mod:`charter.plans.store`, which owns both
tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class NodeExecution:
    """One execution of one node of a run, as recorded.

    ``status`` is ``running`` (started, or its process died in it), ``blocked``
    (waiting for a decision, an unresolved attempt or a person), ``failed`` or
    ``completed``. Only a completed execution has a ``result`` (decoded from
    JSON) and its ``result_hash``, the SHA-256 of the stored JSON text that a
    consumer checks before it starts (N1). ``crashes`` counts the recoveries
    that found it running (R6). An execution carried over into a linked run
    names the run and execution it continues in ``inherited_run`` and
    ``inherited_execution`` (N4).
    """

    run_id: str
    node_id: str
    execution: int
    status: str
    result: Any
    result_hash: str | None
    error: str | None
    started_epoch: int
    crashes: int
    started_at_us: int
    completed_at_us: int | None
    inherited_run: str | None
    inherited_execution: int | None


@dataclass(frozen=True)
class JournalEntry:
    """One journaled value: the ``seq``-th nondeterministic value an execution asked
    for, of ``kind`` ``now`` (microseconds), ``random`` or ``uuid``; ``value`` is
    decoded from JSON."""

    run_id: str
    node_id: str
    execution: int
    seq: int
    kind: str
    value: Any
