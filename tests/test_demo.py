"""``charter demo``, the main job, in a real process on a fresh embedded store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("optimize", [False, True], ids=["python", "python-O"])
def test_the_demo_mission_completes_sending_each_effect_once(
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
    assert report["status"] == "completed"
    assert report["sends"] == {"llm": 1, "payments": 1, "mail": 1}
    assert [a["status"] for a in report["attempts"]] == ["succeeded"] * 3
    assert report["ledger_problems"] == [] and report["audit_ok"] is True
    assert all(b["held"] == 0 for b in report["balances"].values())
    # The payments API key went to the target only (S3).
    files = [p for p in tmp_path.iterdir() if p.name.startswith("demo.db")]
    assert files and not any(b"sk_demo_" in p.read_bytes() for p in files)
    assert "sk_demo_" not in done.stdout


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
