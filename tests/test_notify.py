"""K3: when a run needs a person, configured webhooks get a signed notice, at least
once, with an id to deduplicate and no secret in it.

Every test posts to a real HTTP server on loopback and asserts on what it
received and on what the store holds; crashes and competing deliverers are
real processes (``_notify_child.py``).
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.config import NOTICE_KINDS, EngineConfig, Webhook
from charter.errors import ConfigError, NotFound, TextRefused, UsageError
from charter.sandbox.server import POLL_SECONDS
from charter.secret import Secret
from charter.testing import ManualClock, RecordingAdapter
from charter.workers.notify import CLAIM_MARGIN_SECONDS, Notices

CHILD = Path(__file__).with_name("_notify_child.py")
SECRET_ENV = "CHARTER_TEST_WEBHOOK_SECRET"


@dataclass
class Received:
    headers: dict[str, str]
    body: bytes
    at: float = 0.0  # when it arrived, by this process's monotonic clock


class Receiver:
    """A webhook endpoint on loopback that keeps every request it gets.

    ``answers`` are given to requests in order (then 200): a status, or
    ``"trickle"``: the status line a byte every 0.2 s, so that no single wait
    is long while the whole answer takes seconds. ``delay`` is slept before
    each answer."""

    def __init__(self) -> None:
        self.got: list[Received] = []
        self.answers: list[int | str] = []
        self.delay = 0.0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                at = time.monotonic()
                body = self.rfile.read(int(self.headers["Content-Length"]))
                with receiver._lock:
                    receiver.got.append(Received(dict(self.headers.items()), body, at))
                    answer = receiver.answers.pop(0) if receiver.answers else 200
                time.sleep(receiver.delay)
                if answer == "trickle":
                    self.close_connection = True
                    try:
                        for byte in b"HTTP/1.1 200 OK\r\n":
                            self.wfile.write(bytes([byte]))
                            self.wfile.flush()
                            time.sleep(0.2)
                        self.wfile.write(b"Content-Length: 0\r\n\r\n")
                    except OSError:
                        pass  # the deliverer hung up: what the test wants
                    return
                assert isinstance(answer, int)
                self.send_response(answer)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, format: str, *args: Any) -> None:
                pass

        class Server(ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a connection the deliverer cut

        self.server = Server(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.server.serve_forever, args=(POLL_SECONDS,), daemon=True
        )
        self.thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}/hooks/charter?source=test"

    def ids(self) -> list[str]:
        return [r.headers["Charter-Notice-Id"] for r in self.got]

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def signature_holds(secret: str, got: Received) -> bool:
    """The documented check, written from docs/notices.md, not from the sender."""
    timestamp = got.headers["Charter-Timestamp"]
    mac = hmac.new(secret.encode(), timestamp.encode() + b"." + got.body, hashlib.sha256)
    return hmac.compare_digest(got.headers["Charter-Signature"], "v1=" + mac.hexdigest())


def verified(secret: str, got: Received) -> dict[str, Any]:
    assert signature_holds(secret, got)
    body: dict[str, Any] = json.loads(got.body)
    assert body["id"] == got.headers["Charter-Notice-Id"]
    return body


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> str:
    value = "whsec-" + secrets.token_hex(16)
    monkeypatch.setenv(SECRET_ENV, value)
    return value


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver()
    yield r
    r.close()


@pytest.fixture
def run(engine: charter.Engine, who: Any, mission: str) -> tuple[str, str, str]:
    """A run with one settled attempt: (run id, mission id, attempt id)."""
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    attempt = ex.perform(RecordingAdapter(), "write", {"n": 1}, effect_key="k1")
    return ex.run_id, mission, attempt.id


def hook(url: str, timeout: float = 2.0, **kw: Any) -> Webhook:
    return Webhook("ops", url, Secret.env(SECRET_ENV), timeout_seconds=timeout, **kw)


def count(raw: RawStore, table: str) -> int:
    return int(raw.rows(f"SELECT COUNT(*) AS n FROM {table}")[0]["n"])


def test_K3_a_notice_reaches_the_webhook_signed_with_its_id_run_and_links(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
) -> None:
    run_id, mission, attempt = run
    notices = Notices(engine, [hook(receiver.url)])
    needs = [f"attempt {attempt} is UNKNOWN and no lookup settles it"]
    nid = notices.post(run_id, mission, "unknown_attempt", needs, [attempt])
    assert nid is not None and receiver.got == []  # written, not sent, by post

    assert notices.deliver_due() == 1
    [got] = receiver.got
    body = verified(secret, got)
    [notice] = notices.notices(run_id)
    created = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(notice.created_at_us // 1_000_000))
    assert body == {
        "id": nid,
        "created_at": body["created_at"],
        "kind": "unknown_attempt",
        "run_id": run_id,
        "mission_id": mission,
        "needs": needs,
        "links": {"run": run_id, "attempts": [attempt], "console": f"/console/runs/{run_id}"},
    }
    assert body["created_at"].startswith(created) and body["created_at"].endswith("Z")
    assert got.headers["Content-Type"] == "application/json"
    assert int(got.headers["Charter-Timestamp"]) == engine.clock.now_us() // 1_000_000
    # Another key, or another body, does not verify.
    assert not signature_holds(secret + "x", got)
    assert not signature_holds(
        secret, Received(got.headers, got.body.replace(b"UNKNOWN", b"KNOWN"))
    )

    [delivery] = notices.deliveries(nid)
    assert (delivery.status, delivery.tries, delivery.last_error) == ("delivered", 1, None)
    assert notices.pending() == 0
    assert notices.deliver_due() == 0 and len(receiver.got) == 1


def test_K3_the_same_reason_is_posted_once_and_a_new_reason_again(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    raw: RawStore,
) -> None:
    run_id, mission, attempt = run
    notices = Notices(engine, [hook(receiver.url)])
    blockers = ["an approval is waited for", "incident inc_1 is open"]
    first = notices.post(run_id, mission, "cannot_resume", blockers, [attempt])
    # The worker looks again at every poll: the same reason, in any order, is not news.
    for _ in range(3):
        assert notices.post(run_id, mission, "cannot_resume", blockers[::-1], [attempt]) is None
    assert notices.deliver_due() == 1
    assert notices.post(run_id, mission, "cannot_resume", blockers, [attempt]) is None
    second = notices.post(run_id, mission, "cannot_resume", ["incident inc_1 is open"], [attempt])
    third = notices.post(run_id, mission, "incident", ["incident inc_1 is open"], [attempt])
    assert notices.deliver_due() == 2
    assert len({first, second, third}) == 3 and None not in {first, second, third}
    assert receiver.ids() == [first, second, third]
    assert [verified(secret, g)["kind"] for g in receiver.got] == [
        "cannot_resume",
        "cannot_resume",
        "incident",
    ]
    assert count(raw, "notices") == 3 and count(raw, "notice_deliveries") == 3
    # A worker that does not tell which kind posts needs_person; its needs say what for.
    fourth = notices.post(run_id, mission, "needs_person", ["run is paused: usd"], [])
    assert notices.deliver_due() == 1 and receiver.ids()[-1] == fourth
    assert verified(secret, receiver.got[-1])["links"]["attempts"] == []


def test_K3_a_retry_after_a_500_sends_the_same_id(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    clock: ManualClock,
) -> None:
    run_id, mission, attempt = run
    receiver.answers = [500]
    notices = Notices(engine, [hook(receiver.url)])
    nid = notices.post(run_id, mission, "approval", ["approval apr_1 waits for bob"], [attempt])
    assert notices.deliver_due() == 0
    [delivery] = notices.deliveries(nid)
    assert (delivery.status, delivery.tries) == ("pending", 1)
    assert delivery.last_error == "answered HTTP 500"
    assert notices.deliver_due() == 0 and len(receiver.got) == 1  # not due yet

    clock.advance((delivery.due_at_us - clock.now_us()) / 1_000_000)
    assert notices.deliver_due() == 1
    assert receiver.ids() == [nid, nid]
    first, again = (verified(secret, g) for g in receiver.got)
    assert first == again
    assert notices.deliveries(nid)[0].status == "delivered"


def test_K3_a_send_is_bounded_by_its_timeout_and_retried_with_the_same_id(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    clock: ManualClock,
) -> None:
    """An endpoint that answers a byte at a time never lets one socket wait run
    out; the delivery still ends at its webhook's timeout."""
    run_id, mission, attempt = run
    receiver.answers = ["trickle"]
    notices = Notices(engine, [hook(receiver.url, timeout=0.5)])
    nid = notices.post(run_id, mission, "input", ["input 'iban' is waited for"], [attempt])
    began = time.monotonic()
    assert notices.deliver_due() == 0
    assert time.monotonic() - began < 1.5  # the trickle takes 3.4 s
    [delivery] = notices.deliveries(nid)
    assert (delivery.status, delivery.last_error) == ("pending", "no answer within 0.5 s")

    clock.advance((delivery.due_at_us - clock.now_us()) / 1_000_000)
    assert notices.deliver_due() == 1
    assert receiver.ids() == [nid, nid]
    assert verified(secret, receiver.got[0]) == verified(secret, receiver.got[1])


