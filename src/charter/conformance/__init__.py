"""The conformance kit for adapters: :func:`check_adapter` (A3, A5, A10, S3).

An adapter decides what a target's answer proves, and that is where the
engine's guarantees are easiest to lose: an error after the target acted
read as a failure, an empty lookup read as a success, a credential echoed by
the target stored in the evidence. This kit drives an adapter through a real
engine, on a throwaway SQLite store, against a *scripted target* — a fake of
the outside system that can be told how to misbehave next — and checks each
case against the one rule (:mod:`charter.attempts.classify`):

==========================  =====================================================
case                        what must hold
==========================  =====================================================
``applied_then_lost``       UNKNOWN, hold kept; the target applied it once
``error_after_applying``    UNKNOWN (FAILED allowed only for ``read_only``)
``refused_before_applying`` FAILED, hold released, nothing applied
``timeout``                 UNKNOWN, hold kept
``same_key_replay``         (``idempotent_keyed``) a lost send replayed with the
                            attempt's key: the target holds exactly one effect
``lookup_found``            a lookup returning the effect itself: *applied*
``lookup_empty``            an empty answer: indeterminate, still UNKNOWN
``lookup_list``             a list-shaped answer (``{"data": []}``): indeterminate
``lookup_malformed``        an unexpected shape: indeterminate
``lookup_other``            another key's effect, alone: indeterminate
``lookup_several``          several candidates, none this one: indeterminate
``lookup_down``             the lookup answers 503: indeterminate
``lookup_refused``, ...     the lookup's connection refused, reset or timed out
                            (``lookup_reset``, ``lookup_timeout``): indeterminate
``echo_in_header``, ...     the adapter's secret echoed in a header, the body, an
                            exception, or bytes: never in the store
``huge_answer``             a 50 MB answer: stored bounded (``answer_bytes``)
``nul_in_request``          a NUL inside request text: sent as is, or refused
``surrogate_in_request``    a lone surrogate: refused before anything is sent
==========================  =====================================================

Across every case: each send carries the attempt's own idempotency key (the
target received it), no effect is applied twice, an attempt is never left
UNKNOWN when the target received nothing, and the adapter's secret never
reaches the store (the store is read after each case, so a leak is reported
under the case that made it). A target that cannot play a case (an MCP tool
has no lookup) says so, and the report lists it as not played.

Write a target for your own adapter by implementing :class:`Target`; the
built-in :class:`~charter.conformance.http_target.ScriptedHttp` plays every
case for an HTTP JSON API. See docs/adapters.md.
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from charter.adapters import Adapter, EffectClass

if TYPE_CHECKING:
    import charter

SEND_CASES = (
    "applied_then_lost",
    "error_after_applying",
    "refused_before_applying",
    "timeout",
)
REPLAY_CASES = ("same_key_replay",)
#: Lookups whose answer proves nothing: each must leave the attempt UNKNOWN.
LOOKUP_CASES = (
    "lookup_found",
    "lookup_empty",
    "lookup_list",
    "lookup_malformed",
    "lookup_other",
    "lookup_several",
    "lookup_down",
    "lookup_refused",
    "lookup_reset",
    "lookup_timeout",
)
ECHO_CASES = ("echo_in_header", "echo_in_body", "echo_in_exception", "echo_in_bytes")
TEXT_CASES = ("nul_in_request", "surrogate_in_request")
CASES = (*SEND_CASES, *REPLAY_CASES, *LOOKUP_CASES, *ECHO_CASES, "huge_answer", *TEXT_CASES)

#: The most a case may add to the store beyond what a normal attempt adds:
#: a few copies of the bound, the evidence and the audit events' overhead.
_GROWTH_ALLOWED = 8


class Target(Protocol):
    """A fake of the outside system an adapter talks to, told how to behave next.

    ``secret`` is a credential the adapter under test holds (its API key, a
    header); the target echoes it back in the ``echo_*`` cases, and the kit
    looks for it in the store afterwards.
    """

    @property
    def secret(self) -> str: ...

    def arm(self, case: str) -> bool:
        """Play ``case`` on the next request (a send, or a lookup for the
        ``lookup_*`` cases); ``False`` if this target cannot play it."""
        ...

    def applied(self, key: str) -> int:
        """How many times the effect sent with idempotency key ``key`` was applied."""
        ...

    def received(self, key: str) -> int:
        """How many sends carrying idempotency key ``key`` reached the target at
        all (a send without a key, or with another, is not one of them)."""
        ...


@dataclass
class Result:
    """One case: ``ok`` or the reasons it failed; ``played`` is False when the
    target could not play it."""

    case: str
    played: bool = True
    problems: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems


@dataclass
class Report:
    """Every case's result; :meth:`check` raises listing the failures."""

    adapter: str
    operation: str
    results: list[Result]

    @property
    def failed(self) -> list[Result]:
        return [r for r in self.results if r.played and not r.ok]

    @property
    def not_played(self) -> list[str]:
        return [r.case for r in self.results if not r.played]

    def check(self) -> Report:
        if self.failed:
            lines = [f"{r.case}: {'; '.join(r.problems)}" for r in self.failed]
            raise AssertionError(
                f"adapter {self.adapter!r}, operation {self.operation!r} breaks "
                f"{len(lines)} case(s):\n  " + "\n  ".join(lines)
            )
        return self


