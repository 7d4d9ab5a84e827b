"""The payments sandbox on its own: the API it promises, its faults, and `charter sandbox`."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from charter.sandbox import Sandbox, SandboxError


def call(
    url: str, method: str, path: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, Any, dict[str, str]]:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        url + path, data=data, method=method, headers={"Content-Type": "application/json"}
    )
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, json.loads(response.read()), dict(response.headers)
    except urllib.error.HTTPError as error:
        with error:
            return error.code, json.loads(error.read()), dict(error.headers)


PAYMENT = {"amount": 4_50, "currency": "usd", "payee": "acme", "reference": "inv-1"}


def test_same_key_same_body_replays_the_first_answer_and_applies_once(box: Sandbox) -> None:
    first = call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k1"})
    again = call(
        box.url, "POST", "/v1/payments", dict(reversed(PAYMENT.items())), {"Idempotency-Key": "k1"}
    )

    assert (first[0], again[0]) == (201, 200)
    assert first[1] == again[1]
    assert again[2]["Idempotent-Replayed"] == "true"
    assert len(box.payments()) == 1


def test_same_key_another_body_is_refused_and_applies_nothing(box: Sandbox) -> None:
    call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k1"})
    status, body, _ = call(
        box.url, "POST", "/v1/payments", {**PAYMENT, "amount": 1}, {"Idempotency-Key": "k1"}
    )
    assert (status, body["error"]["code"]) == (422, "idempotency_key_reused")
    assert [p["amount"] for p in box.payments()] == [4_50]


def test_F2_the_sandbox_keeps_the_highest_epoch_per_run_and_refuses_older_ones(
    box: Sandbox,
) -> None:
    def send(key: str, token: str) -> int:
        fence = {"Idempotency-Key": key, "X-Fencing-Token": token}
        return call(box.url, "POST", "/v1/payments", PAYMENT, fence)[0]

    assert [send("a", "run_1:2"), send("b", "run_1:1"), send("c", "run_2:1")] == [201, 409, 201]
    assert [p["idempotency_key"] for p in box.payments()] == ["a", "c"]


def test_a_lookup_that_finds_nothing_closes_the_key(box: Sandbox) -> None:
    assert call(box.url, "GET", "/v1/payments/by-key/k9")[0] == 404
    status, body, _ = call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k9"})
    assert (status, body["error"]["code"]) == (409, "idempotency_key_closed")
    assert box.payments() == []


@pytest.mark.parametrize(
    ("fault", "status", "applied"),
    [("refuse", 429, 0), ("error_after_apply", 500, 1)],
)
def test_armed_faults_answer_as_declared(
    box: Sandbox, fault: str, status: int, applied: int
) -> None:
    armed = call(box.url, "POST", "/_sandbox/faults", {"fault": fault, "times": 1})
    assert armed[0] == 200
    assert call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k"})[0] == status
    assert len(box.payments()) == applied
    # spent after one use: the next create is served normally
    assert call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k2"})[0] == 201


@pytest.mark.parametrize(
    "body",
    [
        {"fault": "explode"},
        {"fault": "slow", "times": 0},
        {"fault": "slow", "seconds": -1},
        {"fault": "slow", "reference": 7},
    ],
)
def test_a_bad_fault_is_refused_and_arms_nothing(box: Sandbox, body: dict[str, Any]) -> None:
    status, answer, _ = call(box.url, "POST", "/_sandbox/faults", body)
    assert (status, answer["error"]["code"]) == (400, "invalid_fault")
    assert call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k"})[0] == 201


@pytest.mark.parametrize(
    "payment",
    [
        {**PAYMENT, "amount": 0},
        {**PAYMENT, "amount": 1.5},
        {**PAYMENT, "amount": True},
        {**PAYMENT, "currency": ""},
        {k: v for k, v in PAYMENT.items() if k != "payee"},
        [PAYMENT],
    ],
)
def test_a_malformed_payment_is_refused_400_and_applies_nothing(box: Sandbox, payment: Any) -> None:
    assert call(box.url, "POST", "/v1/payments", payment, {"Idempotency-Key": "k"})[0] == 400
    assert call(box.url, "POST", "/v1/payments", PAYMENT)[0] == 400  # no key
    assert box.payments() == []


def test_the_sandbox_listens_on_loopback_only(tmp_path: Path) -> None:
    with pytest.raises(SandboxError, match="loopback"):
        Sandbox(tmp_path / "s.db", host="0.0.0.0")


def test_the_sandbox_command_serves_until_sigterm_and_keeps_its_state(tmp_path: Path) -> None:
    data = tmp_path / "state" / "sandbox.db"
    command = [sys.executable, "-m", "charter", "sandbox", "--json", "--data", str(data)]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    with subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env) as proc:
        assert proc.stdout is not None
        where = json.loads(proc.stdout.readline())
        status, _, _ = call(where["url"], "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k"})
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    assert status == 201
    with Sandbox(data) as again:
        assert [p["idempotency_key"] for p in again.payments()] == ["k"]


def test_a_fault_armed_for_a_reference_waits_for_that_payment(tmp_path: Path) -> None:
    seen: list[str] = []
    with Sandbox(tmp_path / "s.db", on_apply=lambda p: seen.append(p["reference"])) as box:
        box.fault("error_after_apply", reference="inv-2")
        first = call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "a"})
        second = call(
            box.url,
            "POST",
            "/v1/payments",
            {**PAYMENT, "reference": "inv-2"},
            {"Idempotency-Key": "b"},
        )
        again = call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "a"})
    assert (first[0], second[0], again[0]) == (201, 500, 200)
    assert seen == ["inv-1", "inv-2"]  # each applied payment once; a replay applies nothing


def test_the_request_log_dates_each_request_on_arrival_and_on_decision(box: Sandbox) -> None:
    """A request may wait for another's transaction between the two: a send's
    arrival is what says whether it left before its deadline (F3)."""
    box.fault("slow", seconds=0.3)
    call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k1"})
    [create] = box.requests()
    assert create["received_at"] <= create["at"]


def test_a_request_log_an_older_sandbox_wrote_is_read_with_no_arrival_times(
    tmp_path: Path,
) -> None:
    path = tmp_path / "old.db"
    with sqlite3.connect(path) as db:
        db.execute(
            "CREATE TABLE requests (seq INTEGER PRIMARY KEY AUTOINCREMENT, kind TEXT NOT NULL, "
            "idempotency_key TEXT, fencing_token TEXT, verdict TEXT NOT NULL, "
            "status INTEGER NOT NULL, at TEXT NOT NULL)"
        )
        db.execute(
            "INSERT INTO requests (kind, idempotency_key, fencing_token, verdict, status, at) "
            "VALUES ('lookup', 'k0', NULL, 'absent', 404, '2026-01-01T00:00:00+00:00')"
        )
    with Sandbox(path) as old:
        call(old.url, "GET", "/v1/payments/by-key/k1")
        first, second = old.requests()
    assert (first["idempotency_key"], first["received_at"]) == ("k0", None)
    assert (second["kind"], second["idempotency_key"]) == ("lookup", "k1")
    assert second["received_at"] <= second["at"]


def test_a_request_in_flight_when_the_sandbox_stops_goes_unanswered_quietly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    box = Sandbox(tmp_path / "box.db").start()
    box.fault("slow", seconds=0.5)
    answers: list[Any] = []

    def pay() -> None:
        try:
            answers.append(call(box.url, "POST", "/v1/payments", PAYMENT, {"Idempotency-Key": "k"}))
        except OSError as exc:  # the connection closed with no answer
            answers.append(exc)

    sender = threading.Thread(target=pay)
    sender.start()
    deadline = time.monotonic() + 5
    while not box.payments():  # applied; its answer waits out the fault
        assert time.monotonic() < deadline
        time.sleep(0.01)
    box.stop()
    sender.join(5)
    # The handler woke to records already closed, and closed the connection.
    assert len(answers) == 1 and isinstance(answers[0], OSError), answers
    assert "Traceback" not in capsys.readouterr().err
