"""The shape of a plan: a DAG of node ids, checked before anything runs (N1, N3).

A plan names its nodes and what each one comes after. A sequence is the
special case where each node comes after the one before it. The shape is
checked whole, before any node runs and before any change made at run time
is recorded: a duplicate id, an unknown dependency or a cycle is a
:class:`~charter.errors.PlanError` and nothing is written.

This module knows node ids and function names only, never node functions,
so that a shape can be rebuilt in a fresh process from what the store
recorded (the plan's versions) and the plan object the run names.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from charter.errors import PlanError

#: A node id is part of effect ids (``run/node/execution/key``) and of paths
#: people type: no separators, no control characters.
_NODE_ID = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:@+=-]{0,199}")


@dataclass(frozen=True)
class Step:
    """A node a running node adds to its plan (N3).

    ``fn`` names one of the plan's node functions (a node of the plan or one
    it offers in ``functions``); ``after`` the nodes it waits for; ``input``,
    when given (JSON), is the value it receives instead of its dependencies'
    results (they only order it).
    """

    id: str
    fn: str
    after: tuple[str, ...] = ()
    input: Any = None

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "fn": self.fn, "after": list(self.after), "input": self.input}

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> Step:
        return cls(str(d["id"]), str(d["fn"]), tuple(d["after"]), d.get("input"))


@dataclass(frozen=True)
class Shape:
    """A checked DAG: each node's dependencies, function and input, and an order
    in which every node comes after its dependencies."""

    deps: Mapping[str, tuple[str, ...]]
    fns: Mapping[str, str]
    inputs: Mapping[str, Any] = field(default_factory=dict)
    order: tuple[str, ...] = ()

    @property
    def sinks(self) -> tuple[str, ...]:
        """Nodes nothing depends on: what a run of the plan returns."""
        used = {d for ds in self.deps.values() for d in ds}
        return tuple(n for n in self.order if n not in used)

    def extended(self, plan: str, steps: Sequence[Step], offered: set[str]) -> Shape:
        """This shape with ``steps`` added, checked whole (N3)."""
        deps = dict(self.deps)
        fns = dict(self.fns)
        inputs = dict(self.inputs)
        for s in steps:
            if s.id in deps:
                raise PlanError(
                    f"plan {plan!r} already has a node {s.id!r}; give the new step another id",
                    plan=plan,
                    node=s.id,
                )
            if s.fn not in offered:
                raise PlanError(
                    f"plan {plan!r} offers no node function {s.fn!r}; offered: {sorted(offered)} "
                    "(add it to the plan's nodes or functions)",
                    plan=plan,
                    fn=s.fn,
                )
            deps[s.id] = tuple(s.after)
            fns[s.id] = s.fn
            if s.input is not None:
                inputs[s.id] = s.input
        return Shape(deps, fns, inputs, check(plan, deps))


def check(plan: str, deps: Mapping[str, Sequence[str]]) -> tuple[str, ...]:
    """Refuse bad ids, unknown dependencies and cycles; return a topological order.

    The order is stable: among nodes that are ready together, the one declared
    first comes first.
    """
    for node_id, after in deps.items():
        if not isinstance(node_id, str) or not _NODE_ID.fullmatch(node_id):
            raise PlanError(
                f"plan {plan!r}: node id {node_id!r} is not allowed; use letters, digits "
                "and _ . : @ + = - (no '/', at most 200 characters)",
                plan=plan,
            )
        unknown = [d for d in after if d not in deps]
        if unknown:
            raise PlanError(
                f"plan {plan!r}: node {node_id!r} comes after unknown node(s) {unknown}; "
                "declare them in the plan",
                plan=plan,
                node=node_id,
                unknown=unknown,
            )
    order: list[str] = []
    placed: set[str] = set()
    pending = list(deps)
    while pending:
        ready = [n for n in pending if all(d in placed for d in deps[n])]
        if not ready:
            raise PlanError(
                f"plan {plan!r} has a cycle through {sorted(pending)}; a plan is a DAG: "
                "remove a dependency",
                plan=plan,
                cycle=_cycle(deps, pending),
            )
        order.extend(ready)
        placed.update(ready)
        pending = [n for n in pending if n not in placed]
    return tuple(order)


def _cycle(deps: Mapping[str, Sequence[str]], pending: list[str]) -> list[str]:
    """One cycle among the nodes that could not be placed, for the message."""
    path: list[str] = []
    node = pending[0]
    while node not in path:
        path.append(node)
        node = next(d for d in deps[node] if d in pending)
    return [*path[path.index(node) :], node]


def sequence(names: Sequence[str]) -> dict[str, tuple[str, ...]]:
    """A sequence as a DAG: each node after the one before it."""
    return {n: (() if i == 0 else (names[i - 1],)) for i, n in enumerate(names)}