def check_adapter(
    adapter: Adapter,
    target: Target,
    *,
    operation: str,
    request: Mapping[str, Any],
    text_field: str | None = None,
    cases: tuple[str, ...] = CASES,
    answer_bytes: int = 64 * 1024,
) -> Report:
    """Drive ``adapter`` through each case against ``target``; raise
    ``AssertionError`` naming every case it breaks, else return the report.

    ``request`` is a request the target applies; ``text_field`` names one of
    its text fields that the target carries through (the first text field by
    default), where the NUL and surrogate cases put their characters.
    """
    unknown = set(cases) - set(CASES)
    if unknown:
        raise ValueError(f"unknown case(s) {sorted(unknown)}; the kit knows {list(CASES)}")
    if operation not in adapter.operations:
        raise ValueError(f"adapter {adapter.name!r} has no operation {operation!r}")
    if not isinstance(target.secret, str) or not target.secret:
        raise ValueError("the target's secret is the credential the kit looks for: not empty")
    field_name = text_field or next((k for k, v in request.items() if isinstance(v, str)), None)
    with _Bench(adapter, operation, dict(request), answer_bytes) as bench:
        results = [_play(bench, target, case, field_name) for case in cases]
    return Report(adapter.name, operation, results).check()


class _Bench:
    """An engine on a throwaway store, a mission that may use the adapter, and
    what one case needs: a fresh run, an attempt, a reconcile."""

    def __init__(self, adapter: Adapter, operation: str, request: dict[str, Any], limit: int):
        self.adapter, self.operation, self.request, self.limit = adapter, operation, request, limit
        self.effect = adapter.operations[operation].effect
        self._dir = tempfile.TemporaryDirectory(prefix="charter-conformance-")
        self.path = Path(self._dir.name) / "kit.db"

    def __enter__(self) -> _Bench:
        import charter  # noqa: PLC0415 - the engine is loaded when the kit runs, not on import
        from charter.contracts.principals import new_credential  # noqa: PLC0415 - likewise

        agent_cred, agent_digest = new_credential("agent")
        config = charter.EngineConfig(
            credentials={"agent": agent_digest},
            answer_bytes=self.limit,
            artifacts=str(Path(self._dir.name) / "artifacts"),
            workspace=str(Path(self._dir.name) / "work"),
        )
        self.engine = charter.Engine.open(str(self.path), config=config)
        self.agent = self.engine.authenticate(agent_cred)
        estimate = self.adapter.estimate(self.operation, self.request).amounts
        allowance = {unit: max(1, amount) * 1000 for unit, amount in estimate.items()}
        self.mission = self.engine.create_mission(
            {
                "objective": f"conformance of {self.adapter.name}.{self.operation}",
                "principals": {"agent": {"run": [f"{self.adapter.name}.*"]}},
                "allowance": allowance or {"calls": 1000},
            },
            by=self.agent,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.close()
        self._dir.cleanup()

    def size(self) -> int:
        return sum(p.stat().st_size for p in self.path.parent.glob("kit.db*"))

    def attempt(self, case: str, request: Mapping[str, Any] | None = None) -> charter.Attempt:
        self.run = self.engine.start_run(self.mission, by=self.agent, segment_id=f"seg-{case}")
        return self.run.perform(
            self.adapter, self.operation, dict(request or self.request), effect_key=case
        )

    def reconcile(self, attempt_id: str) -> str:
        return self.engine.coordinator.reconcile(attempt_id, self.adapter).verdict

    def status(self, attempt_id: str) -> str:
        [found] = [a for a in self.engine.attempts(mission_id=self.mission) if a.id == attempt_id]
        return found.status.value

    def secret_seen(self, secret: str) -> tuple[int, list[str]]:
        """Where the store holds ``secret`` (S3): how many times what it records
        does (attempts, evidence, ledger entries, the audit log), and which of its
        files hold any form of it (indexes, pages rows left behind, the
        write-ahead log). Read after each case, so a leak is reported under the
        case that made it."""
        forms = _secret_forms(secret)
        attempts = self.engine.attempts(mission_id=self.mission)
        recorded = json.dumps(
            {
                "attempts": [a.to_dict() for a in attempts],
                "evidence": [self.engine.evidence(a.id) for a in attempts],
                "ledger": self.engine.ledger_entries(self.mission),
                "audit": self.engine.audit_events(self.mission),
            },
            default=str,
        ).encode()
        files = sorted(
            path.name
            for path in self.path.parent.glob("kit.db*")
            if any(form in path.read_bytes() for form in forms)
        )
        return sum(recorded.count(form) for form in forms), files


def _secret_forms(secret: str) -> list[bytes]:
    import base64  # noqa: PLC0415 - only the kit needs it

    raw = secret.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw).rstrip(b"=")]


