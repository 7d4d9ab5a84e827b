"""Plans for test_nodes.py, importable by reference from a fresh process.

The target is a file, ``outbox.jsonl``: one line per message it received, with
our idempotency key, so a test counts what was really sent. Nodes also append
a bare line to ``side.txt`` outside any journaled call, to show what repeats
on replay. Both files live in the directory named by ``$CHARTER_TEST_NODE_DIR``.

Run as a child process, killed for real::

    python -c "import sys, _node_plans; sys.exit(_node_plans.main(sys.argv[1:]))" CONFIG.json

The configuration names the store, the credential digests, the agent's
credential and either a mission and a plan reference (start a run) or a run
(resume it as the recovered owner's segment). ``kill_point`` arms a SIGKILL at
a crash point after ``kill_skip`` earlier passes of it; ``die_in`` names nodes
that SIGKILL their own process at a marked line.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
from pathlib import Path
from typing import Any, ClassVar

import charter
from charter.config import import_path
from charter.crashpoints import CrashHook
from charter.testing import kill_at

DIR_ENV = "CHARTER_TEST_NODE_DIR"

#: Nodes that kill their own process at their ``die_here`` line (set in a child only).
_DIE_IN: set[str] = set()


def workdir() -> Path:
    return Path(os.environ[DIR_ENV])


def lines(name: str) -> list[str]:
    path = workdir() / name
    return path.read_text().splitlines() if path.exists() else []


def bare(text: str) -> None:
    """A write no journal knows about: it repeats whenever the line runs."""
    with (workdir() / "side.txt").open("a") as f:
        f.write(text + "\n")
        f.flush()
        os.fsync(f.fileno())


def die_here(node_name: str) -> None:
    if node_name in _DIE_IN:
        os.kill(os.getpid(), signal.SIGKILL)


class Outbox:
    """A target that writes every message it receives to ``outbox.jsonl``."""

    name = "outbox"
    operations: ClassVar[dict[str, charter.Operation]] = {
        "write": charter.Operation(charter.EffectClass.UNSAFE)
    }

    def estimate(self, operation: str, request: Any) -> charter.Estimate:
        return charter.Estimate({"calls": 1}, "outbox/flat")

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        send.check_deadline()
        path = workdir() / "outbox.jsonl"
        with path.open("a") as f:
            f.write(json.dumps({"key": send.idempotency_key, "request": send.request}) + "\n")
            f.flush()
            os.fsync(f.fileno())
        line = len(path.read_text().splitlines())
        return charter.Outcome.succeeded(
            {"line": line}, cost={"calls": 1}, receipt={"line": line}, price_source="outbox/flat"
        )

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        return charter.Evidence.indeterminate({"looked_up": attempt.id})


# -- replay: bare code repeats, journaled calls and values do not ---------------------


@charter.node
def replay(ctx: charter.Context, value: Any) -> dict[str, Any]:
    bare("replay")
    first = ctx.attempt(Outbox(), "write", {"effect": "first"})
    now, rnd, uid = ctx.now(), ctx.random(), ctx.uuid()
    die_here("replay")
    second = ctx.attempt(Outbox(), "write", {"effect": "second"})
    return {
        "first": first,
        "second": second,
        "now": now.isoformat(),
        "random": rnd,
        "uuid": uid,
    }


@charter.node
async def finish(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
    await asyncio.sleep(0)
    third = await ctx.aattempt(Outbox(), "write", {"effect": "third"})
    return {**value, "third": third}


replay_plan = charter.Plan("replay", (replay, finish), ref="_node_plans:replay_plan")


# -- drift: a request built from something the journal does not hold -------------------


@charter.node
def drift(ctx: charter.Context, value: Any) -> dict[str, Any]:
    bare("drift")
    seen = len(lines("side.txt"))  # not journaled: one more on every replay
    ctx.attempt(Outbox(), "write", {"seen": seen})
    return {"seen": seen}


drift_plan = charter.Plan("drift", (drift,), ref="_node_plans:drift_plan")


@charter.node
def wobble(ctx: charter.Context, value: Any) -> Any:
    bare("wobble")
    # The first execution asks for the time, a replay for a random number.
    return ctx.now().isoformat() if len(lines("side.txt")) == 1 else ctx.random()


wobble_plan = charter.Plan("wobble", (wobble,), ref="_node_plans:wobble_plan")


# -- pay: one effect whose outcome the crash leaves uncertain ----------------------------


@charter.node
def pay(ctx: charter.Context, value: Any) -> dict[str, Any]:
    bare("pay")
    return {"paid": ctx.attempt(Outbox(), "write", {"effect": "pay"})}


pay_plan = charter.Plan("pay", (pay,), ref="_node_plans:pay_plan")


# -- crashy: a node that kills its process before it admits anything -------------------


@charter.node
def prepare(ctx: charter.Context, value: Any) -> dict[str, Any]:
    return {"prepared": ctx.attempt(Outbox(), "write", {"effect": "prepare"})}


@charter.node
def crashy(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
    bare("crashy")
    die_here("crashy")
    return {**value, "crashy": True}


crashy_plan = charter.Plan("crashy", (prepare, crashy), ref="_node_plans:crashy_plan")


# -- produce / consume: a checked result a consumer reads -------------------------------


@charter.node
def produce(ctx: charter.Context, value: Any) -> dict[str, Any]:
    return {"value": 42}


@charter.node
def consume(ctx: charter.Context, value: dict[str, Any]) -> dict[str, Any]:
    bare("consume")
    return {"consumed": ctx.attempt(Outbox(), "write", {"value": value["value"]})}


handoff_plan = charter.Plan("handoff", (produce, consume), ref="_node_plans:handoff_plan")


# -- linked: a declared failure after a send, fixed for the follow-up run --------------------


@charter.node
def one(ctx: charter.Context, value: Any) -> dict[str, Any]:
    ctx.attempt(Outbox(), "write", {"effect": "one"})
    return {"one": True}


@charter.node
def two(ctx: charter.Context, value: Any) -> dict[str, Any]:
    ctx.attempt(Outbox(), "write", {"effect": "two-a"})
    if lines("bug.txt"):
        raise charter.NodeFailed("the step under review failed")  # ends the run (N6)
    die_here("two")
    ctx.attempt(Outbox(), "write", {"effect": "two-b"})
    return {"two": "done"}


linked_plan = charter.Plan("linked", (one, two), ref="_node_plans:linked_plan")


# -- invoices: one node pays ten invoices in a loop ------------------------------------


def _invoices(retries: int, keyed: bool) -> charter.Node:
    """The most common agent shape: one node, a loop of payments. ``bug.txt``
    makes the node raise once after paying seven (a node retry follows)."""

    @charter.node(name="invoices", retries=retries)
    def invoices(ctx: charter.Context, value: Any) -> dict[str, Any]:
        lines_paid = []
        for i in range(10):
            if i == 7 and lines("bug.txt"):
                (workdir() / "bug.txt").unlink()
                raise RuntimeError("a bug after seven payments")
            key = f"invoice-{i}" if keyed else None
            lines_paid.append(ctx.attempt(Outbox(), "write", {"invoice": i}, key=key)["line"])
        return {"lines": lines_paid}

    return invoices


invoices_0_plain = charter.Plan(
    "invoices", (_invoices(0, False),), ref="_node_plans:invoices_0_plain"
)
invoices_0_keyed = charter.Plan(
    "invoices", (_invoices(0, True),), ref="_node_plans:invoices_0_keyed"
)
invoices_1_plain = charter.Plan(
    "invoices", (_invoices(1, False),), ref="_node_plans:invoices_1_plain"
)
invoices_1_keyed = charter.Plan(
    "invoices", (_invoices(1, True),), ref="_node_plans:invoices_1_keyed"
)


# -- the child process -------------------------------------------------------------------


def _kill_after(point: str, skip: int) -> CrashHook:
    kill = kill_at(point)
    passes = [0]

    def hook(name: str) -> None:
        if name == point:
            passes[0] += 1
            if passes[0] > skip:
                kill(name)

    return hook


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    _DIE_IN.update(cfg.get("die_in", []))
    hook = (
        _kill_after(cfg["kill_point"], cfg.get("kill_skip", 0)) if cfg.get("kill_point") else None
    )
    config = charter.EngineConfig(credentials=cfg["digests"])
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        agent = engine.authenticate(cfg["credential"])
        if cfg.get("link_from") is not None:
            reviewer = engine.authenticate(cfg["reviewer"])
            ex = engine.new_linked_run(
                cfg["link_from"], reviewed_by=reviewer, segment_id=cfg["segment_id"]
            )
        elif cfg.get("run_id") is None:
            plan = import_path(cfg["plan"])
            ex = engine.start_run(
                cfg["mission_id"],
                by=agent,
                segment_id=cfg["segment_id"],
                plan=plan,
                input=cfg.get("input"),
            )
        else:
            ex = engine.coordinator.resume(cfg["run_id"], cfg["segment_id"], by=agent)
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        ex.execute()
    return 0
