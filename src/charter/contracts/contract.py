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
rights is shorthand for granting each on ``*``. ``recover`` concerns a whole
run and is granted on ``*`` only. Both come with the rights to send and to
settle (P3, see :meth:`Contract.allows`): ``recover`` with any grant of ``run``
or ``resolve``, ``reconcile`` on a scope with ``run`` or ``resolve`` on it.

An amendment needs, for each change that widens what anyone may do, the right
that change would need on its own (P2):
:func:`~charter.contracts.amendments.amendment_needs` lists them.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

from charter.amounts import is_amount
from charter.contracts.principals import Right
from charter.errors import ContractError, UsageError

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
    """Which operations need an approval before dispatch, how long one lasts, and
    whether the requester may approve its own effect (``four_eyes``, P3: ``None``
    is the default, four eyes on effects estimated in a money unit)."""

    required: tuple[str, ...] = ()
    ttl_seconds: int = 3600
    four_eyes: bool | None = None

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

    def parse(self, text: str) -> int:
        """An amount as a person types it, in smallest steps: ``"12.50"`` (or
        ``"12.5"``) with scale 2 is ``1250``. A number without a point is whole
        steps, as every amount is written elsewhere (``"1250"`` is ``1250``, never
        125,000: a point says the unit's reading is meant). Exact: digits only,
        never a float; at most ``scale`` decimals, within A9's range."""
        whole, point, decimals = text.strip().partition(".")
        if not point:
            decimals = ""
        elif not decimals or len(decimals) > self.scale:
            raise UsageError(
                f"{text!r}: an amount of {self.name} has at most {self.scale} decimal(s) "
                "after its point, and at least one"
            )
        digits = whole + decimals.ljust(self.scale if point else 0, "0")
        if not (whole and (whole + decimals).isascii() and (whole + decimals).isdigit()):
            raise UsageError(f"{text!r} is not an amount of {self.name}: digits and one point")
        if len(digits) > 19 or not is_amount(int(digits)):
            raise UsageError(f"{text!r} is more {self.name} than any amount (A9)")
        return int(digits)


def show_amounts(amounts: Mapping[str, int] | None, units: Mapping[str, Unit] | None = None) -> str:
    """Amounts as people read them, the one way every desk shows them (the CLI's
    text, the console's pages): ``{"usd": 1250, "calls": 3}`` with the contract's
    ``units`` as ``"12.50 USD, 3 calls"``. A unit ``units`` does not describe
    shows its smallest steps and its own name; nothing (``{}`` or ``None``) is
    ``"-"``. Integer arithmetic on the digits only, so an amount as large as
    the ledger holds (``2**63 - 1``) or below zero (an overrun) shows exactly."""
    if not amounts:
        return "-"
    described = units or {}
    return ", ".join(
        described[u].show(a) if u in described else f"{a} {u}" for u, a in amounts.items()
    )


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
        return show_amounts({unit: amount}, self.units)

    # -- authority -----------------------------------------------------------
    def allows(self, principal: str, right: Right, scope: str = "*") -> bool:
        """Whether this version grants ``right`` on ``scope`` to ``principal``.

        ``recover`` and ``reconcile`` also come with the rights to send and to
        settle (P3): ``recover`` with a grant of ``run`` or ``resolve`` on any
        scope (it fences a run and sends nothing; a resume as a new segment is a
        recover), ``reconcile`` on a scope with ``run`` or ``resolve`` there (its
        replay is a send on that scope, made as the run's owner under the A2
        condition; settling by evidence is less than settling by one's word)."""
        grants = self.principals.get(principal, {})
        if any(scope_matches(p, scope) for p in grants.get(right, ())):
            return True
        if right is Right.RECOVER:
            return self.grants(principal, Right.RUN) or self.grants(principal, Right.RESOLVE)
        if right is Right.RECONCILE:
            return any(
                scope_matches(p, scope)
                for p in (*grants.get(Right.RUN, ()), *grants.get(Right.RESOLVE, ()))
            )
        return False

    def grants(self, principal: str, right: Right) -> bool:
        """Whether this version grants ``right`` to ``principal`` on any scope."""
        return bool(self.principals.get(principal, {}).get(right))

    def four_eyes(self, estimate: Mapping[str, int] | None) -> bool:
        """Whether the principal whose run requested an effect estimated at
        ``estimate`` may not approve it (P3): as ``approvals.four_eyes`` says,
        else when the estimate is in a money unit — one the contract describes
        under ``units`` (a scale and a currency's name). An unknown estimate
        counts as money when the allowance has a money unit."""
        if self.approvals.four_eyes is not None:
            return self.approvals.four_eyes
        return any(u in self.units for u in (self.allowance if estimate is None else estimate))

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
                # absent when unset: older versions keep their digests
                **_present("four_eyes", self.approvals.four_eyes),
            },
            "stop_conditions": {
                k: v
                for k, v in (
                    ("max_attempts", self.stop_conditions.max_attempts),
                    ("max_failed_attempts", self.stop_conditions.max_failed_attempts),
                    ("deadline", iso(self.stop_conditions.deadline_us)),
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


def _present(key: str, value: Any) -> dict[str, Any]:
    return {} if value is None else {key: value}


def iso(us: int | None) -> str | None:
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
            if right == Right.RECOVER and scopes != ["*"]:
                raise ContractError(
                    f"principals.{name}.recover concerns a whole run: grant it on '*' only",
                    field=f"principals.{name}.recover",
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
    if not isinstance(value, Mapping) or set(value) - {"required", "ttl_seconds", "four_eyes"}:
        raise ContractError(
            "contract.approvals takes 'required' (scopes), 'ttl_seconds' and 'four_eyes'",
            field="approvals",
        )
    four_eyes = value.get("four_eyes")
    if four_eyes is not None and not isinstance(four_eyes, bool):
        raise ContractError(
            "approvals.four_eyes must be true or false (absent: four eyes on effects "
            "estimated in a money unit)",
            field="approvals.four_eyes",
        )
    required = value.get("required", [])
    if not isinstance(required, list) or not all(
        isinstance(s, str) and (s == "*" or "." in s) for s in required
    ):
        raise ContractError("approvals.required must be a list of scopes", field="approvals")
    ttl = _count(value.get("ttl_seconds", 3600), "approvals.ttl_seconds", minimum=1)
    return ApprovalPolicy(tuple(required), ttl, four_eyes)


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