def _play(bench: _Bench, target: Target, case: str, field_name: str | None) -> Result:
    result = Result(case)
    keyed = bench.effect is EffectClass.IDEMPOTENT_KEYED
    if (case in TEXT_CASES and field_name is None) or (case in REPLAY_CASES and not keyed):
        result.played = False
        return result
    family = case.split("_", maxsplit=1)[0]
    play = _PLAYS.get(family if family in ("lookup", "echo") else case)
    assert play is not None
    first = "applied_then_lost" if case.startswith("lookup") or case in REPLAY_CASES else case
    if not target.arm(first):
        result.played = False
        return result
    before = bench.secret_seen(target.secret)
    try:
        play(bench, target, case, field_name, result)
    except Exception as exc:  # the kit reports, never crashes half-way
        result.problems.append(f"raised {type(exc).__name__}: {exc}")
    (rows, files), (had, had_files) = bench.secret_seen(target.secret), before
    if rows > had or set(files) - set(had_files):
        where = ", ".join(files) if files else "its rows"
        result.problems.append(f"the store holds the adapter's secret ({where}; S3)")
    return result


def _expect(result: Result, what: str, ok: bool) -> None:
    if not ok:
        result.problems.append(what)


def _sent_once(bench: _Bench, target: Target, key: str, result: Result) -> None:
    _expect(result, f"applied {target.applied(key)} times", target.applied(key) <= 1)


def _keyed(target: Target, key: str, result: Result) -> None:
    """The send carried the attempt's own idempotency key (A5): without it, or
    with a key of the adapter's making, the target cannot tell a replay from a
    new effect, nor a lookup find this one."""
    _expect(
        result,
        "the target never received the attempt's idempotency key: the send carried "
        "none, or one the adapter made (send Dispatch.idempotency_key, A5)",
        target.received(key) > 0,
    )


