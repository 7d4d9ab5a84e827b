"""Contracts: what a mission may do, with how much, under whose authority.

A contract is plain data (a ``dict`` from JSON or TOML) validated strictly by
:meth:`Contract.from_dict`: unknown keys, floats in amounts, unknown rights and
empty objectives are refused with a :class:`~charter.errors.ContractError` that
names the offending field. Contracts are versioned in the store; a change (a
raised limit, a revoked right) is a new version, and authority is always checked
against the *current* version.

Scopes name adapter operations as ``adapter.operation``; a grant may use ``*``
(everything) or ``adapter.*``. Rights that are not about operations (``resolve``,
``stop``, ``raise_limit`` ...) are usually granted on ``*``; a bare list of
rights is shorthand for granting each on ``*``.

An amendment needs, for each change that widens what anyone may do, the right
that change would need on its own (P2): :func:`amendment_needs` lists them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from charter.amounts import is_amount
from charter.contracts.principals import Right
from charter.errors import ContractError

ResumeMode = Literal["automatic", "rules", "human"]
#: From least to most restrictive; a contract may only move right (R9).
RESUME_STRICTNESS: tuple[ResumeMode, ...] = ("automatic", "rules", "human")

_TOP_KEYS = {
    "objective",
    "principals",
    "allowance",
    "approvals",
    "stop_conditions",
    "resume",
    "max_recoveries",
    "max_node_crashes",
    "read_only_unknown",
    "units",
}


def scope_matches(pattern: str, scope: str) -> bool:
    """``*`` matches all; ``adapter.*`` matches that adapter's operations."""
    if pattern in ("*", scope):
        return True
    return pattern.endswith(".*") and scope.startswith(pattern[:-1])


@dataclass(frozen=True)
class ApprovalPolicy:
    """Which operations need an approval before dispatch, and how long one lasts."""

    required: tuple[str, ...] = ()
    ttl_seconds: int = 3600

    def requires(self, scope: str) -> bool:
        return any(scope_matches(p, scope) for p in self.required)


@dataclass(frozen=True)
class StopConditions:
    """Conditions under which no new attempt may be admitted (A1)."""

    max_attempts: int | None = None
    max_failed_attempts: int | None = None
    deadline_us: int | None = None

    def holding(self, *, now_us: int, admitted: int, failed: int) -> list[tuple[str, str]]:
        """The conditions that hold now, each as ``(label, why)``: the one place
        they are judged, for admission (A1) and for the assessment (R5, R9)."""
        held = []
        if self.deadline_us is not None and now_us >= self.deadline_us:
            held.append(("deadline passed", "the contract's deadline has passed"))
        if self.max_attempts is not None and admitted >= self.max_attempts:
            held.append(
                (
                    "max_attempts reached",
                    f"the contract's limit of {self.max_attempts} attempts is reached",
                )
            )
        if self.max_failed_attempts is not None and failed >= self.max_failed_attempts:
            held.append(
                (
                    "max_failed_attempts reached",
                    f"the contract's limit of {self.max_failed_attempts} failed attempts "
                    "is reached",
                )
            )
        return held


@dataclass(frozen=True)
class Unit:
    """How a unit of the allowance is shown to people: amounts stay integers in its
    smallest step; ``scale`` says how many of its digits are decimals (2 for
    cents of a dollar), ``name`` what to call it (``"USD"``)."""

    scale: int
    name: str

    def show(self, amount: int) -> str:
        """``450`` with scale 2 as ``"4.50 USD"``: exact, no float touches it."""
        sign, digits = ("-" if amount < 0 else ""), str(abs(amount)).rjust(self.scale + 1, "0")
        if self.scale == 0:
            return f"{sign}{digits} {self.name}"
        return f"{sign}{digits[: -self.scale]}.{digits[-self.scale :]} {self.name}"


