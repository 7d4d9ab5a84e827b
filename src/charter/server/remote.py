"""The remote attempt protocol (X1): a process in any language runs a run's
attempts as a segment over HTTP (docs/protocol.md is its reference).

Endpoints as :mod:`charter.server.api` has them, one row each of
:data:`ENDPOINTS`, routed and described with the API's. A handler checks the
shape of what it is given (a typed ``usage_error`` before anything is
written) and calls the public engine once: ``start_run`` and
``coordinator.resume`` claim a run, ``Engine.segment_executor`` rebuilds the segment's
executor from what the client holds, and the executor admits (``hand``) and
settles (``report``) with the engine's own code. No rule is written here.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from charter import EffectClass, Evidence, Fenced, Outcome, RunStatus
from charter.errors import SegmentFenced, UsageError
from charter.server.api import Call, Endpoint, Handler
from charter.server.wire import INT64

if TYPE_CHECKING:
    from charter import Engine, Executor, Principal

_CLASSES = tuple(c.value for c in EffectClass)
_OUTCOMES = ("succeeded", "failed", "not_applied", "unknown")
_SEGMENT = {"segment": "string", "epoch": "integer", "claim": "string"}
_HELD = ("segment", "epoch", "claim")


def _fenced(handler: Handler) -> Handler:
    """``handler`` with the executor's fencing signal answered as ``409 fenced``."""

    def answer(engine: Engine, who: Principal, call: Call) -> Any:
        try:
            return handler(engine, who, call)
        except Fenced as exc:
            raise SegmentFenced(
                str(exc), run_id=exc.run_id, epoch=exc.epoch, current_epoch=exc.current_epoch
            ) from None

    return answer


# -- values -------------------------------------------------------------------------------
def _integer(call: Call, name: str, low: int = 0) -> int:
    """A whole number in [``low``, 2**63 - 1]: what the store's columns hold, so a
    larger one is the caller's mistake (400), never the store's (500)."""
    value = call.body.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= INT64:
        raise UsageError(f"{name} must be a whole number from {low} to {INT64}, got {value!r}")
    return value


def _amounts(call: Call, name: str, *, required: bool) -> dict[str, int]:
    """``{unit: whole amount}`` (A9): anything else is refused before a write."""
    given = call.body.get(name)
    if given is None and not required:
        return {}
    if not isinstance(given, Mapping):
        raise UsageError(f"{name} must map units to whole amounts, got {given!r}")
    return {str(u): Call({}, {}, given).amount(u) for u in given}


def _held(engine: Engine, who: Principal, call: Call) -> Executor:
    """The segment's executor, from the three values the client holds."""
    return engine.segment_executor(
        call.path["run_id"],
        segment_id=call.needs("segment"),
        epoch=_integer(call, "epoch", 1),
        claim=call.needs("claim"),
        by=who,
    )


def _claimed(engine: Engine, executor: Executor) -> dict[str, Any]:
    """What a claim answers: the segment's three values and its lease left."""
    return {
        "run_id": executor.run_id,
        "mission_id": executor.mission_id,
        "segment": executor.segment_id,
        "epoch": executor.epoch,
        "claim": executor.claim,
        "lease_ms": executor.lease_left_us() // 1000,
        "status": engine.run(executor.run_id).status.value,
    }


# -- claiming a run -------------------------------------------------------------------------
def _start(engine: Engine, who: Principal, call: Call) -> Any:
    given = call.body.get("input")
    if given is not None and not isinstance(given, dict):
        raise UsageError(f"input must be a JSON object, got {given!r}")
    executor = engine.start_run(
        call.path["mission_id"], by=who, segment_id=call.needs("segment"), input=given
    )
    return _claimed(engine, executor)


def _claim(engine: Engine, who: Principal, call: Call) -> Any:
    executor = engine.coordinator.resume(
        call.path["run_id"], call.needs("segment"), by=who, force=call.flag("force")
    )
    return _claimed(engine, executor)


