"""The console's sessions and forms (P1): sign-in with a credential gives a fresh,
server-issued session (HttpOnly, SameSite=Strict, Secure off loopback); every
form needs the session's CSRF token; a refused form changes nothing.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

import _desk
import charter
from conftest import Principals, default_contract, stored


@pytest.fixture
def desk(make_engine: Callable[..., charter.Engine]) -> charter.Engine:
    _desk.reset()
    return make_engine(**_desk.CONFIG)


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


def test_P1_bad_credential_signs_nobody_in_and_is_audited(desk: charter.Engine, base: str) -> None:
    """Broken P1: a wrong credential opens a session, or its refusal is not audited."""
    with browse(base) as http:
        answer = sign_in(http, "alice:" + "y" * 43)
        assert answer.status_code == 401 and "unauthenticated" in answer.text
        assert "charter_session" not in http.cookies
    assert [e["actor"] for e in desk.audit_events("engine") if e["kind"] == "auth.refused"] == [
        "alice"
    ]


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