@dataclass(frozen=True)
class Contract:
    """A validated, immutable contract version."""

    objective: str
    principals: Mapping[str, Mapping[Right, tuple[str, ...]]]
    allowance: Mapping[str, int]
    approvals: ApprovalPolicy = field(default_factory=ApprovalPolicy)
    stop_conditions: StopConditions = field(default_factory=StopConditions)
    resume: ResumeMode | None = None
    max_recoveries: int = 3
    max_node_crashes: int = 3
    read_only_unknown: Literal["wait", "write_off"] = "wait"
    units: Mapping[str, Unit] = field(default_factory=dict)

    def show(self, unit: str, amount: int) -> str:
        """An amount of ``unit`` as people read it (``"4.50 USD"``); a unit the
        contract does not describe shows its smallest steps (``"12 calls"``)."""
        described = self.units.get(unit)
        return described.show(amount) if described else f"{amount} {unit}"

    # -- authority -----------------------------------------------------------
    def allows(self, principal: str, right: Right, scope: str = "*") -> bool:
        """Whether this version grants ``right`` on ``scope`` to ``principal``."""
        grants = self.principals.get(principal, {})
        return any(scope_matches(p, scope) for p in grants.get(right, ()))

    # -- changes -------------------------------------------------------------
    def with_limit(self, unit: str, limit: int) -> Contract:
        """A new version with one allowance limit changed, validated like any contract."""
        return Contract.from_dict({**self.to_dict(), "allowance": {**self.allowance, unit: limit}})

    def with_grants(self, principal: str, grants: Mapping[Right, tuple[str, ...]]) -> Contract:
        """A new version with one principal's grants replaced (empty revokes all)."""
        data = self.to_dict()
        if grants:
            data["principals"][principal] = {str(r): list(s) for r, s in grants.items()}
        else:
            data["principals"].pop(principal, None)
        return Contract.from_dict(data)

    # -- serialisation -------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "objective": self.objective,
            "principals": {
                name: {str(r): list(s) for r, s in sorted(g.items())}
                for name, g in sorted(self.principals.items())
            },
            "allowance": dict(sorted(self.allowance.items())),
            "approvals": {
                "required": list(self.approvals.required),
                "ttl_seconds": self.approvals.ttl_seconds,
            },
            "stop_conditions": {
                k: v
                for k, v in (
                    ("max_attempts", self.stop_conditions.max_attempts),
                    ("max_failed_attempts", self.stop_conditions.max_failed_attempts),
                    ("deadline", _iso(self.stop_conditions.deadline_us)),
                )
                if v is not None
            },
            "max_recoveries": self.max_recoveries,
            "max_node_crashes": self.max_node_crashes,
            "read_only_unknown": self.read_only_unknown,
        }
        if self.resume is not None:
            out["resume"] = self.resume
        if self.units:  # absent when unused: older versions keep their digests
            out["units"] = {
                u: {"scale": d.scale, "name": d.name} for u, d in sorted(self.units.items())
            }
        return out

    def canonical_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, separators=(",", ":"))

    def digest(self) -> str:
        return hashlib.sha256(self.canonical_json().encode()).hexdigest()

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Contract:
        """Validate ``data`` and build a contract; refuse anything malformed."""
        if not isinstance(data, Mapping):
            raise ContractError(
                "a contract must be a mapping (a JSON object or TOML table)", field="contract"
            )
        unknown = set(data) - _TOP_KEYS
        if unknown:
            raise ContractError(
                f"unknown contract field(s) {sorted(unknown)}; allowed: {sorted(_TOP_KEYS)}",
                field=sorted(unknown)[0],
            )
        objective = data.get("objective")
        if not isinstance(objective, str) or not objective.strip():
            raise ContractError("contract.objective must be a non-empty string", field="objective")
        return cls(
            objective=objective,
            principals=_principals(data.get("principals")),
            allowance=_allowance(data.get("allowance")),
            approvals=_approvals(data.get("approvals", {})),
            stop_conditions=_stop(data.get("stop_conditions", {})),
            resume=_resume(data.get("resume")),
            max_recoveries=_count(data.get("max_recoveries", 3), "max_recoveries", minimum=1),
            max_node_crashes=_count(data.get("max_node_crashes", 3), "max_node_crashes", minimum=1),
            read_only_unknown=_read_only_unknown(data.get("read_only_unknown", "wait")),
            units=_units(data.get("units", {}), data.get("allowance")),
        )

    @classmethod
    def validate(cls, value: Contract | Mapping[str, Any]) -> Contract:
        """``value`` validated, whether data or a ``Contract`` built in code (whose
        constructor checks nothing), so that every stored version loads again."""
        return cls.from_dict(value.to_dict() if isinstance(value, Contract) else value)

    @classmethod
    def from_json(cls, text: str) -> Contract:
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise ContractError(
                f"contract is not valid JSON: {exc}",
                field="contract",
                line=exc.lineno,
                column=exc.colno,
            ) from None
        return cls.from_dict(data)