def _renew(engine: Engine, who: Principal, call: Call) -> Any:
    executor = _held(engine, who, call)
    executor.renew_lease()
    return {
        "run_id": executor.run_id,
        "segment": executor.segment_id,
        "epoch": executor.epoch,
        "lease_ms": executor.lease_left_us() // 1000,
    }


def _release(engine: Engine, who: Principal, call: Call) -> Any:
    executor = _held(engine, who, call)
    if not executor.release():
        current = engine.run(executor.run_id).epoch
        raise SegmentFenced(
            f"segment {executor.segment_id!r} does not hold run {executor.run_id} at epoch "
            f"{executor.epoch}: nothing was released",
            run_id=executor.run_id,
            epoch=executor.epoch,
            current_epoch=current,
        )
    return {"run_id": executor.run_id, "released": True}


# -- attempts -------------------------------------------------------------------------------
def _window(call: Call, effect: str) -> int | None:
    if effect == EffectClass.IDEMPOTENT_KEYED.value:
        return _integer(call, "dedupe_window_seconds", 1)
    if call.body.get("dedupe_window_seconds") is not None:
        raise UsageError("dedupe_window_seconds goes only with effect_class idempotent_keyed")
    return None


def _admit(engine: Engine, who: Principal, call: Call) -> Any:
    effect = call.needs("effect_class")
    if effect not in _CLASSES:
        raise UsageError(f"effect_class must be one of {', '.join(_CLASSES)}, got {effect!r}")
    if "request" not in call.body:
        raise UsageError("request is required (any JSON: it is recorded before it is sent)")
    execution = _integer(call, "execution") if "execution" in call.body else 0
    window, estimate = _window(call, effect), _amounts(call, "estimate", required=True)
    node_id = call.text("node_id") or ""
    executor = _held(engine, who, call)
    handed = executor.hand(
        call.needs("adapter"),
        call.needs("operation"),
        call.body["request"],
        effect_class=EffectClass(effect),
        estimate=estimate,
        effect_key=call.needs("effect_key"),
        node_id=node_id,
        execution=execution,
        dedupe_window_seconds=window,
        price_source=call.text("price_source"),
    )
    attempt, order = handed.attempt, handed.order
    answer: dict[str, Any] = {
        "action": handed.action,
        "attempt_id": attempt.id,
        "status": attempt.status.value,
    }
    if order is not None:
        return {
            **answer,
            "idempotency_key": order.idempotency_key,
            "fencing_token": order.fencing_token,
            "send_deadline_ms": handed.send_deadline_ms,
            "run_id": order.run_id,
            "epoch": order.epoch,
        }
    if handed.action == "replay":
        answer |= {"result": attempt.result, "cost": attempt.actual, "receipt": attempt.receipt}
    return {**answer, "reason": attempt.reason}


_FIELDS = {
    "succeeded": {"cost", "result", "receipt", "price_source"},
    "failed": {"cost", "result", "receipt", "price_source"},
    "not_applied": {"proof", "reason"},
    "unknown": {"reason", "detail"},
}


def _reported(call: Call) -> tuple[Evidence, str | None]:
    """The client's report as the engine's evidence and the reason it gives."""
    outcome = call.needs("outcome")
    if outcome not in _OUTCOMES:
        raise UsageError(f"outcome must be one of {', '.join(_OUTCOMES)}, got {outcome!r}")
    stray = sorted(set(call.body) - set(_SEGMENT) - {"outcome"} - _FIELDS[outcome])
    if stray:
        raise UsageError(f"{', '.join(stray)} do(es) not go with outcome {outcome!r}")
    reason = call.text("reason")
    if outcome == "not_applied":
        proof = call.body.get("proof")
        if proof is None or proof in ("", {}, []):
            raise UsageError("not_applied needs proof: why it is certain nothing was applied")
        return Evidence.not_applied(proof), f"not applied: {reason or 'proven by the client'}"
    if outcome == "unknown":
        return Evidence.indeterminate(call.body.get("detail")), f"outcome unknown: {reason or ''}"
    price = call.text("price_source")
    done = Outcome(
        outcome,  # type: ignore[arg-type]  # succeeded or failed, checked above
        call.body.get("result"),
        _amounts(call, "cost", required=False),
        call.body.get("receipt"),
        price,
    )
    return Evidence.applied(done), None


