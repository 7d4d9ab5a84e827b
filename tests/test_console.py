"""The console's sessions and forms (P1): sign-in with a credential gives a fresh,
server-issued session (HttpOnly, SameSite=Strict, Secure off loopback); every
form needs the session's CSRF token; a refused form changes nothing.
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote

import httpx
import pytest

import _desk
import charter
from _raw import RawStore
from charter import AttemptStatus
from charter.server import pages
from charter.server.console import _environment
from charter.testing import RecordingAdapter, credential
from conftest import Principals, default_contract, stored


@pytest.fixture
def who(desk: charter.Engine, creds: tuple[dict[str, str], dict[str, str]]) -> Principals:
    return Principals(creds[0], creds[1], desk)


@pytest.fixture
def base(desk: charter.Engine) -> Iterator[str]:
    with _desk.serving(desk) as url:
        yield url


def browse(base: str, **options: Any) -> httpx.Client:
    """A client that follows redirects and keeps cookies, as a browser does."""
    return httpx.Client(base_url=base, follow_redirects=True, **options)


def csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([^"]+)"', html)
    assert found is not None, html
    return found.group(1)


def sign_in(http: httpx.Client, credential: str) -> httpx.Response:
    form = http.get("/console/login")
    return http.post(
        "/console/login",
        data={"csrf": csrf(form.text), "credential": credential, "next": "/console/inbox"},
    )


def pending(desk: charter.Engine, who: Principals) -> tuple[str, str]:
    contract = default_contract(approvals={"required": ["recorder.write"], "ttl_seconds": 60})
    mission = desk.create_mission(contract, by=who.alice)
    ex = desk.start_run(
        mission, by=who.agent, segment_id="s1", plan=_desk.pay_plan, input={"to": "a", "amount": 1}
    )
    with pytest.raises(charter.Blocked):
        ex.execute()
    return mission, desk.approvals(pending=True)[0].id


def test_P1_sign_in_issues_a_new_server_made_session_and_ignores_a_planted_one(
    desk: charter.Engine, base: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken P1 (session fixation): a session ID the browser held before signing in
    becomes the signed-in session, or an old session survives a new sign-in."""
    with browse(base) as http:
        http.cookies.set("charter_session", "planted-by-someone-else", domain="127.0.0.1")
        assert http.get("/console/inbox").url.path == "/console/login"
        signed = sign_in(http, creds[0]["alice"])
        first = http.cookies["charter_session"]
        assert signed.url.path == "/console/inbox"
        assert first != "planted-by-someone-else" and len(first) >= 40
        sign_in(http, creds[0]["bob"])
        second = http.cookies["charter_session"]
        assert second != first
        assert 'id="me">bob<' in http.get("/console/inbox").text
    with browse(base, cookies={"charter_session": first}) as old:
        assert old.get("/console/inbox").url.path == "/console/login"


