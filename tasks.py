"""The project's task runner: the same commands on a laptop and in CI.

    python3 tasks.py demo    # set up .venv if needed, run the example mission
    python3 tasks.py test    # set up .venv with test tools, lint, type-check, test
    python3 tasks.py test --quick   # the inner loop: both stores; no faults, browser or CrewAI
    python3 tasks.py faults [--long]   # the fault-injection tests alone; --long: more of them
    python3 tasks.py simulate [--long] [--seed N] [--seeds N] [--steps N] [--backend NAME]
    python3 tasks.py screenshots   # the console's screenshots in docs/ (headless Chromium)
    python3 tasks.py drift   # the integrations' tests on each framework's newest release
    python3 tasks.py venv    # .venv as ``test`` makes it, and nothing else (CI makes it first)

The test environment installs the versions ``constraints.txt`` pins, so a
test run is the same wherever it runs; ``drift``, outside it, installs the
newest releases in a throwaway environment of its own.

Needs only Python 3.11+ (and, for installing, access to a package index). The
tests run on SQLite and on PostgreSQL: ``test`` starts a throwaway PostgreSQL
cluster when ``initdb``/``pg_ctl`` are installed (or uses
``CHARTER_TEST_POSTGRES_URL``). Under ``CI=true`` a missing server is an error.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import subprocess
import sys
import tempfile
import threading
import venv
from collections.abc import Callable, Iterator
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


#: The versions every install into .venv is held to (``pip freeze`` of a passing run).
CONSTRAINTS = ROOT / "constraints.txt"


def ensure_venv(extras: str) -> None:
    """Create .venv and install the package (editable) at the versions
    :data:`CONSTRAINTS` pins, again whenever pyproject.toml or the pins change."""
    if not PY.exists():
        venv.EnvBuilder(with_pip=True).create(VENV)
    stamp = VENV / f".installed-{extras or 'base'}"
    inputs = b"".join(p.read_bytes() for p in (ROOT / "pyproject.toml", CONSTRAINTS))
    want = hashlib.sha256(inputs).hexdigest()
    if stamp.exists() and stamp.read_text() == want:
        return
    target = f".[{extras}]" if extras else "."
    run(PY, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
    run(PY, "-m", "pip", "install", "--quiet", "-c", CONSTRAINTS, "-e", target)
    stamp.write_text(want)


def demo() -> None:
    ensure_venv("http")
    run(BIN / "charter", "demo")


def test() -> None:
    """Lint, type-check and the whole suite; ``--quick`` leaves out the tests
    that inject faults (:data:`FAULTS`) and drive a browser (:data:`SLOW`),
    and CrewAI's (in an environment of their own), for the inner loop of a
    change to one rule: both stores still run. The
    tests run over :func:`workers` processes (pytest-xdist) unless the
    arguments say otherwise (``-n 0``: one process, in file order)."""
    ensure_venv("test")
    args = sys.argv[2:]
    whole = not args
    # CrewAI's environment is made while the main suite runs (an install is mostly
    # waiting on the network and the disk), and its tests run after it: run beside
    # it, on two cores the suite already keeps busy, both took longer.
    crewai = Background(crewai_env) if whole else None
    run(BIN / "ruff", "check", "src", "tests", "bench", "tasks.py")
    run(BIN / "ruff", "format", "--check", "src", "tests", "bench", "tasks.py")
    run(BIN / "mypy")
    if "--quick" in args:
        args.remove("--quick")
        skip = [*FAULTS, *SLOW]
        args = [*(f"--deselect={t}" if "::" in t else f"--ignore={t}" for t in skip), *args]
    with postgres():  # one server for both suites
        pytest(parallel([*args, f"--ignore-glob={CREWAI_TESTS}"]))
        if crewai is not None:
            crewai.join()
            crewai_suite()


def environment() -> None:
    """.venv with the test tools, as ``test`` makes it, and nothing else: CI
    makes it first, to start the SDKs' tests (which run ``charter serve`` from
    it) beside the suite."""
    ensure_venv("test")


class Background:
    """``task`` in a thread; :meth:`join` waits for it and fails as it failed."""

    def __init__(self, task: Callable[[], None]) -> None:
        self._failed: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(task,), daemon=True)
        self._thread.start()

    def _run(self, task: Callable[[], None]) -> None:
        try:
            task()
        except BaseException as exc:  # SystemExit from run() included: said at join
            self._failed = exc

    def join(self) -> None:
        self._thread.join()
        if self._failed is not None:
            raise self._failed


#: CrewAI's tests, which the main environment cannot run: CrewAI pins openai<3,
#: mcp<2 and pydantic<2.13 (pyproject.toml's crewai extra).
CREWAI_TESTS = "tests/test_crewai*.py"
CREWAI_VENV = ROOT / ".venv-crewai"


CREWAI_PY = CREWAI_VENV / PY.relative_to(VENV)


#: What .venv-crewai holds besides Charter and CrewAI: its test tools.
CREWAI_TOOLS = ["pytest", "pytest-timeout", "pytest-xdist"]


def crewai_env() -> None:
    """CrewAI's environment of its own, .venv-crewai, at the versions
    ``constraints-crewai.txt`` pins (made again when they, pyproject.toml or
    :data:`CREWAI_TOOLS` change)."""
    python = CREWAI_PY
    if not python.exists():
        venv.EnvBuilder(with_pip=True).create(CREWAI_VENV)
    pins = ROOT / "constraints-crewai.txt"
    stamp = CREWAI_VENV / ".installed"
    inputs = (ROOT / "pyproject.toml").read_bytes() + pins.read_bytes()
    want = hashlib.sha256(inputs + " ".join(CREWAI_TOOLS).encode()).hexdigest()
    if not stamp.exists() or stamp.read_text() != want:
        run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        run(python, "-m", "pip", "install", "--quiet", "-c", pins, "-e",
            ".[crewai,postgres,http]", *CREWAI_TOOLS)  # fmt: skip
        stamp.write_text(want)


def crewai_suite() -> None:
    """CrewAI's tests in .venv-crewai, on both stores, over processes."""
    tests = sorted(str(p.relative_to(ROOT)) for p in ROOT.glob(CREWAI_TESTS))
    pytest(parallel(tests), python=CREWAI_PY)


