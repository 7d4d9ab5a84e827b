"""A store made by an earlier release of Charter, for the upgrade tests.

The release is the project's own history: its ``src`` at a pinned commit,
taken with ``git archive`` into a folder once per test process, and run in a
process of its own with that folder first on ``sys.path``. So the store is
written by the code that shipped, not by today's code imitating it.

``python _release.py URL OUT SPEC`` (run by :func:`build`, under the release's
code) opens the store at ``URL``, records two missions, and writes to ``OUT``
what it saw: each mission's balances, its chain's verification and length, the
run and attempt the upgraded store must recover, and a signed snapshot of the
first mission. The second keeps an escrow slice lent when the process ends, as
a worker killed holding it would leave it (L10).
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent

#: The last commit at schema 22 (allowances and escrow accounts as rows of their
#: own): the release before the books moved onto the heads' rows.
SCHEMA_22 = "1f7164c14c8f0de496904128e1c28e30e9ecb7e7"


def source(commit: str, into: Path) -> Path:
    """The release's ``src`` folder under ``into`` (taken from git once)."""
    src = into / commit / "src"
    if not src.is_dir():
        staging = Path(tempfile.mkdtemp(dir=into))
        archive = subprocess.run(
            ["git", "-C", str(ROOT), "archive", "--format=tar", commit, "src"],
            check=True,
            capture_output=True,
        ).stdout
        with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
            tar.extractall(staging, filter="data")
        with contextlib.suppress(OSError):  # another process took it first: the same files
            staging.rename(into / commit)
    return src


def build(commit: str, into: Path, url: str, spec: dict[str, Any]) -> dict[str, Any]:
    """Run this file under the release ``commit`` against the store at ``url``;
    returns what it saw (and the snapshot's bytes under ``"snapshot"``)."""
    out = Path(tempfile.mkdtemp(dir=into))
    env = {**os.environ, "PYTHONPATH": str(source(commit, into))}
    done = subprocess.run(
        [sys.executable, __file__, url, str(out), json.dumps(spec)],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    facts: dict[str, Any] = json.loads((out / "facts.json").read_text())
    facts["snapshot"] = (out / "snapshot.tgz").read_bytes()
    return facts


def _record(url: str, out: Path, spec: dict[str, Any]) -> None:
    import charter
    from charter.testing import RecordingAdapter
    from charter.workers.escrow import Escrow

    assert Path(charter.__file__).is_relative_to(Path(os.environ["PYTHONPATH"]))
    config = charter.EngineConfig(credentials=spec["digests"], signing_key=spec["signing_key"])
    engine = charter.Engine.open(url, config=config)
    alice = engine.authenticate(spec["creds"]["alice"])
    agent = engine.authenticate(spec["creds"]["agent"])
    adapter = RecordingAdapter()

    def lost(send: charter.Dispatch) -> charter.Outcome:
        raise charter.OutcomeUnknown("cut off", evidence={"seen": send.attempt_id})

    adapter.script["write"] = lost
    first = engine.create_mission(spec["contract"], by=alice)
    ex = engine.start_run(first, by=agent, segment_id="s1")
    ex.perform(adapter, "read", {"n": 1}, effect_key="paid")
    unknown = ex.perform(adapter, "write", {"n": 2}, effect_key="lost")
    engine.raise_limit(first, "calls", 150, by=alice)
    second = engine.create_mission(spec["contract"], by=alice)
    facts = {
        "first": first,
        "second": second,
        "run": ex.run_id,
        "unknown": unknown.id,
        "snapshot_balances": {u: vars(b) for u, b in engine.balances(first).items()},
    }
    (out / "snapshot.tgz").write_bytes(engine.export_snapshot(first))
    escrow = Escrow(engine, {"usd": 50_000, "calls": 50}, holder="w1")
    escrow.__enter__()
    ex2 = engine.start_run(second, by=agent, segment_id="s2")
    escrow.perform(ex2, adapter, "read", {"n": 3}, effect_key="lent")
    facts["balances"] = {
        m: {u: vars(b) for u, b in engine.balances(m).items()} for m in (first, second)
    }
    facts["verified"] = {v.mission_id: [v.ok, v.events] for v in engine.verify_audit()}
    facts["ledger"] = {m: engine.check_ledger(m) for m in (first, second)}
    (out / "facts.json").write_text(json.dumps(facts))
    os._exit(0)  # the slice's holder ends without returning it


if __name__ == "__main__":
    _record(sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3]))