def _report(engine: Engine, who: Principal, call: Call) -> Any:
    evidence, reason = _reported(call)
    attempt_id = call.path["attempt_id"]
    run_id = engine.get_attempt(attempt_id).run_id
    done = engine.report_send(
        run_id,
        attempt_id,
        evidence,
        segment_id=call.needs("segment"),
        epoch=_integer(call, "epoch", 1),
        claim=call.needs("claim"),
        by=who,
        reason=reason,
    )
    a = done.attempt
    return {
        "attempt_id": a.id,
        "status": a.status.value,
        "settled": a.status.settled,
        "late": done.late,
    }


def _evidence(engine: Engine, who: Principal, call: Call) -> Any:
    verdict = call.needs("verdict")
    given = call.body.get("outcome")
    if verdict == "applied":
        if not isinstance(given, Mapping):
            raise UsageError("applied evidence needs its outcome {status, result, cost, receipt}")
        unknown = sorted(set(given) - {"status", "result", "cost", "receipt", "price_source"})
        status = given.get("status")
        if unknown or status not in ("succeeded", "failed"):
            raise UsageError(
                "outcome takes status (succeeded or failed), result, cost, receipt, price_source"
            )
        inner = Call({}, {}, given)
        done = Outcome(
            status,
            given.get("result"),
            _amounts(inner, "cost", required=False),
            given.get("receipt"),
            inner.text("price_source"),
        )
        found = Evidence("applied", done, call.body.get("detail"), source="client lookup")
    elif verdict in ("not_applied", "indeterminate"):
        if given is not None:
            raise UsageError(f"{verdict} evidence carries no outcome")
        found = Evidence(verdict, None, call.body.get("detail"), source="client lookup")  # type: ignore[arg-type]
    else:
        raise UsageError(f"verdict must be applied, not_applied or indeterminate, got {verdict!r}")
    attempt_id = call.path["attempt_id"]
    if any(name in call.body for name in _HELD):
        _dispatcher(engine, who, call, attempt_id)
    lookup = engine.client_lookup(attempt_id, found)
    kept = engine.coordinator.reconcile(attempt_id, lookup, by=who)
    after = engine.get_attempt(attempt_id)
    return {
        "attempt_id": attempt_id,
        "verdict": kept.verdict,
        "detail": kept.detail,
        "status": after.status.value,
        "settled": after.status.settled,
    }


def _dispatcher(engine: Engine, who: Principal, call: Call, attempt_id: str) -> None:
    """Evidence that speaks for a segment comes from the one that sent the attempt
    (X3): its claim proven, its epoch the attempt's dispatch epoch; else fenced."""
    attempt = engine.get_attempt(attempt_id)
    executor = engine.segment_executor(
        attempt.run_id,
        segment_id=call.needs("segment"),
        epoch=_integer(call, "epoch", 1),
        claim=call.needs("claim"),
        by=who,
    )
    if attempt.dispatched_epoch != executor.epoch:
        raise Fenced(
            f"attempt {attempt_id} was not dispatched at epoch {executor.epoch}; only the "
            "segment that sent it speaks for its send",
            run_id=attempt.run_id,
            epoch=executor.epoch,
            current_epoch=engine.run(attempt.run_id).epoch,
        )


def _start_node(engine: Engine, who: Principal, call: Call) -> Any:
    executor = _held(engine, who, call)
    node_id = call.path["node_id"]
    return {
        "run_id": executor.run_id,
        "node_id": node_id,
        "execution": executor.start_node(node_id),
    }


def _complete_node(engine: Engine, who: Principal, call: Call) -> Any:
    if "result" not in call.body:
        raise UsageError("result is required (any JSON: it is recorded with its hash)")
    executor = _held(engine, who, call)
    node_id, execution = call.path["node_id"], _integer(call, "execution", 1)
    digest = executor.complete_node(node_id, execution, call.body["result"])
    return {"run_id": executor.run_id, "node_id": node_id, "execution": execution,
            "result_hash": digest}  # fmt: skip


