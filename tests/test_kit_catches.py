"""The adapter kit catches each mistake an adapter written from docs/adapters.md
can make (A3, A5, A8, A10, R7, S3).

Each wrong adapter here is what a user writes by hand for a JSON API, as the
docs' own adapter is written, with one mistake: a lookup that could not be
made read as absence, no idempotency key or a fresh one per send, a lookup's
first item taken as the effect, a credential held as plain text, a target's
text put in the price source. ``check_adapter`` must fail each one naming the
case the mistake breaks, and pass the right ones: the hand-written adapter, the
same with a timeout longer than any fixed stall, the sandbox's declaration and
the docs' own adapter.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import httpx
import pytest

import charter
from charter.conformance import CASES, ECHO_CASES, LOOKUP_CASES, Report, check_adapter
from charter.conformance.http_target import ScriptedHttp
from charter.sandbox import Sandbox
from test_conformance import REQUEST, SandboxTarget

ROOT = Path(__file__).resolve().parent.parent


class Things:
    """The scripted target's API by hand, as docs/adapters.md writes one."""

    name = "things"
    operations: ClassVar[dict[str, charter.Operation]] = {
        "create": charter.Operation(
            charter.EffectClass.IDEMPOTENT_KEYED, dedupe_window_seconds=86_400
        ),
    }

    def __init__(self, url: str, api_key: str, *, timeout: float = 0.5) -> None:
        self.api_key = self.hold(f"Bearer {api_key}")
        self.http = httpx.Client(
            base_url=url,
            timeout=httpx.Timeout(timeout),
            transport=httpx.HTTPTransport(retries=0),
            follow_redirects=False,
        )

    def hold(self, credential: str) -> str | charter.Secret:
        return charter.Secret(credential, name="things-auth")  # scrubbed from all recorded

    def auth(self) -> str:
        key = self.api_key
        return key.reveal() if isinstance(key, charter.Secret) else key

    def estimate(self, operation: str, request: dict[str, Any]) -> charter.Estimate:
        return charter.Estimate({"usd_cents": request["amount"]}, "things/amount")

    def key(self, send: charter.Dispatch) -> str | None:
        return send.idempotency_key

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        headers = {"Authorization": self.auth(), "X-Fencing-Token": send.fencing_token}
        key = self.key(send)
        if key is not None:
            headers["Idempotency-Key"] = key
        request = self.http.build_request("POST", "/v1/things", json=send.request, headers=headers)
        send.check_deadline()
        try:
            response = self.http.send(request)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            raise charter.NotApplied("no connection", evidence={"error": str(exc)}) from None
        if response.status_code in (400, 401, 403, 404, 422):
            return charter.Outcome.failed(response.json(), receipt=self.receipt(response))
        if response.status_code not in (200, 201):
            raise self.unexpected(response)  # may have applied: UNKNOWN
        return self.outcome(response.json(), response)

    def unexpected(self, response: httpx.Response) -> Exception:
        return RuntimeError(f"HTTP {response.status_code}")

    def receipt(self, response: httpx.Response) -> dict[str, Any]:
        return {"status": response.status_code}

    def outcome(self, thing: dict[str, Any], response: httpx.Response) -> charter.Outcome:
        return charter.Outcome.succeeded(
            thing, cost={"usd_cents": thing["amount"]}, receipt={"thing": thing["id"]}
        )

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        try:
            response = self.lookup(attempt)
        except httpx.HTTPError as exc:
            return charter.Evidence.indeterminate({"lookup": str(exc)})
        return self.read(response, attempt)

    def lookup(self, attempt: charter.RecordedAttempt) -> httpx.Response:
        return self.http.get(
            "/v1/things",
            params={"key": attempt.idempotency_key},
            headers={"Authorization": self.auth()},
        )

    def read(self, response: httpx.Response, attempt: charter.RecordedAttempt) -> charter.Evidence:
        try:
            found = response.json()["data"] if response.status_code == 200 else None
        except (ValueError, KeyError, TypeError):
            found = None
        thing = self.pick(found, attempt)
        if thing is None:
            return charter.Evidence.indeterminate({"status": response.status_code})
        return charter.Evidence.applied(self.outcome(thing, response))

    def pick(self, found: Any, attempt: charter.RecordedAttempt) -> dict[str, Any] | None:
        """The effect itself, and ours: the one item, carrying this attempt's key."""
        if not (isinstance(found, list) and len(found) == 1 and isinstance(found[0], dict)):
            return None
        return found[0] if found[0].get("key") == attempt.idempotency_key else None


# -- the mistakes ----------------------------------------------------------------------------


