"""``charter demo``, the main job, in a real process on a fresh embedded store."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def test_the_demo_mission_completes_sending_each_effect_once(tmp_path: Path) -> None:
    store = tmp_path / "demo.db"
    done = subprocess.run(
        [sys.executable, "-m", "charter", "demo", "--json", "--store", str(store)],
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