def test_K3_retries_back_off_exponentially_with_jitter_up_to_a_cap(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    clock: ManualClock,
) -> None:
    run_id, mission, attempt = run
    receiver.answers = [500] * 7
    notices = Notices(engine, [hook(receiver.url)], backoff_seconds=1.0, backoff_cap_seconds=20.0)
    nid = notices.post(run_id, mission, "allowance", ["usd is exhausted"], [attempt])
    assert nid is not None
    waits = []
    for n in range(1, 8):
        assert notices.deliver_due() == 0
        [delivery] = notices.deliveries(nid)
        assert delivery.tries == n and len(receiver.got) == n
        wait = (delivery.due_at_us - clock.now_us()) / 1_000_000
        ceiling = min(20.0, 2.0 ** (n - 1))
        assert ceiling / 2 <= wait <= ceiling
        waits.append(wait)
        clock.advance(wait - 0.01)
        assert notices.deliver_due() == 0 and len(receiver.got) == n  # not before it is due
        clock.advance(0.01)
    # Measured, each wait longer than the one before until the cap; jittered.
    assert waits[:5] == sorted(set(waits[:5])) and waits[4] > 4 * waits[0]
    assert max(waits) <= 20.0
    assert len({round(w / 2**i, 6) for i, w in enumerate(waits[:5])}) > 1
    assert notices.deliver_due() == 1
    assert receiver.ids() == [nid] * 8


