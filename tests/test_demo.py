"""``charter demo``, the main job, in a real process on a fresh embedded store."""

from __future__ import annotations

import json
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest


@pytest.mark.parametrize("optimize", [False, True], ids=["python", "python-O"])
def test_the_demo_recovers_a_killed_worker_and_pays_each_invoice_once(
    tmp_path: Path, optimize: bool
) -> None:
    """Also under ``python -O``, which removes ``assert``: no rule may live in one."""
    store = tmp_path / "demo.db"
    flags = ["-O"] if optimize else []
    done = subprocess.run(
        [sys.executable, *flags, "-m", "charter", "demo", "--json", "--store", str(store)],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    story = {s["step"]: s for s in report["story"]}
    assert [s["step"] for s in report["story"]] == [
        "mission",
        "worker",
        "crash",
        "recover",
        "ledger_before",
        "reconcile",
        "confirm",
        "ledger_after",
        "blocked",
        "approve",
        "resume",
        "finished",
    ]
    # The worker really died by SIGKILL, mid-payment: the sandbox applied it.
    assert story["crash"]["returncode"] == -signal.SIGKILL
    # R1-R4: taken over at once; the payment in flight is UNKNOWN with its hold.
    assert story["recover"]["epoch"] == 2
    [uncertain] = story["recover"]["unresolved"]
    assert (uncertain["status"], uncertain["estimate"]) == ("unknown", {"usd": 27_30})
    assert story["ledger_before"]["held"] == 27_30
    # R7: the lookup found it with its amount; a person confirmed; the hold became spend.
    assert story["reconcile"]["verdict"] == "applied"
    assert story["reconcile"]["found"]["amount"] == 27_30
    assert story["confirm"]["status"] == "succeeded"
    assert story["ledger_after"]["held"] == 0
    assert story["approve"]["by"] == "maria"
    assert report["status"] == "completed" and report["ok"] is True
    assert [a["status"] for a in report["attempts"]] == ["succeeded"] * 4
    assert report["ledger_problems"] == [] and report["audit_ok"] is True
    # The sandbox's own records, read from its file: each invoice paid once,
    # one request per key, and the ledger spent what the sandbox took.
    with closing(sqlite3.connect(report["sandbox"]["data"])) as db:
        paid = db.execute("SELECT reference, amount, idempotency_key FROM payments").fetchall()
        creates = db.execute(
            "SELECT idempotency_key FROM requests WHERE kind = 'create'"
        ).fetchall()
    assert sorted(r[0] for r in paid) == ["inv-101", "inv-102", "inv-103", "inv-104"]
    assert len({r[2] for r in paid}) == 4
    assert len(creates) == len({c[0] for c in creates}) == 4
    spent = sum(a["actual"]["usd"] for a in report["attempts"])
    assert spent == sum(r[1] for r in paid) == 4_50 + 12_00 + 27_30 + 8_75
    assert story["finished"]["ledger_agrees"] is True and story["finished"]["repeated"] == 0
    # Amounts read as people read them; raw integers only in the JSON.
    assert "27.30 USD" in story["recover"]["text"]


def test_the_demo_tells_its_story_in_plain_text(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "charter", "demo", "--store", str(tmp_path / "demo.db")],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "\033[" not in done.stdout  # no colour when not on a terminal
    assert "killed (SIGKILL) while paying inv-103" in done.stdout
    assert "hold 27.30 USD kept" in done.stdout
    assert "paid twice: none" in done.stdout


#: Where sending and settling are decided: none may rely on ``assert``.
DECIDING = (
    "engine/executor",
    "attempts/dispatch",
    "attempts/evidence",
    "runs/ownership",
    "attempts/calls",
    "attempts/settlement",
    "engine/coordinator",
    "waits/approvals",
    "attempts/admission",
    "plans/nodes",
)


def test_A4_no_rule_on_the_attempt_path_is_an_assert() -> None:
    """Confirmed: settlement code relied on ``assert``, which ``python -O`` removes."""
    import ast

    import charter

    root = Path(charter.__file__).parent
    found = [
        f"{name}.py:{node.lineno}"
        for name in DECIDING
        for node in ast.walk(ast.parse((root / f"{name}.py").read_text()))
        if isinstance(node, ast.Assert)
    ]
    assert found == []
