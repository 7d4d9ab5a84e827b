"""The operator's desk under test: a real server on loopback over a test engine,
the adapter it reconciles through (configured by reference, as in production),
and a plan whose one effect needs an approval.

``ADAPTER`` is module state on purpose: the engine's configuration names it as
``_desk:recorder``, so the server's reconcile and resume reach the very object
the test scripts (a lost response, evidence the target holds).
"""

from __future__ import annotations

import socket
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import charter
from charter.server import serving as charter_serving
from charter.testing import RecordingAdapter

ADAPTER = RecordingAdapter(costs={"write": {"usd": 5_000, "calls": 1}})
CONFIG: dict[str, Any] = {"adapters": {"recorder": "_desk:recorder"}}


def recorder() -> RecordingAdapter:
    return ADAPTER


def reset() -> RecordingAdapter:
    """A fresh adapter state for the next test: nothing sent, nothing scripted."""
    ADAPTER.sent.clear()
    ADAPTER.reconciled.clear()
    ADAPTER.script.clear()
    ADAPTER.evidence.clear()
    return ADAPTER


@charter.node
def pay(ctx: charter.Context, value: Any) -> Any:
    return ctx.attempt(ADAPTER, "write", {"to": value["to"], "amount": value["amount"]}, key="pay")


pay_plan = charter.Plan("pay", (pay,), ref="_desk:pay_plan")


@charter.node
def pay_anyway(ctx: charter.Context, value: Any) -> Any:
    """Pays as ``pay`` does (naming the invoice, when the input has one), and goes
    on when a person settled the payment without recording the target's answer
    (what a resolution from a bank statement does)."""
    request = {k: value[k] for k in ("to", "amount", "invoice") if k in value}
    try:
        return ctx.attempt(ADAPTER, "write", request, key="pay")
    except charter.AnswerNotRecorded:
        return {"paid": True, "answer": None}


pay_anyway_plan = charter.Plan("pay_anyway", (pay_anyway,), ref="_desk:pay_anyway_plan")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def serving(engine: charter.Engine, *, secure: bool = False, **options: Any) -> Iterator[str]:
    """The application over ``engine`` (``options`` go to ``create_app``) served on
    loopback (:func:`charter.server.serving`); its base URL. When it stops, the
    refusals it counted are written, as ``charter serve`` writes them."""
    with charter_serving(engine, secure_cookies=secure, **options) as url:
        yield url
