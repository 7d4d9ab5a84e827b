"""The child of ``test_sweep.py``: the agent's executor, stopped at one commit.

Run as ``python _sweep_child.py CONFIG.json``, or forked by ``python
_sweep_child.py --serve`` (:func:`serve`) for each config path it reads. It owns a new run of the
mission and pays the invoices through the sandbox (the workload named in the
config, see ``_sweep_workloads.py``), with an
:class:`charter.testing.AtCommit` hook armed at commit ``k`` (``k = 0`` only
counts). It prints ``{"run_id"}`` once the run exists and, if it lives to the
end, ``{"end", "commits"}``: how far it got and how many commits it made.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import charter
from _sweep_workloads import WORKLOADS
from charter.testing import AtCommit


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    hook = AtCommit(cfg["k"], cfg["when"], cfg["what"])
    lease = cfg.get("lease_seconds", 30.0)
    config = charter.EngineConfig(
        credentials=cfg["digests"],
        lease_seconds=lease,
        send_deadline_seconds=lease / 2,
        artifacts=cfg["artifacts"],
        workspace=cfg["workspace"],
    )
    engine = charter.Engine.open(cfg["store"], config=config, crash_hook=hook)
    end = "completed"
    try:
        agent = engine.authenticate(cfg["credential"])
        make_adapter, make_plan = WORKLOADS[cfg.get("workload", "payments")]
        with make_adapter(cfg["url"]) as payments:
            plan = make_plan(payments)
            ex = engine.start_run(
                cfg["mission"], by=agent, segment_id="seg-1", plan=plan, input=cfg["invoices"]
            )
            print(json.dumps({"run_id": ex.run_id}), flush=True)
            ex.execute(plan)
    except charter.Blocked as blocked:
        end = f"blocked: {blocked.reason}"
    except charter.CharterError as exc:  # an injected store fault reached the worker
        end = f"{type(exc).__name__}: {exc.message}"
    except charter.Fenced as exc:  # paused, and taken over meanwhile (F2)
        end = f"fenced: {exc}"
    finally:
        engine.close()
    print(json.dumps({"end": end, "commits": hook.seen}), flush=True)
    return 0


def serve() -> int:
    """Fork a child for each config path read from stdin, its stdout and stderr
    in ``<config>.out`` and ``<config>.err``; write ``{"pid"}`` when it is
    forked and ``{"code"}`` when it has ended (``-N``: killed by signal N), as
    ``subprocess`` tells them. The imports are paid for once per server, not
    once per child; each child is a process of its own, killed for real. The
    server holds no thread, connection or file a child could inherit half-used."""
    for line in sys.stdin:
        config = line.strip()
        pid = os.fork()
        if pid == 0:
            _child(config)
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"code": code}), flush=True)
    return 0


def _child(config: str) -> None:
    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    code = 1
    try:
        with Path(f"{config}.out").open("w") as out, Path(f"{config}.err").open("w") as err:
            os.dup2(out.fileno(), 1)
            os.dup2(err.fileno(), 2)
            sys.stdin.close()
            try:
                code = main([config])
            except BaseException:
                import traceback

                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main(sys.argv[1:]))