class LookupErrorIsAbsence(Things):
    """Item 13: whatever stops the lookup reads as "the target has no such effect"."""

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        try:
            response = self.lookup(attempt)
        except httpx.HTTPError as exc:
            return charter.Evidence.not_applied({"lookup": str(exc)})
        return self.read(response, attempt)


class RefusedLookupIsAbsence(Things):
    """Item 13: the send's rule ("no connection: nothing was sent") copied to the
    lookup, where a refused connection proves nothing about the effect."""

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        try:
            response = self.lookup(attempt)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            return charter.Evidence.not_applied({"lookup": str(exc)})
        except httpx.HTTPError as exc:
            return charter.Evidence.indeterminate({"lookup": str(exc)})
        return self.read(response, attempt)


class NoKey(Things):
    """Item 14: the idempotency key is never sent."""

    def key(self, send: charter.Dispatch) -> str | None:
        return None


class FreshKey(Things):
    """Item 14: a key made for each send, not the attempt's own."""

    def key(self, send: charter.Dispatch) -> str | None:
        return f"things-{uuid.uuid4()}"


class FirstItem(Things):
    """Item 15: the lookup's first item is taken as the effect, unchecked."""

    def pick(self, found: Any, attempt: charter.RecordedAttempt) -> dict[str, Any] | None:
        return found[0] if isinstance(found, list) and found else None


class PlainKey(Things):
    """Item 16: the API key held as plain text, not a ``charter.Secret``, and the
    target's answer kept whole (headers in the receipt, the body in the error)."""

    def hold(self, credential: str) -> str | charter.Secret:
        return credential

    def unexpected(self, response: httpx.Response) -> Exception:
        return RuntimeError(f"HTTP {response.status_code}: {response.text}")

    def outcome(self, thing: dict[str, Any], response: httpx.Response) -> charter.Outcome:
        return charter.Outcome.succeeded(
            thing,
            cost={"usd_cents": thing["amount"]},
            receipt={"status": response.status_code, "headers": dict(response.headers)},
        )


class QuotedPriceSource(Things):
    """Item 17: the target's whole answer kept as the price's source."""

    def outcome(self, thing: dict[str, Any], response: httpx.Response) -> charter.Outcome:
        return charter.Outcome.succeeded(
            thing, cost={"usd_cents": thing["amount"]}, price_source=response.text
        )


# -- what the kit says about each --------------------------------------------------------------


@pytest.fixture
def target() -> Iterator[ScriptedHttp]:
    with ScriptedHttp() as scripted:
        yield scripted


def broken(adapter: Things, target: ScriptedHttp, cases: tuple[str, ...] = CASES) -> set[str]:
    """The cases the kit names for ``adapter`` (it must name some)."""
    with pytest.raises(AssertionError) as failed:
        check_adapter(adapter, target, operation="create", request=REQUEST, cases=cases)
    adapter.http.close()
    text = str(failed.value)
    assert "secret_never_stored" not in text
    named = set(re.findall(r"^\s+(\w+): ", text, flags=re.MULTILINE))
    assert named <= set(CASES)  # every case it names is one the docs' table lists
    return named


def passes(adapter: Things, target: Any, **options: Any) -> Report:
    try:
        return check_adapter(adapter, target, request=REQUEST, **options)
    finally:
        adapter.http.close()


def test_A3_the_hand_written_adapter_passes_every_case(target: ScriptedHttp) -> None:
    report = passes(Things(target.url, target.secret), target, operation="create")
    assert report.not_played == []
    assert max(target.applies.values()) == 1


def test_A3_R7_item13_a_lookup_that_raises_read_as_not_applied_fails_the_kit(
    target: ScriptedHttp,
) -> None:
    """Broken: the kit's only failing lookup was a 503 answer, so an adapter that
    called a refused, reset or timed-out lookup "not applied" passed it, and under
    ``evidence_settles = "auto"`` an applied payment was settled FAILED."""
    lookups = tuple(c for c in CASES if c.startswith("lookup"))
    assert broken(LookupErrorIsAbsence(target.url, target.secret), target, lookups) == {
        "lookup_refused",
        "lookup_reset",
        "lookup_timeout",
    }
    assert broken(RefusedLookupIsAbsence(target.url, target.secret), target, lookups) == {
        "lookup_refused"
    }