def test_P1_session_cookie_is_httponly_strict_and_secure_off_loopback(
    desk: charter.Engine, base: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken P1: the session cookie is readable by scripts, sent cross-site, or sent
    over plain HTTP when the console is served off loopback."""
    with browse(base) as http:
        signed = sign_in(http, creds[0]["alice"])
        cookie = signed.history[0].headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Secure" not in cookie
    with _desk.serving(desk, secure=True) as url, browse(url) as http:
        form = http.get("/console/login")
        answer = http.post(
            "/console/login",
            data={"csrf": csrf(form.text), "credential": creds[0]["alice"]},
            follow_redirects=False,
        )
        assert "Secure" in answer.headers["set-cookie"]


def test_P1_bad_credential_signs_nobody_in_and_is_audited(desk: charter.Engine) -> None:
    """Broken P1: a wrong credential opens a session, or its refusal is not
    audited: it is written in the engine chain's summary of refused credentials,
    with the principal it claimed to be (P4: counted, not written one by one)."""
    with _desk.serving(desk) as base, browse(base) as http:
        answer = sign_in(http, "alice:" + "y" * 43)
        assert answer.status_code == 401 and "unauthenticated" in answer.text
        assert "charter_session" not in http.cookies
    refused = [e for e in desk.audit_events("engine") if e["kind"] == "auth.refused"]
    assert [(e["actor"], e["entity"]) for e in refused] == [("?", "anonymous")]
    summary = json.loads(refused[0]["payload"])
    assert (summary["count"], summary["principals"]) == (1, {"alice": 1})


def test_P1_forms_without_the_sessions_csrf_token_are_refused_and_change_nothing(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken P1 (CSRF): a console form posted without the session's token (or with
    another session's, or to sign in without the sign-in token) is carried out."""
    mission, approval = pending(desk, who)
    before = stored(desk, mission)
    with browse(base) as other:
        sign_in(other, creds[0]["bob"])
        foreign = csrf(other.get("/console/inbox").text)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        for token in ({}, {"csrf": ""}, {"csrf": foreign}):
            answer = http.post(f"/console/approvals/{approval}/approve", data=token)
            assert answer.status_code == 403 and "csrf_refused" in answer.text
        no_token = http.post("/console/login", data={"credential": creds[0]["alice"]})
        assert no_token.status_code == 403
    assert stored(desk, mission) == before
    assert desk.approval(approval).status.value == "pending"


def test_P1_console_decision_is_the_engines_refused_without_the_right_and_audited(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken P1: the console decides for a principal without the right, or the
    refusal is not shown or not in the run's audit timeline."""
    _, approval = pending(desk, who)
    run_id = desk.approval(approval).run_id
    with browse(base) as http:
        sign_in(http, creds[0]["mallory"])
        page = http.get("/console/inbox").text
        answer = http.post(
            f"/console/approvals/{approval}/approve",
            data={"csrf": csrf(page), "back": f"/console/runs/{run_id}"},
        )
        assert "refused (not_authorized)" in answer.text
        assert "authorization.refused" in answer.text  # the run page's timeline
    assert desk.approval(approval).status.value == "pending"
    assert any(
        e["kind"] == "authorization.refused" and e["actor"] == "mallory"
        for e in desk.timeline(run_id)
    )


# -- a run's audit timeline, paged ------------------------------------------------------


def finished(desk: charter.Engine, who: Principals, mission: str, to: str) -> str:
    """A run of ``pay_plan`` carried to its end; its ID."""
    ex = desk.start_run(
        mission, by=who.agent, segment_id="s1", plan=_desk.pay_plan, input={"to": to, "amount": 1}
    )
    ex.execute()
    return ex.run_id


def two_runs(desk: charter.Engine, who: Principals) -> tuple[str, str, str]:
    """Two finished runs of one mission, then refusals about the first: the first
    run's events lie on both sides of the second's on the mission's chain."""
    mission = desk.create_mission(default_contract(), by=who.alice)
    ran = [finished(desk, who, mission, to) for to in ("a", "b")]
    for _ in range(3):
        with pytest.raises(charter.NotAuthorized):
            desk.stop_run(ran[0], by=who.mallory)
    return mission, ran[0], ran[1]


def about(desk: charter.Engine, mission: str, run_id: str) -> list[int]:
    """The seqs of the mission's events about ``run_id``: the run's own and its
    nodes', its attempts' and its approvals'."""
    mine = {run_id, *(a.id for a in desk.attempts(run_id=run_id))}
    return [
        e["seq"]
        for e in desk.audit_events(mission)
        if e["entity"] in mine or e["entity"].startswith(run_id + "/")
    ]


def test_S1_a_runs_timeline_is_its_own_events_newest_page_first(
    desk: charter.Engine, who: Principals
) -> None:
    """Broken: the timeline shows another run's events, leaves out its nodes', or a
    page is not the newest events before its cursor, in order."""
    mission, first, second = two_runs(desk, who)
    mine = about(desk, mission, first)
    assert len(mine) > 7 and max(about(desk, mission, second)) < mine[-1]
    assert [e["seq"] for e in desk.timeline(first)] == mine
    assert {"node.started", "node.completed"} <= {e["kind"] for e in desk.timeline(first)}
    pages, before = [], None
    while True:
        page = desk.timeline(first, before=before, limit=3)
        if not page:
            break
        assert len(page) <= 3 and [e["seq"] for e in page] == sorted(e["seq"] for e in page)
        pages.insert(0, [e["seq"] for e in page])
        before = page[0]["seq"]
    assert pages[-1] == mine[-3:]
    assert [s for p in pages for s in p] == mine


def test_S1_the_api_pages_a_runs_timeline_newest_first(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: ``GET /runs/{id}/timeline`` answers every event at once, or its
    ``next`` cursor skips or repeats events."""
    mission, first, _ = two_runs(desk, who)
    mine = about(desk, mission, first)
    auth = {"Authorization": f"Bearer {creds[0]['alice']}"}
    pages_read: list[list[int]] = []
    query = "?limit=3"
    with httpx.Client(base_url=base, headers=auth) as http:
        while query:
            answer = http.get(f"/api/v1/runs/{first}/timeline{query}").json()
            pages_read.insert(0, [e["seq"] for e in answer["items"]])
            query = f"?limit=3&before={answer['next']}" if answer["next"] else ""
        bad = http.get(f"/api/v1/runs/{first}/timeline?before=-1")
    assert pages_read[-1] == mine[-3:] and [s for p in pages_read for s in p] == mine
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "usage_error"


def test_a_timeline_page_of_no_events_is_refused_and_changes_nothing(
    desk: charter.Engine, who: Principals
) -> None:
    """Bad input: a page size under one is a usage error that names the fix."""
    mission, first, _ = two_runs(desk, who)
    before = stored(desk, mission), desk.audit_events(mission)
    with pytest.raises(charter.UsageError, match="limit"):
        desk.timeline(first, limit=0)
    assert (stored(desk, mission), desk.audit_events(mission)) == before


def test_S1_the_run_page_shows_the_newest_events_and_links_to_older_ones(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: the run page lists every event of the run (or of its mission) at
    once, its "older" link skips or repeats events, or another run's show up."""
    monkeypatch.setattr(pages, "TIMELINE_ROWS", 4)
    mission, first, second = two_runs(desk, who)
    mine = about(desk, mission, first)
    others = {a.id for a in desk.attempts(run_id=second)} | {second}
    shown: list[list[int]] = []
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        url: str | None = f"/console/runs/{first}"
        while url is not None:
            html = http.get(url).text
            rows = re.findall(r'<tr class="[^"]*" data-seq="(\d+)">', html)
            shown.insert(0, [int(s) for s in rows])
            assert not any(other in html for other in others)
            older = re.search(r'href="(/console/runs/[^"]+)"[^>]*>older events', html)
            url = older.group(1).replace("&amp;", "&") if older else None
    assert shown[-1] == mine[-4:]
    assert [s for p in shown for s in p] == mine


def test_the_timeline_reads_by_index_whatever_else_the_mission_holds(
    desk: charter.Engine, who: Principals, store_url: str
) -> None:
    """Broken: reading a run's timeline costs more the more events other runs of
    its mission hold (a scan of the mission's chain). On SQLite only (asking for
    ``store_url`` says so): it counts SQLite's virtual machine steps, and
    SQLite's planner is the one that needs telling which index to read."""
    mission, first, _ = two_runs(desk, who)
    conn = desk._db.driver._conn  # type: ignore[attr-defined]
    steps = [0]

    def count() -> int:
        steps[0] += 1
        return 0

    def cost() -> int:
        steps[0] = 0
        conn.set_progress_handler(count, 1)
        try:
            desk.timeline(first, limit=5)
        finally:
            conn.set_progress_handler(None, 1)
        return steps[0]

    alone = cost()
    for _ in range(20):
        finished(desk, who, mission, "c")
    assert cost() <= alone * 1.1


def test_the_timeline_index_exists_after_migrating(desk: charter.Engine, raw: RawStore) -> None:
    """Broken: a store migrated to the latest schema lacks the index the timeline reads by."""
    names = {str(r.get("name") or r.get("indexname")) for r in raw.dump()["schema"]}
    assert "audit_events_entity" in names


def test_console_pages_read_a_records_keys_and_a_dicts_own_methods() -> None:
    """Broken: reading a record's keys directly lets a key shadow a dict's own
    method (a unit named ``items`` would break every amount shown)."""
    page = _environment().from_string("{{ r.id }} {{ r.missing }}|{{ m.items() | list | length }}")
    assert page.render(r={"id": "run_1"}, m={"items": 7, "usd": 1}) == "run_1 |2"


@pytest.mark.parametrize("raw", [True, False], ids=["request-line", "url-object"])
def test_a_page_knows_its_own_path_with_an_encoded_question_mark_kept_in_it(raw: bool) -> None:
    """Broken: the path a page links back to (its forms' ``back``, its live
    refresh) decodes ``%3F``, so the rest of the path turns into a query."""
    from starlette.requests import Request

    from charter.server.console import _here

    scope: dict[str, Any] = {
        "type": "http",
        "method": "GET",
        "scheme": "http",
        "server": ("127.0.0.1", 80),
        "root_path": "",
        "path": "/console/runs/a?b",
        "query_string": b"before=7",
        "headers": [(b"host", b"127.0.0.1")],
    }
    if raw:
        scope["raw_path"] = b"/console/runs/a%3Fb"
    assert _here(Request(scope)) == "/console/runs/a%3Fb?before=7"
    assert _here(Request({**scope, "query_string": b""})) == "/console/runs/a%3Fb"


def test_every_page_template_is_compiled_before_the_first_request(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Broken: templates compile on first use, so each worker's first visitors (and
    everyone queued behind them) wait for the compiler."""
    env = _environment()
    assert env.loader is not None
    templates = env.loader.list_templates()
    assert {"run.html", "runs.html", "inbox.html", "queue.html", "base.html"} <= set(templates)

    def compiling(*args: Any) -> Any:
        raise AssertionError("a template was compiled on a request")

    monkeypatch.setattr(env.loader, "get_source", compiling)
    for name in templates:
        env.get_template(name)  # from the compiled cache only


def test_a_forged_or_malformed_notes_cookie_shows_nothing_or_shows_it_escaped(
    desk: charter.Engine, base: str, creds: tuple[dict[str, str], dict[str, str]]
) -> None:
    """Broken: a notes cookie the browser was handed back altered breaks the page,
    or what it says reaches the page as markup."""
    forged = base64.urlsafe_b64encode(json.dumps(["<script>x()</script>"]).encode()).decode()
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        for packed in ("%%%not-base64", base64.urlsafe_b64encode(b"{}").decode(), "bm90IGpzb24="):
            http.cookies.set("charter_notes", packed, domain="127.0.0.1", path="/console")
            page = http.get("/console/inbox")
            assert page.status_code == 200 and 'class="note' not in page.text
        http.cookies.set("charter_notes", forged, domain="127.0.0.1", path="/console")
        page = http.get("/console/inbox")
        assert "&lt;script&gt;x()&lt;/script&gt;" in page.text and "<script>x()" not in page.text
        assert 'class="note' not in http.get("/console/inbox").text  # shown once


def test_a_ledger_chart_reads_a_window_of_newest_entries_and_ends_at_the_balance(
    desk: charter.Engine, who: Principals, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken: the ledger page's chart reads every entry a mission ever made (a
    long mission's page grows without bound), or a window of the newest ones
    draws a line that does not end at the balance."""
    mission = desk.create_mission(default_contract(), by=who.alice)
    ex = desk.start_run(mission, by=who.agent, segment_id="s1")
    for i in range(4):
        ex.perform(_desk.ADAPTER, "write", {"to": "a", "amount": i}, effect_key=f"pay-{i}")
    now = desk.balances(mission)["usd"]
    every = desk.ledger_entries(mission, unit="usd")
    assert desk.ledger_entries(mission, unit="usd", newest=3) == every[-3:]
    assert len(every) > 3 and {e["unit"] for e in every} == {"usd"}
    whole = pages.chart("usd", every, now)
    window = pages.chart("usd", every[-3:], now)
    top = whole["top"]

    def last(points: str) -> float:
        return float(points.rsplit(maxsplit=1)[-1].split(",")[1])

    assert last(whole["spent"]) == pytest.approx(80 - 78 * now.spent / top, abs=0.1)
    assert last(window["spent"]) == pytest.approx(80 - 78 * now.spent / window["top"], abs=0.1)
    assert last(window["limit"]) == pytest.approx(80 - 78 * now.limit / window["top"], abs=0.1)
    assert float(whole["spent"].split()[0].split(",")[1]) > last(whole["spent"])  # spend rose
    asked: list[dict[str, Any]] = []
    read = desk.ledger_entries

    def spy(*args: Any, **options: Any) -> list[dict[str, Any]]:
        asked.append(options)
        return read(*args, **options)

    monkeypatch.setattr(desk, "ledger_entries", spy)
    page = pages.ledger(desk, {}, {"mission": mission})
    assert {c["unit"] for c in page["charts"]} == set(desk.balances(mission))
    assert asked and all(o["newest"] == pages.CHART_ENTRIES for o in asked)


@pytest.mark.parametrize("newest", [0, -1, True, "3", 2.5])
def test_a_ledger_window_of_no_entries_is_refused(
    desk: charter.Engine, who: Principals, newest: Any
) -> None:
    """Broken: a window of no (or no whole number of) entries reads something."""
    mission = desk.create_mission(default_contract(), by=who.alice)
    with pytest.raises(charter.UsageError):
        desk.ledger_entries(mission, newest=newest)


@pytest.mark.parametrize("workers", [1, 2])
def test_the_addresses_charter_serve_prints_answer(tmp_path: Path, workers: int) -> None:
    """Broken: ``charter serve`` prints ``/console/`` (and ``/api/v1``) and then
    answers 404 there, or prints them before it listens, or prints port 0 when
    the system chose one. Run for real on port 0: the printed console address opens the
    sign-in page, the printed API address asks for a credential and answers
    with one; ``--max-body`` is its body limit, and every refused credential it
    counted is written when it is stopped (P4), by each of its workers."""
    alice, digest = credential("alice")
    (tmp_path / "charter.toml").write_text(
        f'store = "charter.db"\n[credentials]\nalice = "{digest}"\n'
    )
    config = charter.EngineConfig.from_file(str(tmp_path / "charter.toml"))
    charter.Engine.open(str(tmp_path / "charter.db"), config=config).close()
    serve = ["serve", "--port", "0", "--max-body", "4096", "--workers", str(workers)]
    server = subprocess.Popen(
        [sys.executable, "-m", "charter", *serve],
        cwd=tmp_path,
        env={**os.environ, "CHARTER_CONFIG": str(tmp_path / "charter.toml")},
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert server.stdout is not None
        printed = re.findall(r"http://\S+", server.stdout.readline())
        api, console = printed
        assert console.endswith("/console/") and api.endswith("/api/v1")
        port = int(api.rsplit(":", 1)[1].split("/")[0])
        assert port != 0  # the port the system chose, printed once it serves
        with httpx.Client(timeout=10, follow_redirects=True) as web:
            page = web.get(console)  # no waiting: the line comes once it answers
            assert page.status_code == 200 and page.url.path == "/console/login"
            assert 'name="credential"' in page.text
            stranger = web.get(api)
            assert (stranger.status_code, stranger.json()["error"]["code"]) == (
                401,
                "unauthenticated",
            )
            known = web.get(api, headers={"Authorization": f"Bearer {alice}"})
            assert known.status_code == 200 and known.json()["version"] == "v1"
            assert web.get(api + known.json()["openapi"][len("/api/v1") :]).status_code == 401
            for _ in range(8):  # on fresh connections: dealt to either worker
                with httpx.Client(timeout=10) as once:
                    assert once.get(api + "/me").status_code == 401
        large = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        large.putrequest("POST", "/api/v1/runs/run_x/stop")
        large.putheader("Authorization", f"Bearer {alice}")
        large.putheader("Content-Length", "4097")
        large.endheaders()
        refused = large.getresponse()
        assert (refused.status, json.loads(refused.read())["error"]["limit"]) == (413, 4096)
        large.close()
    finally:
        server.send_signal(signal.SIGINT)
        server.wait(30)
        assert server.stdout is not None
        server.stdout.close()
    with charter.Engine.open(str(tmp_path / "charter.db"), config=config) as engine:
        written = [
            json.loads(e["payload"])
            for e in engine.audit_events("engine")
            if (e["kind"], e["entity"]) == ("auth.refused", "anonymous")
        ]
    assert sum(s["count"] for s in written) == 10


def test_K3_the_inbox_shows_the_runs_that_wait_for_a_person(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken K3: a run that only a person can move on (an uncertain payment, a
    paused allowance) is nowhere on the page people open first."""
    mission = desk.create_mission(default_contract(allowance={"calls": 1}), by=who.alice)
    ex = desk.start_run(mission, by=who.agent, segment_id="s1")
    desk.stop_run(ex.run_id, by=who.alice, reason="enough")
    calm = desk.start_run(mission, by=who.agent, segment_id="s2")
    stuck = desk.start_run(mission, by=who.agent, segment_id="s3")
    recorder = RecordingAdapter()
    stuck.perform(recorder, "read", {}, effect_key="first")
    with pytest.raises(charter.errors.AdmissionRefused):
        stuck.perform(recorder, "read", {}, effect_key="second")
    paused = desk.run(stuck.run_id)
    assert paused.status is charter.RunStatus.PAUSED
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        page = http.get("/console/inbox").text

    assert f'id="stuck-{stuck.run_id}"' in page
    assert str(paused.status_reason) in page
    assert f'id="stuck-{calm.run_id}"' not in page
    assert f'id="stuck-{ex.run_id}"' not in page  # stopped: nothing left to decide


# -- amounts in the contract's units, times relative, reconcile all ----------------------

DOLLARS = default_contract(
    allowance={"usd": 1_000_000, "calls": 100},
    units={"usd": {"scale": 2, "name": "USD"}},
    approvals={"required": ["recorder.write"], "ttl_seconds": 60},
)


def _lost(send: charter.Dispatch) -> charter.Outcome:
    raise TimeoutError("connection reset after the request was sent")


def uncertain(desk: charter.Engine, who: Principals, mission: str, n: int) -> list[str]:
    """``n`` runs of ``pay_plan`` whose payment was sent and its answer lost: each
    an UNKNOWN attempt in the reconciliation queue. Their attempts' IDs."""
    _desk.ADAPTER.script["write"] = _lost
    ids = []
    for k in range(n):
        ex = desk.start_run(
            mission,
            by=who.agent,
            segment_id=f"u{k}",
            plan=_desk.pay_plan,
            input={"to": k, "amount": 1},
        )
        with pytest.raises(charter.Blocked):
            ex.execute()
        ids += [a.id for a in desk.attempts(run_id=ex.run_id)]
    return ids


def posted(http: httpx.Client, path: str, fields: list[tuple[str, str]]) -> httpx.Response:
    """A form posted with repeated fields (``attempt=A&attempt=B``), as a browser does."""
    body = "&".join(f"{quote(k)}={quote(v)}" for k, v in fields)
    kind = {"content-type": "application/x-www-form-urlencoded"}
    return http.post(path, content=body, headers=kind)


def test_console_pages_show_amounts_in_the_contracts_units(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: the inbox, the queue and the ledger showed ``5000 usd`` and
    ``1000000`` where the contract says usd is cents ("50.00 USD"); a unit the
    contract does not describe shows its steps ("1 calls")."""
    mission = desk.create_mission(DOLLARS, by=who.alice)
    ex = desk.start_run(
        mission, by=who.agent, segment_id="s1", plan=_desk.pay_plan, input={"to": "a", "amount": 1}
    )
    with pytest.raises(charter.Blocked):
        ex.execute()  # waits for an approval of its 50.00 USD payment
    [approval] = desk.approvals(pending=True)
    desk.approve(approval.id, by=who.bob)
    _desk.ADAPTER.script["write"] = _lost
    with pytest.raises(charter.Blocked):
        desk.coordinator.resume(ex.run_id, "s1", by=who.agent).execute()
    second = desk.start_run(
        mission, by=who.agent, segment_id="s2", plan=_desk.pay_plan, input={"to": "b", "amount": 2}
    )
    with pytest.raises(charter.Blocked):
        second.execute()
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        inbox = http.get("/console/inbox").text
        queue = http.get("/console/queue").text
        ledger = http.get(f"/console/ledger?mission={mission}").text
    # the second payment's approval: its estimate, and what is left after both holds
    assert "estimate: <strong>1 calls, 50.00 USD</strong>" in inbox, inbox
    assert "allowance left: <strong>98 calls, 9900.00 USD</strong>" in inbox
    assert "5000 usd" not in inbox
    assert "hold 1 calls, 50.00 USD" in queue or "hold 50.00 USD, 1 calls" in queue, queue
    assert 'placeholder="usd in 0.01 USD"' in queue
    cells = re.findall(r'<tr class="balance"><td>usd</td>(.*?)</tr>', ledger)
    assert cells and re.findall(r"<td>(.*?)</td>", cells[0]) == [
        "10000.00 USD",
        "9900.00 USD",
        "100.00 USD",
        "0.00 USD",
        "0.00 USD",
    ]
    assert "<td>calls</td><td>100 calls</td>" in ledger


def test_console_times_show_how_long_ago_beside_the_moment() -> None:
    """A moment reads as itself and as its distance from now, past or future."""
    assert [pages.relative(d) for d in (0, -4, -42, -190, -7200, -3 * 86400, 120)] == [
        "just now",
        "just now",
        "42 s ago",
        "3 min ago",
        "2 h ago",
        "3 d ago",
        "in 2 min",
    ]
    now = int(time.time())
    shown = pages.when((now - 190) * 1_000_000)
    assert shown.endswith(" UTC (3 min ago)") and shown.startswith(
        time.strftime("%Y-", time.gmtime(now))
    )
    assert pages.when(None) == "-"


def test_P1_reconcile_all_lists_what_it_will_do_then_reconciles_each_as_its_own_decision(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken P1 for the bulk action: reconcile all acts without a confirmation, without
    the session's CSRF token, for a principal without the right, or as one unaudited
    act; each attempt is one decision of the signed-in principal, refusals shown."""
    mission = desk.create_mission(default_contract(), by=who.alice)
    ids = uncertain(desk, who, mission, 3)
    applied = charter.Outcome.succeeded({"paid": True}, cost={"usd": 5_000, "calls": 1})
    _desk.ADAPTER.evidence[ids[0]] = charter.Evidence.applied(applied)
    before = stored(desk, mission)
    with browse(base) as http:
        sign_in(http, creds[0]["mallory"])
        listed = http.get("/console/queue/reconcile-all").text
        assert all(f'name="attempt" value="{i}"' in listed for i in ids), listed
        assert not _desk.ADAPTER.reconciled  # listing asks nothing of the target
        fields = [("attempt", i) for i in ids]
        no_token = posted(http, "/console/queue/reconcile-all", fields)
        assert no_token.status_code == 403 and "csrf_refused" in no_token.text
        refused = posted(http, "/console/queue/reconcile-all", [*fields, ("csrf", csrf(listed))])
        assert refused.status_code == 200
        assert refused.text.count("refused (not_authorized") == 3, refused.text
        none = http.post("/console/queue/reconcile-all", data={"csrf": csrf(listed)})
        assert none.status_code == 400 and "usage_error" in none.text
    assert stored(desk, mission) == before and not _desk.ADAPTER.reconciled
    for attempt_id in ids:
        run_id = desk.get_attempt(attempt_id).run_id
        assert any(
            e["kind"] == "authorization.refused" and e["actor"] == "mallory"
            for e in desk.timeline(run_id)
        )
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        listed = http.get("/console/queue/reconcile-all").text
        chosen = [*[("attempt", i) for i in ids[:2]], ("csrf", csrf(listed))]
        done = posted(http, "/console/queue/reconcile-all", chosen)
    assert done.status_code == 200 and "refused" not in done.text
    assert _desk.ADAPTER.reconciled == ids[:2]  # the two confirmed, once each
    assert desk.evidence(ids[0])[-1]["verdict"] == "applied"
    assert desk.evidence(ids[1])[-1]["verdict"] != "applied" and not desk.evidence(ids[2])
    for attempt_id in ids[:2]:
        events = desk.timeline(desk.get_attempt(attempt_id).run_id)
        assert ("alice", "evidence.recorded") in {(e["actor"], e["kind"]) for e in events}


def test_console_takes_a_cost_as_the_contract_writes_it_and_refuses_a_fraction_of_a_step(
    desk: charter.Engine,
    base: str,
    who: Principals,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: the resolve form took only whole smallest steps, so an operator who
    typed what the bank statement says ("49.99") was refused. A point means the
    unit's reading (exactly 4999 cents); more decimals than the unit has are
    refused and change nothing; a number without a point is still steps."""
    mission = desk.create_mission(
        default_contract(
            allowance={"usd": 1_000_000, "calls": 100},
            units={"usd": {"scale": 2, "name": "USD"}},
        ),
        by=who.alice,
    )
    first, second = uncertain(desk, who, mission, 2)
    with browse(base) as http:
        sign_in(http, creds[0]["alice"])
        token = csrf(http.get("/console/queue").text)

        def resolve(attempt: str, usd: str) -> str:
            fields = [
                ("csrf", token),
                ("back", "/console/queue"),
                ("outcome", "succeeded"),
                ("evidence", "the bank statement of 3 Dec"),
                ("cost.usd", usd),
                ("cost.calls", "1"),
            ]
            return posted(http, f"/console/attempts/{attempt}/resolve", fields).text

        resolve(first, "49.99")
        before = stored(desk, mission)
        refused = resolve(second, "49.999")
    settled = desk.get_attempt(first)
    assert (settled.status, settled.actual) == (AttemptStatus.SUCCEEDED, {"usd": 4999, "calls": 1})
    assert "refused (usage_error)" in refused and "at most 2 decimal" in refused
    assert stored(desk, mission) == before
    assert desk.get_attempt(second).status is AttemptStatus.UNKNOWN