#: The tests that inject faults: every commit interrupted, store faults, real
#: kills and pauses, random histories checked after every step, secret canaries;
#: and the other tests that take a minute or more on two cores (a table of kills).
FAULTS = [
    "tests/test_sweep.py",
    "tests/test_fleet.py",
    "tests/test_chaos.py",
    "tests/test_canaries.py",
    "tests/test_crash.py",
    "tests/test_liveness.py",
    "tests/test_send_path.py",
    "tests/test_ledger.py::test_L0_L1_L2_hold_after_every_step_of_random_histories",
    "tests/test_simulation.py",
    "tests/test_attempt_model.py",
    "tests/test_langgraph_kills.py",
]


#: Left out of ``test --quick`` besides the fault tests: a real headless browser.
SLOW = ["tests/test_browser.py"]


def workers() -> int:
    """How many pytest-xdist workers the suite runs over: two per core the
    machine lets this process use, at least two. Most of a test's time is spent
    waiting on what it drives (the child processes it kills and pauses, servers
    on loopback, PostgreSQL), so more workers than cores keep the cores busy;
    ``CHARTER_TEST_WORKERS`` sets another number."""
    given = os.environ.get("CHARTER_TEST_WORKERS")
    if given:
        return int(given)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return max(2, 2 * (cores or 1))


def parallel(args: list[str]) -> list[str]:
    """``args`` run over :func:`workers` processes, the longest tests first
    (``tests/conftest.py``); as given when they already choose (``-n``, ``-p no:xdist``)."""
    chosen = {"-n", "--numprocesses", "no:xdist", "-pno:xdist", "--dist"}
    if any(a in chosen or a.startswith(("-n", "--numprocesses=", "--dist=")) for a in args):
        return args
    # One test at a time to each worker as it frees up: pytest-xdist otherwise
    # hands each worker a run of consecutive tests to begin with, and the first
    # run would be every long one.
    return ["-n", str(workers()), "--dist", "load", "--maxschedchunk", "1", *args]


def faults() -> None:
    """The fault-injection tests; ``--long`` runs each family longer (more
    histories, more examples) for a manual run (docs/reliability.md)."""
    ensure_venv("test")
    args = sys.argv[2:]
    env = {"CHARTER_FAULTS": "long"} if "--long" in args else {}
    pytest(parallel([*FAULTS, *(a for a in args if a != "--long")]), env)


def simulate() -> None:
    """The deterministic simulator (docs/reliability.md): the fast profile, or
    ``--long``, or ``--seeds N`` from ``--first N``, or one ``--seed N`` to replay,
    ``--steps N`` each; ``--backend sqlite|postgresql`` for one store only."""
    ensure_venv("test")
    args, env, select = sys.argv[2:], {}, []
    names = {
        "--seed": "CHARTER_SIM_SEED",
        "--seeds": "CHARTER_SIM_SEEDS",
        "--first": "CHARTER_SIM_FIRST",
        "--steps": "CHARTER_SIM_STEPS",
    }
    while args:
        arg = args.pop(0)
        if arg == "--long":
            env["CHARTER_FAULTS"] = "long"
        elif arg in names and args:
            env[names[arg]] = str(int(args.pop(0)))
        elif arg == "--backend" and args:
            select = ["-k", args.pop(0)]
        else:
            raise SystemExit(f"simulate: unexpected argument {arg!r} (see tasks.py's docstring)")
    target = (
        "tests/test_simulation.py::test_A2_A4_F2_F3_L0_R7_R8_S1_hold_in_every_simulated_history"
    )
    pytest([target, "-s", "-q", *select], env)


