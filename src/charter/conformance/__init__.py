"""The conformance kit for adapters: :func:`check_adapter` (A3, A10, S3).

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
``lookup_found``            a lookup returning the effect itself: *applied*
``lookup_empty``            an empty answer: indeterminate, still UNKNOWN
``lookup_list``             a list-shaped answer (``{"data": []}``): indeterminate
``lookup_malformed``        an unexpected shape: indeterminate
``lookup_down``             the lookup fails: indeterminate
``echo_in_header``, ...     the adapter's secret echoed in a header, the body, an
                            exception, or bytes: never in the store
``huge_answer``             a 50 MB answer: stored bounded (``answer_bytes``)
``nul_in_request``          a NUL inside request text: sent as is, or refused
``surrogate_in_request``    a lone surrogate: refused before anything is sent
==========================  =====================================================

Across every case: no effect is applied twice, and an attempt is never left
UNKNOWN when the target received nothing. A target that cannot play a case
(an MCP tool has no lookup) says so, and the report lists it as not played.

Write a target for your own adapter by implementing :class:`Target`; the
built-in :class:`~charter.conformance.http_target.ScriptedHttp` plays every
case for an HTTP JSON API. See docs/adapters.md.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator, Mapping
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
LOOKUP_CASES = ("lookup_found", "lookup_empty", "lookup_list", "lookup_malformed", "lookup_down")
ECHO_CASES = ("echo_in_header", "echo_in_body", "echo_in_exception", "echo_in_bytes")
TEXT_CASES = ("nul_in_request", "surrogate_in_request")
CASES = (*SEND_CASES, *LOOKUP_CASES, *ECHO_CASES, "huge_answer", *TEXT_CASES)

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
        """How many sends with idempotency key ``key`` reached the target at all."""
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
    field_name = text_field or next((k for k, v in request.items() if isinstance(v, str)), None)
    with _Bench(adapter, operation, dict(request), answer_bytes) as bench:
        results = [_play(bench, target, case, field_name) for case in cases]
        results.extend(bench.store_checks(target.secret))
    return Report(adapter.name, operation, results).check()


class _Bench:
    """An engine on a throwaway store, a mission that may use the adapter, and
    what one case needs: a fresh run, an attempt, a reconcile."""

    def __init__(self, adapter: Adapter, operation: str, request: dict[str, Any], limit: int):
        self.adapter, self.operation, self.request, self.limit = adapter, operation, request, limit
        self.effect = adapter.operations[operation].effect
        self._dir = tempfile.TemporaryDirectory(prefix="charter-conformance-")
        self.path = Path(self._dir.name) / "kit.db"
        self.keys: list[str] = []

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
        run = self.engine.start_run(self.mission, by=self.agent, segment_id=f"seg-{case}")
        attempt = run.perform(
            self.adapter, self.operation, dict(request or self.request), effect_key=case
        )
        self.keys.append(attempt.idempotency_key)
        return attempt

    def reconcile(self, attempt_id: str) -> str:
        return self.engine.coordinator.reconcile(attempt_id, self.adapter).verdict

    def status(self, attempt_id: str) -> str:
        [found] = [a for a in self.engine.attempts(mission_id=self.mission) if a.id == attempt_id]
        return found.status.value

    def store_checks(self, secret: str) -> Iterator[Result]:
        """Across every case: the secret nowhere in the store's files (S3)."""
        leaked = Result("secret_never_stored")
        self.engine.close()
        for path in sorted(self.path.parent.glob("kit.db*")):
            data = path.read_bytes()
            for form in _secret_forms(secret):
                if form in data:
                    leaked.problems.append(f"{path.name} holds the secret (as {form[:4]!r}...)")
        yield leaked


def _secret_forms(secret: str) -> list[bytes]:
    import base64  # noqa: PLC0415 - only the kit needs it

    raw = secret.encode()
    return [raw, base64.b64encode(raw), base64.urlsafe_b64encode(raw).rstrip(b"=")]


def _play(bench: _Bench, target: Target, case: str, field_name: str | None) -> Result:
    result = Result(case)
    if case in TEXT_CASES and field_name is None:
        result.played = False
        return result
    family = case.split("_", maxsplit=1)[0]
    play = _PLAYS.get(family if family in ("lookup", "echo") else case)
    assert play is not None
    if not target.arm(case if not case.startswith("lookup") else "applied_then_lost"):
        result.played = False
        return result
    try:
        play(bench, target, case, field_name, result)
    except Exception as exc:  # the kit reports, never crashes half-way
        result.problems.append(f"raised {type(exc).__name__}: {exc}")
    return result


def _expect(result: Result, what: str, ok: bool) -> None:
    if not ok:
        result.problems.append(what)


def _sent_once(bench: _Bench, target: Target, key: str, result: Result) -> None:
    _expect(result, f"applied {target.applied(key)} times", target.applied(key) <= 1)


def _send_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    attempt = bench.attempt(case)
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


def _lookup_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    attempt = bench.attempt(case)  # applied, its answer lost
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
    _sent_once(bench, target, attempt.idempotency_key, result)
    # Whether the secret reached the store is checked once, over the whole store.


def _huge_case(bench: _Bench, target: Target, case: str, _f: str | None, result: Result) -> None:
    before = bench.size()
    attempt = bench.attempt(case)
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
    _sent_once(bench, target, key, result)


_PLAYS: dict[str, Callable[[_Bench, Target, str, str | None, Result], None]] = {
    **dict.fromkeys(SEND_CASES, _send_case),
    "lookup": _lookup_case,
    "echo": _echo_case,
    "huge_answer": _huge_case,
    **dict.fromkeys(TEXT_CASES, _text_case),
}
