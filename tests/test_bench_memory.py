"""The bench's peak-memory figures are each measured process's own peak.

On Linux a child's ``ru_maxrss`` (``wait4``, ``RUSAGE_CHILDREN``) takes in the
peak of the process that launched it, and ``RUSAGE_CHILDREN`` every earlier
child's too, so the page once showed ``import charter`` at 22.5 MB where
``/usr/bin/time -v`` shows 13.8. These tests hold the bench's measurement to
an outside one, and show that one process's peak does not leak into the next
figure. No timing is asserted.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"
sys.path.insert(0, str(BENCH))

import auditverify  # noqa: E402
import charter_bench  # noqa: E402
import peakrss  # noqa: E402

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="peak RSS as Linux accounts for it"
)
TIME = shutil.which("time", path="/usr/bin")
#: How far the bench may read above an outside measure of the same command:
#: the wrapper's few lines, and the drift of one run to the next.
TOLERANCE = 1.5e6
MB = 1e6


@pytest.fixture(autouse=True)
def _bytecode_cache_in_tmp(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The bench turns the bytecode cache on; here it is written under tmp_path."""
    monkeypatch.setenv("PYTHONPYCACHEPREFIX", str(tmp_path / "pycache"))


@pytest.fixture
def ballast() -> Iterator[bytearray]:
    """80 MB touched in the launching process: a peak that must not reach a child's figure."""
    block = bytearray(80_000_000)
    for i in range(0, len(block), 4096):
        block[i] = 1
    yield block


def time_v_peak(args: list[str], env: dict[str, str], cwd: Path | None = None) -> float:
    """Bytes of ``/usr/bin/time -v``'s maximum resident set size for ``python *args``."""
    assert TIME is not None
    proc = subprocess.run(
        [TIME, "-v", sys.executable, *args], capture_output=True, text=True, env=env, cwd=cwd
    )
    assert proc.returncode == 0, proc.stderr
    found = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    assert found, proc.stderr
    return int(found.group(1)) * 1024.0


@pytest.mark.skipif(TIME is None, reason="needs /usr/bin/time")
def test_bench_import_charter_peak_agrees_with_time_v(ballast: bytearray) -> None:
    """The memory row's baseline is ``import charter`` alone, as the kernel counts it
    for that process: within 1.5 MB of ``/usr/bin/time -v`` on the same command."""
    env = peakrss.installed_env()
    charter_bench.import_peak_bytes(env)  # writes the bytecode cache, as the bench's warm-up
    outside = time_v_peak(["-c", "import charter"], env)
    bench = charter_bench.import_peak_bytes(env)
    assert abs(bench - outside) <= TOLERANCE, (bench / MB, outside / MB)
    assert bench < len(ballast) / 2, bench / MB


@pytest.mark.skipif(TIME is None, reason="needs /usr/bin/time")
def test_bench_audit_verify_peak_is_the_commands_own(tmp_path: Path, ballast: bytearray) -> None:
    """The audit row reads ``charter audit verify``'s own peak, not the launching
    worker's: within 1.5 MB of ``/usr/bin/time -v`` on the same command, while the
    launching process holds 80 MB."""
    store = tmp_path / "audit.db"
    engine, _, mission, _ = charter_bench.setup(store)
    engine.close()
    auditverify._verify(store, mission)  # warm-up: the bytecode cache
    args = ["-m", "charter", "audit", "verify", "--store", str(store), "--mission", mission]
    outside = time_v_peak([*args, "--json"], peakrss.installed_env(), cwd=tmp_path)
    _, bench, answer = auditverify._verify(store, mission)
    assert answer[0]["ok"], answer
    assert abs(bench - outside) <= TOLERANCE, (bench / MB, outside / MB)
    assert bench < len(ballast) / 2, bench / MB


def test_bench_peak_is_per_child_not_cumulative(ballast: bytearray) -> None:
    """A child that touches 50 MB reports at least 50 MB; the small child run after
    it, by a launcher that itself holds 80 MB, reports far less."""
    big = "b = bytearray(50_000_000)\nfor i in range(0, len(b), 4096): b[i] = 1\ndel b"
    first = peakrss.run_python(["-c", big])
    second = peakrss.run_python(["-c", "pass"])
    assert first.returncode == second.returncode == 0, (first.stderr, second.stderr)
    assert first.peak_bytes >= 50 * MB, first.peak_bytes / MB
    assert second.peak_bytes < 25 * MB, second.peak_bytes / MB
    assert second.peak_bytes < first.peak_bytes / 2
    assert len(ballast) == 80_000_000


def test_bench_peak_wrapper_runs_the_command_as_python_would(tmp_path: Path) -> None:
    """Under the wrapper a command sees the argv and exit status it would see
    under ``python`` itself, for ``-c``, ``-m`` and a script."""
    script = tmp_path / "script.py"
    script.write_text("import sys\nprint(sys.argv)\nsys.exit(3)\n")
    ran = peakrss.run_python([str(script), "a", "b"], cwd=tmp_path)
    assert (ran.returncode, ran.stdout) == (3, f"{[str(script), 'a', 'b']}\n")
    ran = peakrss.run_python(["-c", "import sys; print(sys.argv); raise SystemExit(4)", "x"])
    assert (ran.returncode, ran.stdout) == (4, "['-c', 'x']\n")
    ran = peakrss.run_python(["-m", "charter", "--help"])
    assert ran.returncode == 0 and ran.stdout.startswith("usage: charter"), ran.stderr
    assert ran.peak_bytes > 10 * MB, ran.peak_bytes / MB