#: The frameworks Charter integrates, installed at their newest release by ``drift``.
FRAMEWORKS = ["pydantic-ai-slim[openai]", "openai-agents", "mcp", "opentelemetry-api"]

#: The tests of the integrations with them, and of their examples.
INTEGRATIONS = [
    "tests/test_pydantic_ai.py",
    "tests/test_example_pydantic_ai.py",
    "tests/test_openai_agents.py",
    "tests/test_example_agent.py",
    "tests/test_mcp.py",
    "tests/test_example_mcp.py",
    "tests/test_example_imports.py",
    "tests/test_otel.py",
]


def drift() -> None:
    """The integrations' tests against the newest release of each framework
    (:data:`FRAMEWORKS`), in a throwaway environment without the pins, as a
    fresh ``pip install 'charter[...]'`` would get them today: a release that
    changes what an integration records or breaks it fails here the day it
    appears, while ``test`` stays on :data:`CONSTRAINTS`."""
    with tempfile.TemporaryDirectory(prefix="charter-drift-") as tmp:
        env = Path(tmp) / "venv"
        venv.EnvBuilder(with_pip=True).create(env)
        python = env / PY.relative_to(VENV)
        run(python, "-m", "pip", "install", "--quiet", "--upgrade", "pip")
        run(python, "-m", "pip", "install", "--quiet", "-e", ".[test]")
        run(python, "-m", "pip", "install", "--quiet", "--upgrade", *FRAMEWORKS)
        frozen = subprocess.check_output([python, "-m", "pip", "freeze"], cwd=ROOT, text=True)
        names = {f.split("[")[0] for f in FRAMEWORKS}
        newest = [line for line in frozen.splitlines() if line.split("==")[0] in names]
        print("newest releases:", *newest, flush=True)
        pytest([*INTEGRATIONS, *sys.argv[2:]], python=python)


def screenshots() -> None:
    """The console's screenshots that docs/console.md shows (the inbox, the queue,
    a run's page, and any other page a browser test shoots), taken again by the
    browser tests on SQLite and written to docs/."""
    ensure_venv("test")
    env = {**os.environ, "CHARTER_DOCS_SCREENSHOTS": "1"}
    env.pop("CHARTER_TEST_POSTGRES_URL", None)  # one store: each picture once
    run(PY, "-m", "pytest", "tests/test_browser.py", "-q", "-p", "no:cacheprovider", env=env)


@contextlib.contextmanager
def postgres() -> Iterator[None]:
    """A PostgreSQL server for the tests run inside: the one
    ``CHARTER_TEST_POSTGRES_URL`` names, or a throwaway cluster started here and
    named in that variable meanwhile, so that the suites of one command share
    it (each works in databases of its own, ``tests/conftest.py``)."""
    if os.environ.get("CHARTER_TEST_POSTGRES_URL"):
        yield
        return
    sys.path.insert(0, str(ROOT))
    # stdlib only; importable once the checkout is on sys.path (one cluster starter).
    from bench.pg import server  # noqa: PLC0415

    with server(env_var=None) as srv:
        if srv is None:
            if os.environ.get("CI") == "true":
                raise SystemExit("CI needs PostgreSQL 15 (initdb and pg_ctl) for its tests")
            print("PostgreSQL not found: the tests run on SQLite only", flush=True)
            yield
            return
        print(f"PostgreSQL: throwaway cluster at {srv.base_url}", flush=True)
        os.environ["CHARTER_TEST_POSTGRES_URL"] = srv.url("postgres")
        try:
            yield
        finally:
            del os.environ["CHARTER_TEST_POSTGRES_URL"]


def pytest(args: list[str], extra: dict[str, str] | None = None, *, python: Path = PY) -> None:
    """pytest (of ``python``'s environment) on SQLite and on PostgreSQL (:func:`postgres`)."""
    with postgres():
        run(python, "-m", "pytest", *args, env={**os.environ, **(extra or {})})


if __name__ == "__main__":
    if sys.version_info < (3, 11):  # noqa: UP036 - this file must run on any python3
        raise SystemExit("Charter needs Python 3.11 or newer")
    tasks = {
        "demo": demo,
        "test": test,
        "faults": faults,
        "simulate": simulate,
        "screenshots": screenshots,
        "drift": drift,
        "venv": environment,
    }
    if len(sys.argv) < 2 or sys.argv[1] not in tasks:
        raise SystemExit(f"usage: python3 tasks.py {{{'|'.join(tasks)}}} [pytest args]")
    tasks[sys.argv[1]]()