def _send_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    attempt = bench.attempt(case)
    _keyed(target, attempt.idempotency_key, result)
    status = attempt.status.value
    read_only = bench.effect is EffectClass.READ_ONLY
    if case == "refused_before_applying":
        _expect(result, f"is {status}, not failed", status == "failed")
        _expect(result, "the target applied it", target.applied(attempt.idempotency_key) == 0)
    elif case == "error_after_applying" and read_only:
        _expect(result, f"is {status}, not unknown or failed", status in ("unknown", "failed"))
    else:
        _expect(result, f"is {status}, not unknown", status == "unknown")
    _sent_once(bench, target, attempt.idempotency_key, result)


def _replay_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    """A lost send replayed as the engine does (A8): with the attempt's own key,
    which the target deduplicates, so it still holds exactly one effect."""
    attempt = bench.attempt(case)  # applied, its answer lost
    key = attempt.idempotency_key
    if attempt.status.value != "unknown":
        result.problems.append(f"a lost answer left it {attempt.status.value}, not unknown")
        return
    replayed = bench.run.replay(bench.engine.get_attempt(attempt.id), bench.adapter)
    verdict = None if replayed is None else replayed.verdict
    _expect(result, f"the same-key replay proved {verdict!r}, not 'applied'", verdict == "applied")
    _expect(
        result,
        f"after a same-key replay the target holds {target.applied(key)} effects under the "
        "attempt's key, not exactly one",
        target.applied(key) == 1,
    )
    _expect(
        result,
        f"the target received the attempt's key {target.received(key)} times over the send "
        "and its replay, not twice (a key made per send applies the effect again)",
        target.received(key) == 2,
    )


def _lookup_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    attempt = bench.attempt(case)  # applied, its answer lost
    _keyed(target, attempt.idempotency_key, result)
    if attempt.status.value != "unknown":
        result.problems.append(f"a lost answer left it {attempt.status.value}, not unknown")
        return
    if not target.arm(case):
        result.played = False
        return
    verdict = bench.reconcile(attempt.id)
    want = "applied" if case == "lookup_found" else "indeterminate"
    _expect(result, f"the lookup proved {verdict!r}, not {want!r}", verdict == want)
    if want == "indeterminate":
        status = bench.status(attempt.id)
        _expect(result, f"the attempt became {status}", status == "unknown")
    _sent_once(bench, target, attempt.idempotency_key, result)


def _echo_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    attempt = bench.attempt(case)
    _keyed(target, attempt.idempotency_key, result)
    _sent_once(bench, target, attempt.idempotency_key, result)
    # Whether the secret reached the store is checked after every case (_play).


def _huge_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    before = bench.size()
    attempt = bench.attempt(case)
    _keyed(target, attempt.idempotency_key, result)
    grown = bench.size() - before
    allowed = _GROWTH_ALLOWED * bench.limit + (1 << 20)
    _expect(result, f"the store grew by {grown} bytes (allowed {allowed})", grown <= allowed)
    _sent_once(bench, target, attempt.idempotency_key, result)


def _text_case(bench: _Bench, target: Target, case: str, name: str | None, result: Result) -> None:
    import charter  # noqa: PLC0415 - as in _Bench

    assert name is not None
    odd = "\x00" if case == "nul_in_request" else "\ud800"
    request = {**bench.request, name: f"{bench.request[name]}{odd}tail"}
    try:
        attempt = bench.attempt(case, request)
    except charter.CharterError:
        return  # refused before anything was written or sent: the rule holds
    key, status = attempt.idempotency_key, attempt.status.value
    _expect(
        result,
        f"left {status} though the target received nothing",
        not (status == "unknown" and target.received(key) == 0),
    )
    if case == "surrogate_in_request":
        _expect(result, "text that is not Unicode was sent", target.received(key) == 0)
    elif status == "succeeded":
        _keyed(target, key, result)
    _sent_once(bench, target, key, result)


_PLAYS: dict[str, Callable[[_Bench, Target, str, str | None, Result], None]] = {
    **dict.fromkeys(SEND_CASES, _send_case),
    **dict.fromkeys(REPLAY_CASES, _replay_case),
    "lookup": _lookup_case,
    "echo": _echo_case,
    "huge_answer": _huge_case,
    **dict.fromkeys(TEXT_CASES, _text_case),
}
