"""The project's task runner: the same commands on a laptop and in CI.

    python3 tasks.py demo    # set up .venv if needed, run the example mission
    python3 tasks.py test    # set up .venv with test tools, lint, type-check, test
    python3 tasks.py faults [--long]   # the fault-injection tests alone; --long: more of them

Needs only Python 3.11+ (and, for installing, access to a package index). The
tests run on SQLite and on PostgreSQL: ``test`` starts a throwaway PostgreSQL
cluster when ``initdb``/``pg_ctl`` are installed (or uses
``CHARTER_TEST_POSTGRES_URL``). Under ``CI=true`` a missing server is an error.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent
VENV = ROOT / ".venv"
BIN = VENV / ("Scripts" if sys.platform == "win32" else "bin")
PY = BIN / "python"


def run(*cmd: str | Path, env: dict[str, str] | None = None) -> None:
    print("+", " ".join(str(c) for c in cmd), flush=True)
    code = subprocess.call([str(c) for c in cmd], cwd=ROOT, env=env)
    if code:
        raise SystemExit(code)


def ensure_venv(extras: str) -> None:
    """Create .venv and install the package (editable) once per pyproject change."""
    if not PY.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".installed-{extras or 'base'}"
    want = hashlib.sha256((ROOT / "pyproject.toml").read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return
    target = f".[{extras}]" if extras else "."
    run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    run(PY, "-m", "pip", "install", "--quiet", "-e", target)
    stamp.write_text(want)


def demo() -> None:
    ensure_venv("http")
    run(BIN / "charter", "demo")


def test() -> None:
    ensure_venv("test")
    run(BIN / "ruff", "check", "src", "tests", "bench", "tasks.py")
    run(BIN / "ruff", "format", "--check", "src", "tests", "bench", "tasks.py")
    run(BIN / "mypy")
    pytest(sys.argv[2:])


#: The tests that inject faults: every commit interrupted, store faults, real
#: kills and pauses, random histories checked after every step, secret canaries.
FAULTS = [
    "tests/test_sweep.py",
    "tests/test_chaos.py",
    "tests/test_canaries.py",
    "tests/test_crash.py",
    "tests/test_liveness.py",
    "tests/test_send_path.py",
    "tests/test_ledger.py::test_L0_L1_L2_hold_after_every_step_of_random_histories",
]


def faults() -> None:
    """The fault-injection tests; ``--long`` runs each family longer (more
    histories, more examples) for a manual run (docs/reliability.md)."""
    ensure_venv("test")
    args = sys.argv[2:]
    env = {"CHARTER_FAULTS": "long"} if "--long" in args else {}
    pytest([*FAULTS, *(a for a in args if a != "--long")], env)


def pytest(args: list[str], extra: dict[str, str] | None = None) -> None:
    """pytest on SQLite and on a PostgreSQL server (one started here if needed)."""
    base = {**os.environ, **(extra or {})}
    if base.get("CHARTER_TEST_POSTGRES_URL"):
        run(PY, "-m", "pytest", *args, env=base)
        return
    sys.path.insert(0, str(ROOT))
    # stdlib only; importable once the checkout is on sys.path (one cluster starter).
    from bench.pg import server  # noqa: PLC0415

    with server(env_var=None) as srv:
        if srv is None:
            if os.environ.get("CI") == "true":
                raise SystemExit("CI needs PostgreSQL 15 (initdb and pg_ctl) for its tests")
            print("PostgreSQL not found: the tests run on SQLite only", flush=True)
            run(PY, "-m", "pytest", *args, env=base)
            return
        print(f"PostgreSQL: throwaway cluster at {srv.base_url}", flush=True)
        run(
            PY,
            "-m",
            "pytest",
            *args,
            env={**base, "CHARTER_TEST_POSTGRES_URL": srv.url("postgres")},
        )


if __name__ == "__main__":
    if sys.version_info < (3, 11):  # noqa: UP036 - this file must run on any python3
        raise SystemExit("Charter needs Python 3.11 or newer")
    tasks = {"demo": demo, "test": test, "faults": faults}
    if len(sys.argv) < 2 or sys.argv[1] not in tasks:
        raise SystemExit(f"usage: python3 tasks.py {{{'|'.join(tasks)}}} [pytest args]")
    tasks[sys.argv[1]]()