_ENDS = ("completed", "failed")


def _finish(engine: Engine, who: Principal, call: Call) -> Any:
    status = call.text("status") or "completed"
    if status not in _ENDS:
        raise UsageError(f"status must be completed or failed, got {status!r}")
    executor = _held(engine, who, call)
    executor.finish(RunStatus(status), call.text("reason"))
    return engine.run(executor.run_id).to_dict()


def _waits(engine: Engine, who: Principal, call: Call) -> Any:
    state = engine.coordinator.state(call.path["run_id"]).to_dict()
    return {"run_id": state["run_id"], "status": state["status"], "waits": state["waits"]}


_ADMIT = {
    **_SEGMENT,
    "node_id": "string",
    "execution": "integer",
    "effect_key": "string",
    "adapter": "string",
    "operation": "string",
    "effect_class": "string",
    "dedupe_window_seconds": "integer",
    "request": "any",
    "estimate": "object",
    "price_source": "string",
}
_REPORT = {
    **_SEGMENT,
    "outcome": "string",
    "cost": "object",
    "result": "any",
    "receipt": "any",
    "price_source": "string",
    "proof": "any",
    "reason": "string",
    "detail": "any",
}
E = Endpoint
ENDPOINTS: tuple[Endpoint, ...] = (
    E("POST", "/missions/{mission_id}/runs", "start_remote",
      "Start a run whose nodes run in the client, claimed as its first segment", "run",
      _start, body={"segment": "string", "input": "object"}, required=("segment",)),
    E("POST", "/runs/{run_id}/claim", "claim",
      "Claim a run as a segment: continue it, or take it over as a new segment (recovered "
      "first)", "run", _fenced(_claim), body={"segment": "string", "force": "boolean"},
      required=("segment",)),
    E("POST", "/runs/{run_id}/renew", "renew", "Renew a segment's lease", "credential",
      _fenced(_renew), body=_SEGMENT, required=_HELD),
    E("POST", "/runs/{run_id}/release", "release", "Stop holding a run as a segment",
      "credential", _fenced(_release), body=_SEGMENT, required=_HELD),
    E("POST", "/runs/{run_id}/attempts", "admit",
      "Admit an effect the client sends itself: the order to send, or its record", "credential",
      _fenced(_admit), body=_ADMIT,
      required=(*_HELD, "effect_key", "adapter", "operation", "effect_class", "request",
                "estimate")),
    E("POST", "/attempts/{attempt_id}/report", "report",
      "Report what the client's send of an attempt did; settled once, late reports kept",
      "credential", _fenced(_report), body=_REPORT, required=(*_HELD, "outcome")),
    E("POST", "/attempts/{attempt_id}/evidence", "evidence",
      "Reconcile an uncertain attempt with evidence the client's adapter found", "reconcile",
      _fenced(_evidence),
      body={**_SEGMENT, "verdict": "string", "outcome": "object", "detail": "any"},
      required=("verdict",)),
    E("POST", "/runs/{run_id}/nodes/{node_id}/start", "start_node",
      "The execution of a node the client runs now (the same one after a crash)", "credential",
      _fenced(_start_node), body=_SEGMENT, required=_HELD),
    E("POST", "/runs/{run_id}/nodes/{node_id}/complete", "complete_node",
      "Record a node's result and its hash (N1)", "credential", _fenced(_complete_node),
      body={**_SEGMENT, "execution": "integer", "result": "any"},
      required=(*_HELD, "execution", "result")),
    E("POST", "/runs/{run_id}/finish", "finish",
      "End a run (completed or failed); refused while an attempt is unresolved", "credential",
      _fenced(_finish), body={**_SEGMENT, "status": "string", "reason": "string"},
      required=_HELD),
    E("GET", "/runs/{run_id}/waits", "waits", "A run's waits", "credential", _waits),
)  # fmt: skip
