"""What an empty or foreign lookup answer may prove, over real sockets (A3, R7).

Each reconcile below runs under ``evidence_settles="auto"``, so a wrong
verdict reaches the ledger at once: an empty answer read as absence releases
the hold of a payment the target made, and another payment's record read as
this one's spends that payment's amount. Each test asserts on the evidence
stored, the attempt, the balances and what the target applied.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import charter
from charter import AttemptStatus
from charter.adapters.http import HttpDeclaration, HttpOperation
from charter.sandbox import Sandbox
from charter.sandbox.server import POLL_SECONDS
from conftest import Principals, payment, payments_contract

UNIT = "usd_cents"
MakeEngine = Callable[..., charter.Engine]
Creds = tuple[dict[str, str], dict[str, str]]


class LookupTarget:
    """A payments API on loopback whose lookup by key answers whatever body it
    is given. A ``POST`` applies the payment and answers 500 when ``applies``,
    else answers 503 having applied nothing: either way the attempt is UNKNOWN
    and only the lookup can say more."""

    def __init__(self) -> None:
        self.applies = True
        self.lookup_body = b""
        self.applied: list[str] = []
        self.lookups: list[str] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True
        self._server.target = self  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> LookupTarget:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()


class _Handler(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: the test reads what the target recorded."""

    @property
    def target(self) -> LookupTarget:
        return self.server.target  # type: ignore[attr-defined, no-any-return]

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.target.applies:
            self.target.applied.append(self.headers.get("Idempotency-Key") or "")
            self._answer(500, b'{"error": "internal error"}')
        else:
            self._answer(503, b'{"error": "unavailable"}')

    def do_GET(self) -> None:
        self.target.lookups.append(self.path)
        self._answer(200, self.target.lookup_body)

    def _answer(self, status: int, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


@pytest.fixture
def lookups() -> Iterator[LookupTarget]:
    with LookupTarget() as target:
        yield target


def _adapter(
    target: LookupTarget, *, found_at: str | None, absent_is_proof: bool, empty_is_absent: bool
) -> Any:
    pay = HttpOperation(
        "POST",
        "/v1/payments",
        charter.EffectClass.UNSAFE,
        estimate={UNIT: "amount"},
        cost={UNIT: "amount"},
        lookup="/v1/payments/by-key/{idempotency_key}",
        lookup_found=found_at,
        absent_is_proof=absent_is_proof,
        lookup_empty_is_absent=empty_is_absent,
    )
    return HttpDeclaration("payments", target.url, {"pay": pay}, timeout_seconds=2.0).build()


def _reconciled(
    make_engine: MakeEngine, creds: Creds, target: LookupTarget, adapter: Any
) -> tuple[charter.Engine, str, Any]:
    """A 6-dollar payment the target answered with an error, then reconciled
    once under ``auto``: the engine, the mission, the attempt as stored."""
    engine = make_engine(evidence_settles="auto")
    who = Principals(*creds, engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    sent = run.perform(adapter, "pay", payment(6_00, "inv-1"), effect_key="inv-1")
    assert sent.status is AttemptStatus.UNKNOWN
    engine.coordinator.reconcile(sent.id, adapter)
    adapter.close()
    assert target.lookups == [f"/v1/payments/by-key/{sent.idempotency_key}"]
    return engine, mission, engine.get_attempt(sent.id)


#: Empty answers at the place the effect would be: the body itself, or ``data``.
EMPTY = [
    pytest.param(None, b"", id="empty-body"),
    pytest.param(None, b"null", id="null"),
    pytest.param(None, b"{}", id="empty-object"),
    pytest.param("data", b'{"data": []}', id="empty-list-at-data"),
    pytest.param("data", b'{"data": null}', id="null-at-data"),
    pytest.param("data", b'{"data": {}}', id="empty-object-at-data"),
]


@pytest.mark.parametrize(("found_at", "body"), EMPTY)
@pytest.mark.parametrize(
    ("absent_is_proof", "empty_is_absent"),
    [
        pytest.param(True, False, id="absence-is-proof"),
        pytest.param(False, True, id="empty-is-absent"),
    ],
)
def test_A3_R7_item21_an_empty_lookup_answer_proves_nothing_unless_both_are_declared(
    make_engine: MakeEngine,
    creds: Creds,
    lookups: LookupTarget,
    found_at: str | None,
    body: bytes,
    absent_is_proof: bool,
    empty_is_absent: bool,
) -> None:
    """The target made the payment and its lookup lags behind (an empty answer).
    An empty answer is absence only where the target documents it so
    (``lookup_empty_is_absent``), and absence proves non-application only
    where the operation declares it (``absent_is_proof``): with one of the two,
    it proves nothing, and the hold of the payment made stays."""
    lookups.lookup_body = body
    adapter = _adapter(
        lookups,
        found_at=found_at,
        absent_is_proof=absent_is_proof,
        empty_is_absent=empty_is_absent,
    )
    engine, mission, attempt = _reconciled(make_engine, creds, lookups, adapter)

    [row] = engine.evidence(attempt.id)
    assert row["verdict"] == "indeterminate"
    assert attempt.status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)[UNIT].held == 6_00
    assert engine.balances(mission)[UNIT].spent == 0
    assert lookups.applied == [attempt.idempotency_key]


@pytest.mark.parametrize(("found_at", "body"), EMPTY)
def test_A3_R7_item21_an_empty_answer_the_target_documents_as_absence_proves_non_application(
    make_engine: MakeEngine,
    creds: Creds,
    lookups: LookupTarget,
    found_at: str | None,
    body: bytes,
) -> None:
    """Declared both ways (the target documents an empty answer as holding no
    such effect, and its absence by key as proof), the empty answer settles the
    attempt FAILED and releases its hold: the target applied nothing."""
    lookups.applies = False
    lookups.lookup_body = body
    adapter = _adapter(lookups, found_at=found_at, absent_is_proof=True, empty_is_absent=True)
    engine, mission, attempt = _reconciled(make_engine, creds, lookups, adapter)

    [row] = engine.evidence(attempt.id)
    assert row["verdict"] == "not_applied"
    assert attempt.status is AttemptStatus.FAILED
    assert engine.balances(mission)[UNIT].held == 0
    assert engine.balances(mission)[UNIT].spent == 0
    assert lookups.applied == []


@pytest.mark.parametrize(
    ("found_at", "body"),
    [
        pytest.param("data", b"", id="empty-body-where-a-list-is-declared"),
        pytest.param("data", b"{}", id="no-data-where-a-list-is-declared"),
        pytest.param(None, b"[]", id="a-list-where-the-effect-is-declared"),
    ],
)
def test_A3_R7_item21_an_empty_answer_of_another_shape_than_declared_proves_nothing(
    make_engine: MakeEngine,
    creds: Creds,
    lookups: LookupTarget,
    found_at: str | None,
    body: bytes,
) -> None:
    """Declared both ways, an empty answer still proves absence only in the shape
    the operation declares: no body where ``{"data": [...]}`` is declared, or a
    list where the body is declared to be the effect, proves nothing."""
    lookups.lookup_body = body
    adapter = _adapter(lookups, found_at=found_at, absent_is_proof=True, empty_is_absent=True)
    engine, mission, attempt = _reconciled(make_engine, creds, lookups, adapter)

    assert [row["verdict"] for row in engine.evidence(attempt.id)] == ["indeterminate"]
    assert attempt.status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)[UNIT].held == 6_00
    assert lookups.applied == [attempt.idempotency_key]


