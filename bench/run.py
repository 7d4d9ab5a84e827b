"""Charter's benchmark, side by side with DBOS, LangGraph and the raw floor.

    python3 bench/run.py              # the full run: table, JSON, docs/performance.md
    python3 bench/run.py --quick      # a smoke run: smaller, writes no docs
    python3 bench/run.py --profile    # also print a cProfile of the attempt loop

Needs only Python 3.11+ and a package index. When the running interpreter
lacks Charter or a peer, the command creates ``.venv-bench/`` (or uses
``--venv``), installs Charter with its ``bench`` extra (the peers) into it,
and runs itself again there. Every measurement runs in a fresh process.

It prints one table of ratios against their targets, writes every figure to
``bench/results/latest.json`` and regenerates ``docs/performance.md``.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import sys
import venv
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
DOC = ROOT / "docs" / "performance.md"

#: The peers, as the ``bench`` extra of pyproject.toml lists them, and the server
#: (its desk and remote-protocol rows serve an engine over HTTP), and the MCP SDK
#: (the gateway's row).
PEERS = [
    "dbos>=3.4",
    "langgraph>=1.2",
    "langgraph-checkpoint-sqlite>=3.1",
    "langgraph-checkpoint-postgres>=3.2",
    "psycopg[binary]>=3.2",
    "starlette>=0.40",
    "uvicorn>=0.30",
    "jinja2>=3.1",
    "mcp>=2",
]
MODULES = (
    "charter",
    "starlette",
    "uvicorn",
    "jinja2",
    "dbos",
    "langgraph",
    "langgraph.checkpoint.sqlite",
    "langgraph.checkpoint.postgres",
    "psycopg",
    "mcp",
)


def _has_everything() -> bool:
    try:
        return all(importlib.util.find_spec(m) is not None for m in MODULES)
    except ModuleNotFoundError:
        return False


def _bench_extra_declared() -> bool:
    import tomllib

    data = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return "bench" in data.get("project", {}).get("optional-dependencies", {})


def _bootstrap(venv_dir: Path) -> None:
    """Create the bench virtualenv if needed, install what is missing, re-run in it."""
    bindir = venv_dir / ("Scripts" if sys.platform == "win32" else "bin")
    python = bindir / "python"
    if os.environ.get("CHARTER_BENCH_BOOTSTRAPPED"):
        raise SystemExit(f"{python} still lacks one of {MODULES} after installing them")
    if not python.exists():
        print(f"+ creating {venv_dir}", flush=True)
        venv.EnvBuilder(with_pip=True).create(venv_dir)
    probe = "import importlib.util as u, sys; sys.exit(any(u.find_spec(m) is None for m in %r))"
    ready = subprocess.run([python, "-c", probe % (MODULES,)], check=False).returncode == 0
    if not ready:
        pip = [str(python), "-m", "pip", "install", "--quiet"]
        if _bench_extra_declared():
            cmd = [*pip, "-e", f"{ROOT}[bench]"]
        else:
            cmd = [*pip, "-e", str(ROOT), *PEERS]
        print("+", " ".join(cmd), flush=True)
        subprocess.run(cmd, check=True)
    env = {**os.environ, "CHARTER_BENCH_BOOTSTRAPPED": "1"}
    os.execve(str(python), [str(python), str(Path(__file__).resolve()), *sys.argv[1:]], env)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="bench/run.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--quick", action="store_true", help="a small smoke run; docs are not written")
    p.add_argument("--profile", action="store_true", help="print a cProfile of the attempt loop")
    p.add_argument("--no-postgres", action="store_true", help="skip the PostgreSQL rows")
    p.add_argument("--venv", type=Path, default=ROOT / ".venv-bench", help="virtualenv to use")
    p.add_argument("--workdir", type=Path, help="where the stores go (default: a temp dir)")
    p.add_argument("--json", type=Path, default=RESULTS / "latest.json", help="results file")
    p.add_argument("--doc", type=Path, default=DOC, help="the generated page")
    return p


def main(argv: list[str]) -> int:
    args = _parser().parse_args(argv)
    if not _has_everything():
        _bootstrap(args.venv)
    sys.path.insert(0, str(BENCH))
    import orchestrate

    return orchestrate.run(args)


if __name__ == "__main__":
    if sys.version_info < (3, 11):  # noqa: UP036 - this file must start on any python3
        raise SystemExit("the bench needs Python 3.11 or newer")
    sys.exit(main(sys.argv[1:]))