def _child(tmp_path: Path, name: str, **cfg: Any) -> subprocess.Popen[str]:
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps(cfg))
    return subprocess.Popen(
        [sys.executable, str(CHILD), str(path)], stdout=subprocess.PIPE, text=True
    )


@pytest.mark.crash
def test_K3_a_crash_between_send_and_mark_sends_the_same_id_again(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    clock: ManualClock,
    store_address: str,
    tmp_path: Path,
) -> None:
    run_id, mission, attempt = run
    notices = Notices(engine, [hook(receiver.url)])
    nid = notices.post(run_id, mission, "unknown_attempt", ["no lookup settles it"], [attempt])
    child = _child(
        tmp_path,
        "crash",
        mode="crash",
        store=store_address,
        url=receiver.url,
        secret_env=SECRET_ENV,
        now_us=clock.now_us(),
    )
    child.communicate(timeout=60)
    assert child.returncode == -9  # SIGKILL at notice.sent
    assert receiver.ids() == [nid]
    [delivery] = notices.deliveries(nid)
    assert (delivery.status, delivery.tries) == ("pending", 1)  # sent, never marked

    # While the dead deliverer's claim lasts, nobody sends it again...
    assert notices.deliver_due() == 0 and receiver.ids() == [nid]
    # ... then it is sent again, with the same id and body.
    clock.advance(5 + CLAIM_MARGIN_SECONDS + 1)
    assert notices.deliver_due() == 1
    assert receiver.ids() == [nid, nid]
    assert verified(secret, receiver.got[0]) == verified(secret, receiver.got[1])
    assert notices.deliveries(nid)[0].status == "delivered"


@pytest.mark.crash
def test_K3_two_deliverer_processes_deliver_each_notice_exactly_once(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    clock: ManualClock,
    store_address: str,
    tmp_path: Path,
) -> None:
    run_id, mission, attempt = run
    notices = Notices(engine, [hook(receiver.url)])
    posted = [
        notices.post(run_id, mission, "approval", [f"approval {n} waits"], [attempt])
        for n in range(40)
    ]
    receiver.delay = 0.02  # long enough for the two to overlap
    cfg = {"store": store_address, "url": receiver.url, "secret_env": SECRET_ENV}
    children = [
        _child(tmp_path, f"drain{n}", mode="drain", now_us=clock.now_us(), **cfg) for n in (1, 2)
    ]
    reports = []
    for child in children:
        out, _ = child.communicate(timeout=90)
        assert child.returncode == 0
        reports.append(json.loads(out.splitlines()[-1]))
    assert sorted(receiver.ids()) == sorted(posted)  # each once, none twice
    assert sum(r["delivered"] for r in reports) == 40
    assert notices.pending() == 0
    assert all(verified(secret, g)["kind"] == "approval" for g in receiver.got)