# -- amendments (P2) ------------------------------------------------------------------


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
    approval was required; loosening the resume restriction needs ``run`` (what
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
        ("stop_conditions.deadline", was.deadline_us, now.deadline_us, _iso),
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
    if _strictness(proposed.resume) < _strictness(current.resume):
        yield Need(
            Right.RUN,
            "*",
            f"resume restriction loosened from {current.resume} to "
            f"{proposed.resume or 'none (the engine policy)'}",
        )
    if current.read_only_unknown == "wait" and proposed.read_only_unknown == "write_off":
        yield Need(Right.RESOLVE, "*", "read_only UNKNOWN attempts written off unattended (A7)")


def _strictness(mode: ResumeMode | None) -> int:
    """How far a contract restricts the resume policy; -1: not at all."""
    return -1 if mode is None else RESUME_STRICTNESS.index(mode)


def _iso(us: int | None) -> str | None:
    """A deadline as exact ISO 8601 (UTC, microseconds), any side of 1970."""
    if us is None:
        return None
    return (_EPOCH + timedelta(microseconds=us)).isoformat()


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_LATEST_US = (datetime.max.replace(tzinfo=UTC) - _EPOCH) // timedelta(microseconds=1)


def _count(value: Any, name: str, *, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ContractError(f"contract.{name} must be an integer >= {minimum}", field=name)
    return value


def _principals(value: Any) -> dict[str, dict[Right, tuple[str, ...]]]:
    if not isinstance(value, Mapping) or not value:
        raise ContractError(
            "contract.principals must map each principal to its rights, "
            'e.g. {"agent": {"run": ["llm.*"]}, "alice": ["resolve"]}',
            field="principals",
        )
    out: dict[str, dict[Right, tuple[str, ...]]] = {}
    valid = sorted(r.value for r in Right)
    for name, raw_grants in value.items():
        if not isinstance(name, str) or not name or ":" in name:
            raise ContractError(
                f"principal name {name!r} must be a non-empty string without ':'",
                field="principals",
            )
        if isinstance(raw_grants, list) and not all(isinstance(r, str) for r in raw_grants):
            raise ContractError(
                f"principals.{name} must list rights as strings", field=f"principals.{name}"
            )
        grants = {r: ["*"] for r in raw_grants} if isinstance(raw_grants, list) else raw_grants
        if not isinstance(grants, Mapping):
            raise ContractError(
                f"principals.{name} must be a list of rights or a mapping right -> scopes",
                field=f"principals.{name}",
            )
        parsed: dict[Right, tuple[str, ...]] = {}
        for right, raw_scopes in grants.items():
            if right not in valid:
                raise ContractError(
                    f"principals.{name}: unknown right {right!r}; rights are {valid}",
                    field=f"principals.{name}",
                )
            scopes = [raw_scopes] if isinstance(raw_scopes, str) else raw_scopes
            if not isinstance(scopes, list) or not all(
                isinstance(s, str) and s and (s == "*" or "." in s) for s in scopes
            ):
                raise ContractError(
                    f"principals.{name}.{right} must list scopes like '*', 'adapter.*' or "
                    "'adapter.operation'",
                    field=f"principals.{name}.{right}",
                )
            parsed[Right(right)] = tuple(scopes)
        out[name] = parsed
    return out


def _allowance(value: Any) -> dict[str, int]:
    if not isinstance(value, Mapping) or not value:
        raise ContractError(
            "contract.allowance must map each unit to an integer limit in its smallest step, "
            'e.g. {"usd_micros": 5000000, "calls": 100}',
            field="allowance",
        )
    out: dict[str, int] = {}
    for unit, limit in value.items():
        if not isinstance(unit, str) or not unit.replace("_", "").isalnum():
            raise ContractError(f"allowance unit {unit!r} must be a plain name", field="allowance")
        if not is_amount(limit):
            raise ContractError(
                f"allowance.{unit} must be an integer in [0, 2**63 - 1] (smallest steps; "
                f"floats never touch the ledger), got {limit!r}",
                field=f"allowance.{unit}",
            )
        out[unit] = limit
    return out


def _units(value: Any, allowance: Any) -> dict[str, Unit]:
    """``units``: per allowance unit, ``{"scale": 0..18, "name": "USD"}``."""
    if not isinstance(value, Mapping):
        raise ContractError(
            'contract.units maps allowance units to {"scale": N, "name": "..."}', field="units"
        )
    out: dict[str, Unit] = {}
    for unit, spec in value.items():
        if not isinstance(allowance, Mapping) or unit not in allowance:
            raise ContractError(
                f"units.{unit} describes a unit the allowance does not have", field=f"units.{unit}"
            )
        if not isinstance(spec, Mapping) or set(spec) != {"scale", "name"}:
            raise ContractError(
                f'units.{unit} takes exactly "scale" and "name"', field=f"units.{unit}"
            )
        scale, name = spec["scale"], spec["name"]
        if isinstance(scale, bool) or not isinstance(scale, int) or not 0 <= scale <= 18:
            raise ContractError(
                f"units.{unit}.scale must be an integer from 0 to 18", field=f"units.{unit}"
            )
        if not isinstance(name, str) or not name.strip() or len(name) > 16:
            raise ContractError(
                f"units.{unit}.name must be a short non-empty string", field=f"units.{unit}"
            )
        out[unit] = Unit(scale, name)
    return out


def _approvals(value: Any) -> ApprovalPolicy:
    if not isinstance(value, Mapping) or set(value) - {"required", "ttl_seconds"}:
        raise ContractError(
            "contract.approvals takes 'required' (scopes) and 'ttl_seconds'", field="approvals"
        )
    required = value.get("required", [])
    if not isinstance(required, list) or not all(
        isinstance(s, str) and (s == "*" or "." in s) for s in required
    ):
        raise ContractError("approvals.required must be a list of scopes", field="approvals")
    ttl = _count(value.get("ttl_seconds", 3600), "approvals.ttl_seconds", minimum=1)
    return ApprovalPolicy(tuple(required), ttl)


def _stop(value: Any) -> StopConditions:
    allowed = {"max_attempts", "max_failed_attempts", "deadline", "deadline_us"}
    if not isinstance(value, Mapping) or set(value) - allowed:
        raise ContractError(
            f"contract.stop_conditions takes {sorted(allowed)}", field="stop_conditions"
        )
    deadline = value.get("deadline_us")
    if "deadline" in value:
        try:
            moment = datetime.fromisoformat(str(value["deadline"]))
        except ValueError:
            raise ContractError(
                "stop_conditions.deadline must be an ISO 8601 time with a zone",
                field="stop_conditions.deadline",
            ) from None
        if moment.tzinfo is None:
            raise ContractError(
                "stop_conditions.deadline needs a time zone (e.g. ...Z or +00:00)",
                field="stop_conditions.deadline",
            )
        deadline = (moment - _EPOCH) // timedelta(microseconds=1)
    elif deadline is not None:
        deadline = _count(deadline, "stop_conditions.deadline_us")
        if deadline > _LATEST_US:
            raise ContractError(
                "stop_conditions.deadline_us is after the year 9999",
                field="stop_conditions.deadline_us",
            )
    return StopConditions(
        max_attempts=None
        if value.get("max_attempts") is None
        else _count(value["max_attempts"], "stop_conditions.max_attempts"),
        max_failed_attempts=None
        if value.get("max_failed_attempts") is None
        else _count(value["max_failed_attempts"], "stop_conditions.max_failed_attempts"),
        deadline_us=deadline,
    )


def _resume(value: Any) -> ResumeMode | None:
    if value is None:
        return None
    if value not in RESUME_STRICTNESS:
        raise ContractError(
            f"contract.resume must be one of {list(RESUME_STRICTNESS)} (a contract may only "
            "restrict the engine's resume policy)",
            field="resume",
        )
    mode: ResumeMode = value
    return mode


def _read_only_unknown(value: Any) -> Literal["wait", "write_off"]:
    if value == "wait":
        return "wait"
    if value == "write_off":
        return "write_off"
    raise ContractError(
        "contract.read_only_unknown must be 'wait' (default) or 'write_off' (A7 opt-in)",
        field="read_only_unknown",
    )
