"""Amendments (P2): the right each change to a contract would need on its own.

Whoever amends a mission's contract must hold each of them under the current
version, so nobody gains through an amendment what their rights deny.
:func:`amendment_needs` lists them; :mod:`charter.contracts.missions` checks them.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from charter.contracts.contract import RESUME_STRICTNESS, Contract, ResumeMode, iso
from charter.contracts.principals import Right
from charter.errors import ContractError


@dataclass(frozen=True)
class Need:
    """A right an amendment's author must hold, and the change that needs it (P2)."""

    right: Right
    scope: str
    change: str

    def to_dict(self) -> dict[str, str]:
        return {"right": self.right.value, "scope": self.scope, "change": self.change}


def amendment_needs(current: Contract, proposed: Contract) -> list[Need]:
    """The right each change from ``current`` to ``proposed`` would need on its own (P2).

    Whoever amends must hold each of them under ``current``, so nobody gains
    through an amendment what their rights deny. Only widening needs a right:
    raising any limit (an allowance, a stop condition, a recovery limit) needs
    ``raise_limit``; giving a principal a right on a scope needs that right on
    that scope (one grants only what one holds); dropping an approval
    requirement, or making approvals last longer, needs ``approve`` where
    approval was required, and so does dropping four eyes on approvals (P3);
    loosening the resume restriction needs ``run`` (what
    authorises a continuation in ``human`` mode, R9); the A7 write-off opt-in
    needs ``resolve`` (L9). Narrowing (a lower limit, a revoked grant, a new
    approval requirement, a tighter stop condition) needs none.
    """
    for unit, was in current.units.items():
        now = proposed.units.get(unit)
        if now is not None and now.scale != was.scale:
            raise ContractError(
                f"units.{unit}.scale cannot change from {was.scale} to {now.scale}: every "
                "amount recorded is in the unit's smallest step",
                field=f"units.{unit}",
            )
    return [
        *_grant_needs(current, proposed),
        *_limit_needs(current, proposed),
        *_policy_needs(current, proposed),
    ]


def _grant_needs(current: Contract, proposed: Contract) -> Iterator[Need]:
    for name, grants in sorted(proposed.principals.items()):
        for right, scopes in sorted(grants.items()):
            for scope in scopes:
                if not current.allows(name, right, scope):
                    yield Need(right, scope, f"{name} granted {right.value} on {scope}")


def _limit_needs(current: Contract, proposed: Contract) -> Iterator[Need]:
    for unit, limit in sorted(proposed.allowance.items()):
        old = current.allowance.get(unit, 0)
        if limit > old:
            yield Need(Right.RAISE_LIMIT, "*", f"allowance.{unit} raised from {old} to {limit}")
    was, now = current.stop_conditions, proposed.stop_conditions
    limits: list[tuple[str, int | None, int | None, Any]] = [
        ("stop_conditions.max_attempts", was.max_attempts, now.max_attempts, str),
        (
            "stop_conditions.max_failed_attempts",
            was.max_failed_attempts,
            now.max_failed_attempts,
            str,
        ),
        ("stop_conditions.deadline", was.deadline_us, now.deadline_us, iso),
        ("max_recoveries", current.max_recoveries, proposed.max_recoveries, str),
        ("max_node_crashes", current.max_node_crashes, proposed.max_node_crashes, str),
    ]
    for name, old_limit, new_limit, show in limits:
        if old_limit is not None and (new_limit is None or new_limit > old_limit):
            after = "none" if new_limit is None else show(new_limit)
            yield Need(Right.RAISE_LIMIT, "*", f"{name} loosened from {show(old_limit)} to {after}")


def _policy_needs(current: Contract, proposed: Contract) -> Iterator[Need]:
    was, now = current.approvals, proposed.approvals
    for scope in was.required:
        if not now.requires(scope):
            yield Need(Right.APPROVE, scope, f"approval on {scope} no longer required")
    if now.ttl_seconds > was.ttl_seconds:
        for scope in now.required:
            yield Need(
                Right.APPROVE,
                scope,
                f"approvals on {scope} last {now.ttl_seconds}s instead of {was.ttl_seconds}s",
            )
    if _four_eyes_dropped(current, proposed):
        for scope in now.required:
            yield Need(Right.APPROVE, scope, f"four eyes on approvals of {scope} dropped (P3)")
    if _strictness(proposed.resume) < _strictness(current.resume):
        yield Need(
            Right.RUN,
            "*",
            f"resume restriction loosened from {current.resume} to "
            f"{proposed.resume or 'none (the engine policy)'}",
        )
    if current.read_only_unknown == "wait" and proposed.read_only_unknown == "write_off":
        yield Need(Right.RESOLVE, "*", "read_only UNKNOWN attempts written off unattended (A7)")


def _four_eyes_dropped(was: Contract, now: Contract) -> bool:
    """Whether some effect needing four eyes under ``was`` needs them no more."""
    before, after = was.approvals.four_eyes, now.approvals.four_eyes
    if before is None and after is None:  # the money default: each money unit stays money
        return not set(was.units) <= set(now.units)
    if before is None:
        return after is False and bool(was.units)
    return before is True and after is not True


def _strictness(mode: ResumeMode | None) -> int:
    """How far a contract restricts the resume policy; -1: not at all."""
    return -1 if mode is None else RESUME_STRICTNESS.index(mode)