def test_K3_a_secret_echoed_into_a_reason_never_reaches_the_receiver(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    raw: RawStore,
) -> None:
    run_id, mission, attempt = run
    key = Secret("sk-live-" + secrets.token_hex(12), name="payments-key").reveal()
    basic = base64.b64encode(f"user:{key}".encode()).decode()
    late = "late-" + secrets.token_hex(12)  # known as a secret only after the post
    notices = Notices(engine, [hook(receiver.url)])
    needs = [
        f"the target answered 401 for key {key}",
        json.dumps({"echo": {"api_key": key}}),
        f"webhook signed with {secret}",
        f"the target said {late}",
    ]
    nid = notices.post(run_id, mission, "cannot_resume", needs, [attempt])
    assert nid is not None
    stored = json.dumps(raw.rows("SELECT * FROM notices"))
    assert key not in stored and secret not in stored and basic not in stored
    assert late in stored  # nobody had said it was a secret yet

    Secret(late, name="late-token")  # this process learns it is one
    assert notices.deliver_due() == 1
    [got] = receiver.got
    text = got.body.decode()
    for value in (key, secret, late, json.dumps(key)[1:-1]):
        assert value not in text
    assert verified(secret, got)["needs"] == [
        "the target answered 401 for key ***",
        json.dumps({"echo": {"api_key": "***"}}),
        "webhook signed with ***",
        "the target said ***",
    ]


def _toml(table: dict[str, Any]) -> str:
    lines = "".join(f"{k} = {json.dumps(v)}\n" for k, v in table.items())
    return f'store = "charter.db"\n\n[webhooks.ops]\n{lines}'


BAD = [
    ({"url": "ftp://ops.example.com/x", "secret": "env:HOOK"}, "url must be"),
    ({"url": "https://me:pw@ops.example.com/x", "secret": "env:HOOK"}, "url must be"),
    ({"url": "https://ops.example.com/x", "secret": "whsec-written-here"}, "secret must"),
    ({"url": "https://ops.example.com/x"}, "takes url and secret"),
    ({"url": "https://ops.example.com/x", "secret": "env:HOOK", "events": ["bogus"]}, "events"),
    ({"url": "https://ops.example.com/x", "secret": "env:HOOK", "events": []}, "events"),
    ({"url": "https://ops.example.com/x", "secret": "env:HOOK", "timeout_seconds": 0}, "timeout"),
    ({"url": "https://ops.example.com/x", "secret": "env:HOOK", "retries": 3}, "'retries'"),
]


@pytest.mark.parametrize(("table", "says"), BAD, ids=[s for _, s in BAD])
def test_K3_bad_webhook_configuration_is_a_config_error(
    tmp_path: Path, table: dict[str, Any], says: str
) -> None:
    path = tmp_path / "charter.toml"
    path.write_text(_toml(table))
    with pytest.raises(ConfigError) as refused:
        EngineConfig.from_file(path)
    assert says in refused.value.message
    assert "whsec-written-here" not in refused.value.message
    assert list(tmp_path.iterdir()) == [path]  # no store was made from it


def test_K3_a_webhook_is_configured_in_toml_with_its_secret_named_not_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    value = "whsec-" + secrets.token_hex(16)
    monkeypatch.setenv("HOOK", value)
    path = tmp_path / "charter.toml"
    path.write_text(
        _toml({"url": "https://ops.example.com/x", "secret": "env:HOOK", "events": ["approval"]})
    )
    config = EngineConfig.from_file(path)
    ops = config.webhooks["ops"]
    assert (ops.url, ops.events, ops.timeout_seconds) == (
        "https://ops.example.com/x",
        ("approval",),
        10.0,
    )
    assert ops.secret.name == "env:HOOK" and ops.secret.reveal() == value
    assert value not in repr(config)
    assert ops.takes("approval") and not ops.takes("incident")
    assert set(NOTICE_KINDS) >= {"approval", "unknown_attempt", "cannot_resume"}