def test_A5_item14_an_adapter_that_sends_no_key_fails_every_case_that_sends(
    target: ScriptedHttp,
) -> None:
    """Broken: the target filed every keyless send under one empty key, so three
    payments read as one and the kit passed."""
    named = broken(NoKey(target.url, target.secret), target)
    sending = {"applied_then_lost", "error_after_applying", "refused_before_applying", "timeout"}
    assert named >= sending | {"same_key_replay", *ECHO_CASES, "huge_answer", "lookup_found"}
    assert set(target.receipts) == {""}  # the target never saw an attempt's key
    assert target.applies[""] > 1  # and applied each keyless send anew, as such an API does


def test_A5_item14_a_keyless_post_is_a_new_effect_each_time_on_the_scripted_target(
    target: ScriptedHttp,
) -> None:
    """Broken: three keyless payments of 100, 200 and 300 were one effect of 100."""
    auth = {"Authorization": f"Bearer {target.secret}"}
    answers = [
        httpx.post(f"{target.url}/v1/things", json={"amount": a}, headers=auth).json()
        for a in (100, 200, 300)
    ]
    assert [a["amount"] for a in answers] == [100, 200, 300]
    assert len({a["id"] for a in answers}) == 3
    assert target.applied("") == 3 and target.received("") == 3


def test_A5_A8_item14_a_fresh_key_per_send_fails_the_same_key_replay(
    target: ScriptedHttp,
) -> None:
    """Broken: with a key made per send, the engine's same-key replay is a new
    payment; the kit never replayed, and checked no key."""
    adapter = FreshKey(target.url, target.secret)
    assert "same_key_replay" in broken(adapter, target, ("same_key_replay",))
    # What the target received: two sends, two keys of the adapter's making, two effects.
    assert len(target.receipts) == 2 and all(k.startswith("things-") for k in target.receipts)
    assert sum(target.applies.values()) == 2


def test_R7_item15_a_lookup_read_without_checking_whose_effect_it_is_fails_the_kit(
    target: ScriptedHttp,
) -> None:
    """Broken: the target's lookup held only the key's own effect, so taking the
    first item unchecked passed; now it answers other clients' effects too."""
    assert broken(FirstItem(target.url, target.secret), target, LOOKUP_CASES) == {
        "lookup_other",
        "lookup_several",
    }


def test_S3_item16_a_leak_is_reported_under_the_echo_case_that_made_it() -> None:
    """Broken: a leak was reported as ``secret_never_stored``, a name the docs'
    table does not list. The key here is held by no ``Secret`` in this process,
    as an adapter holding it as plain text would have it."""
    with ScriptedHttp(secret=f"sk-plain-{uuid.uuid4().hex}") as target:
        named = broken(PlainKey(target.url, target.secret), target, ECHO_CASES)
    assert named == {"echo_in_header", "echo_in_body", "echo_in_exception"}


def test_A3_item16_a_correct_adapter_with_a_long_timeout_passes_timeout(
    target: ScriptedHttp,
) -> None:
    """Broken: the target answered after a fixed 1.5 s, so an adapter waiting
    3 s got the answer and failed ``timeout``; now the target holds its answer
    until the adapter hangs up."""
    adapter = Things(target.url, target.secret, timeout=3.0)
    report = passes(adapter, target, operation="create", cases=("timeout", "lookup_timeout"))
    assert [r.case for r in report.results if r.ok] == ["timeout", "lookup_timeout"]
    assert target.applies and max(target.applies.values()) == 1


def test_S3_A10_item17_a_target_text_in_the_price_source_is_scrubbed_and_bounded(
    target: ScriptedHttp,
) -> None:
    """Broken: the price source was stored as given, so the echoed key and the
    50 MB answer reached the store through it."""
    report = passes(
        QuotedPriceSource(target.url, target.secret),
        target,
        operation="create",
        cases=(*ECHO_CASES, "huge_answer"),
    )
    assert all(r.ok for r in report.results)


def test_A3_the_docs_own_adapter_passes_every_case_the_sandbox_can_play(tmp_path: Path) -> None:
    """The hand-written adapter of docs/adapters.md, taken from the page."""
    page = (ROOT / "docs" / "adapters.md").read_text()
    section = page[page.index("## Your own adapter") :]
    block = re.search(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert block is not None
    scope: dict[str, Any] = {"tmp": tmp_path, "__name__": "docs"}
    exec(compile(block[1], "docs/adapters.md", "exec"), scope)
    with Sandbox(tmp_path / "kit-box.db") as box:
        adapter = scope["Payments"](box.url)
        try:
            report = check_adapter(
                adapter,
                SandboxTarget(box, "no-credential-held-by-the-docs-adapter"),
                operation="pay",
                request=REQUEST,
            )
        finally:
            adapter.http.close()
    assert "same_key_replay" not in report.not_played
    assert {r.case for r in report.results if r.played} >= {"lookup_found", "lookup_down"}