def test_A3_R7_item21_a_lookup_that_returns_another_payment_s_record_is_indeterminate(
    make_engine: MakeEngine, creds: Creds, tmp_path: Any
) -> None:
    """Two payments carry the same client reference, and the lookup is by
    reference. The second is refused (a 429 this declaration does not know as a
    refusal, so UNKNOWN) and its lookup answers the first payment's record:
    that record is not this attempt's (``lookup_match`` on the key), so it
    proves nothing, and nothing is spent at the first payment's amount. A
    payment whose own record the lookup returns is applied at its own cost."""
    engine = make_engine(evidence_settles="auto")
    who = Principals(*creds, engine)
    mission = engine.create_mission(payments_contract(), by=who.alice)
    with Sandbox(tmp_path / "box.db") as box:
        pay = HttpOperation(
            "POST",
            "/v1/payments",
            charter.EffectClass.UNSAFE,
            estimate={UNIT: "amount"},
            cost={UNIT: "amount"},
            lookup="/v1/payments?reference={reference}",
            lookup_found="data",
            lookup_match={"idempotency_key": "{idempotency_key}"},
        )
        adapter = HttpDeclaration("payments", box.url, {"pay": pay}, timeout_seconds=1.0).build()
        run = engine.start_run(mission, by=who.agent, segment_id="seg-1")
        first = run.perform(adapter, "pay", payment(9_00, "inv-1"), effect_key="first")
        box.fault("refuse")
        second = run.perform(adapter, "pay", payment(4_00, "inv-1"), effect_key="second")
        assert (first.status, second.status) == (AttemptStatus.SUCCEEDED, AttemptStatus.UNKNOWN)

        foreign = engine.coordinator.reconcile(second.id, adapter)

        [made] = box.payments()
        assert foreign.verdict == "indeterminate"
        [shown] = foreign.detail["body"]["data"]  # what proved nothing is kept
        assert shown["id"] == made["id"]
        assert shown["idempotency_key"] == made["idempotency_key"] == first.idempotency_key
        assert engine.get_attempt(second.id).status is AttemptStatus.UNKNOWN
        assert engine.balances(mission)[UNIT].spent == 9_00
        assert engine.balances(mission)[UNIT].held == 4_00

        box.fault("drop_after_apply")
        lost = run.perform(adapter, "pay", payment(3_00, "inv-3"), effect_key="third")
        own = engine.coordinator.reconcile(lost.id, adapter)
        adapter.close()
        assert own.verdict == "applied"
        assert engine.get_attempt(lost.id).actual == {UNIT: 3_00}
        assert engine.balances(mission)[UNIT].spent == sum(p["amount"] for p in box.payments())