def test_K3_a_webhook_that_cannot_sign_is_refused_and_nothing_changes(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    raw: RawStore,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("CHARTER_TEST_SHORT", "short-key")
    threads = threading.active_count()
    unset = Webhook("ops", receiver.url, Secret(None, name="env:CHARTER_TEST_UNSET"))
    short = Webhook("ops", receiver.url, Secret.env("CHARTER_TEST_SHORT"))
    for webhooks, says in (
        ([unset], "is not available"),
        ([short], "at least 16"),
        ([hook(receiver.url), hook(receiver.url)], "two webhooks"),
    ):
        with pytest.raises(ConfigError) as refused:
            Notices(engine, webhooks)
        assert says in refused.value.message
    with pytest.raises(ConfigError):
        Notices(engine, [hook(receiver.url)], backoff_seconds=10, backoff_cap_seconds=1)
    assert "short-key" not in str(refused.value)
    assert threading.active_count() == threads and receiver.got == []
    assert count(raw, "notices") == 0 and count(raw, "notice_deliveries") == 0


def test_K3_a_bad_notice_is_refused_with_a_typed_error_and_nothing_is_written(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    raw: RawStore,
    who: Any,
) -> None:
    run_id, mission, attempt = run
    other = engine.start_run(mission, by=who.agent, segment_id="seg-2")
    theirs = other.perform(RecordingAdapter(), "write", {"n": 2}, effect_key="k2").id
    notices = Notices(engine, [hook(receiver.url)])
    refusals: list[tuple[type[Exception], Any]] = [
        (UsageError, lambda: notices.post(run_id, mission, "bogus", ["x"], [attempt])),
        (UsageError, lambda: notices.post(run_id, mission, "incident", [], [attempt])),
        (UsageError, lambda: notices.post(run_id, mission, "incident", "x", [attempt])),
        (UsageError, lambda: notices.post(run_id, "mis_other", "incident", ["x"], [attempt])),
        (NotFound, lambda: notices.post("run_nope", mission, "incident", ["x"], [])),
        (NotFound, lambda: notices.post(run_id, mission, "incident", ["x"], [theirs])),
        (TextRefused, lambda: notices.post(run_id, mission, "incident", ["a\0b"], [])),
    ]
    for error, call in refusals:
        with pytest.raises(error):
            call()
    assert count(raw, "notices") == 0 and count(raw, "notice_deliveries") == 0
    # A kind no webhook takes is not written either.
    picky = Notices(engine, [hook(receiver.url, events=("approval",))])
    assert picky.post(run_id, mission, "incident", ["incident open"], [attempt]) is None
    assert count(raw, "notices") == 0
    assert notices.deliver_due() == 0 and receiver.got == []


def test_K3_a_dead_endpoint_never_blocks_the_worker(
    engine: charter.Engine,
    run: tuple[str, str, str],
    receiver: Receiver,
    secret: str,
    clock: ManualClock,
) -> None:
    """The deliverer's thread is stuck on an endpoint that trickles; the worker
    posts meanwhile at once, and stop() returns within the send's bound."""
    run_id, mission, attempt = run
    receiver.answers = ["trickle"]
    notices = Notices(engine, [hook(receiver.url, timeout=1.0)], poll_seconds=60)
    notices.start()
    try:
        first = notices.post(run_id, mission, "incident", ["incident inc_1 is open"], [attempt])
        deadline = time.monotonic() + 5
        while not receiver.got and time.monotonic() < deadline:
            time.sleep(0.01)  # woken by the post, not by its 60 s poll
        assert receiver.ids() == [first]
        began = time.monotonic()
        second = notices.post(run_id, mission, "allowance", ["calls exhausted"], [attempt])
        assert time.monotonic() - began < 0.5 and second is not None
    finally:
        began = time.monotonic()
        notices.stop()
        assert time.monotonic() - began < 2.0
    notices.start()
    try:
        with pytest.raises(UsageError):
            notices.start()  # one thread per deliverer
    finally:
        notices.stop()
    clock.advance(CLAIM_MARGIN_SECONDS + 10)
    while notices.deliver_due():
        pass
    assert sorted(set(receiver.ids())) == sorted([first, second])
    assert notices.pending() == 0
