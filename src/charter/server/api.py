"""The JSON API, version 1: what the command line does, over HTTP.

Each endpoint is one row of :data:`ENDPOINTS` (method, path, what it needs, its
query and body fields, its handler); the router, the OpenAPI description and
the authorisation tests all read that table. A handler gets the engine, the
authenticated principal and the request's values, calls the public engine API
once or twice and returns JSON-able data. Rights are never checked here: the
engine checks every decision against the mission's current contract and
audits it; reads need a valid credential.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from charter import Blocked, RunStatus
from charter.errors import UsageError
from charter.server.wire import jsonable, limit, listing, next_action, position, whole

if TYPE_CHECKING:
    from charter import Engine, Principal

VERSION = "v1"
PREFIX = f"/api/{VERSION}"


@dataclass(frozen=True)
class Call:
    """One request's values: path parameters, query parameters, the JSON body."""

    path: Mapping[str, str]
    query: Mapping[str, str]
    body: Mapping[str, Any] = field(default_factory=dict)

    def text(self, name: str, default: str | None = None) -> str | None:
        value = self.body.get(name, self.query.get(name, default))
        if value is not None and not isinstance(value, str):
            raise UsageError(f"{name} must be a string, got {value!r}")
        return value

    def needs(self, name: str) -> str:
        value = self.text(name)
        if not value:
            raise UsageError(f"{name} is required")
        return value

    def flag(self, name: str) -> bool:
        value = self.body.get(name, self.query.get(name, False))
        if value in ("1", "true", True):
            return True
        if value in ("0", "false", "", False):
            return False
        raise UsageError(f"{name} must be true or false, got {value!r}")

    def amount(self, name: str) -> int:
        value = self.body.get(name)
        if isinstance(value, bool) or not isinstance(value, int):
            raise UsageError(f"{name} must be a whole number, got {value!r}")
        return whole(str(value), name)


Handler = Callable[["Engine", "Principal", Call], Any]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str  # under PREFIX, with {name} parameters
    name: str
    summary: str
    needs: str  # "credential", or the right the engine checks
    handler: Handler
    query: tuple[str, ...] = ()
    body: Mapping[str, str] = field(default_factory=dict)  # field -> JSON type
    required: tuple[str, ...] = ()

    @property
    def decides(self) -> bool:
        return self.method == "POST"


# -- reads ------------------------------------------------------------------------------
def _me(engine: Engine, who: Principal, call: Call) -> Any:
    return {"principal": who.name}


def _missions(engine: Engine, who: Principal, call: Call) -> Any:
    size = limit(call.text("limit"))
    found = engine.missions(limit=size + 1, after=position(call.text("after")))
    rows = [m.to_dict() for m in found]
    return listing(rows, size, "created_at_us")


def _mission(engine: Engine, who: Principal, call: Call) -> Any:
    mission_id = call.path["mission_id"]
    mission = engine.mission(mission_id).to_dict()
    return {**mission, "contract": engine.contract(mission_id).to_dict()}


def _runs(engine: Engine, who: Principal, call: Call) -> Any:
    size = limit(call.text("limit"))
    status = call.text("status")
    try:
        wanted = RunStatus(status) if status else None
    except ValueError:
        raise UsageError(
            f"status must be one of {', '.join(s.value for s in RunStatus)}, got {status!r}"
        ) from None
    found = engine.runs(
        call.text("mission"), status=wanted, limit=size + 1, after=position(call.text("after"))
    )
    return listing([r.to_dict() for r in found], size, "created_at_us")


def _run(engine: Engine, who: Principal, call: Call) -> Any:
    return engine.coordinator.state(call.path["run_id"]).to_dict()


def _timeline(engine: Engine, who: Principal, call: Call) -> Any:
    """The newest page of the run's events before ``before`` (a ``seq``), in
    order; ``next`` is the cursor of the page of older events."""
    size = limit(call.text("limit"))
    before = call.text("before")
    found = engine.timeline(
        call.path["run_id"],
        before=whole(before, "before", 1) if before else None,
        limit=size + 1,
    )
    page = found[-size:]
    return {"items": page, "next": str(page[0]["seq"]) if len(found) > size else None}


def _attempts(engine: Engine, who: Principal, call: Call) -> Any:
    size = limit(call.text("limit"))
    found = engine.attempts(
        run_id=call.text("run"),
        mission_id=call.text("mission"),
        unresolved=call.flag("unresolved"),
        limit=size + 1,
        after=position(call.text("after")),
    )
    return listing([a.to_dict() for a in found], size, "prepared_at_us")


def _search(engine: Engine, who: Principal, call: Call) -> Any:
    """Runs and attempts matching ``q`` (engine.search: a bounded window a call);
    ``next`` is the ``before`` of the next window."""
    return engine.search(
        call.text("q") or "", limit=limit(call.text("limit")), before=call.text("before")
    )


def _attempt(engine: Engine, who: Principal, call: Call) -> Any:
    attempt = engine.get_attempt(call.path["attempt_id"]).to_dict()
    evidence = engine.evidence(attempt["id"])
    unresolved = attempt["status"] in ("prepared", "dispatched", "unknown")
    return {
        **attempt,
        "evidence": evidence,
        "next_action": next_action(attempt, evidence) if unresolved else None,
    }


def _approvals(engine: Engine, who: Principal, call: Call) -> Any:
    size = limit(call.text("limit"))
    found = engine.approvals(
        run_id=call.text("run"),
        pending=call.flag("pending"),
        limit=size + 1,
        after=position(call.text("after")),
    )
    return listing([a.to_dict() for a in found], size, "requested_at_us")


def _approval(engine: Engine, who: Principal, call: Call) -> Any:
    approval_id = call.path["approval_id"]
    request = engine.approval_request(approval_id)
    return {
        **engine.approval(approval_id).to_dict(),
        "request": None if request is None else request.to_dict(),
    }


def _incidents(engine: Engine, who: Principal, call: Call) -> Any:
    size = limit(call.text("limit"))
    rows = engine.incidents(
        call.path["mission_id"],
        open_only=call.flag("open"),
        limit=size + 1,
        after=position(call.text("after")),
    )
    return listing(rows, size, "opened_at_us")


def _ledger(engine: Engine, who: Principal, call: Call) -> Any:
    mission_id = call.path["mission_id"]
    balances = engine.balances(mission_id)
    return {
        "mission_id": mission_id,
        "balances": [{"unit": u, **jsonable(b)} for u, b in balances.items()],
        "problems": engine.check_ledger(mission_id),
    }


def _audit(engine: Engine, who: Principal, call: Call) -> Any:
    chains = [v.to_dict() for v in engine.verify_audit(call.text("mission"))]
    return {"ok": all(c["ok"] for c in chains), "chains": chains}


# -- decisions: the engine authorises and audits each ---------------------------------------
def _recover(engine: Engine, who: Principal, call: Call) -> Any:
    state = engine.coordinator.recover(
        call.path["run_id"], call.needs("segment"), force=call.flag("force"), by=who
    )
    return state.to_dict()


def _reconcile(engine: Engine, who: Principal, call: Call) -> Any:
    attempt = engine.get_attempt(call.path["attempt_id"])
    adapter = engine.config.load_adapter(attempt.adapter)
    evidence = engine.coordinator.reconcile(
        attempt.id, adapter, by=who, segment_id=call.text("segment")
    )
    after = engine.get_attempt(attempt.id)
    return {
        "attempt_id": attempt.id,
        "verdict": evidence.verdict,
        "detail": jsonable(evidence.detail),
        "status": after.status.value,
        "settled": after.status.settled,
    }


def _confirm(engine: Engine, who: Principal, call: Call) -> Any:
    attempt = engine.coordinator.confirm(
        call.path["attempt_id"], by=who, evidence_id=call.text("evidence_id")
    )
    return attempt.to_dict()


def _resolve(engine: Engine, who: Principal, call: Call) -> Any:
    outcome = call.needs("outcome")
    if outcome not in ("succeeded", "failed", "written_off"):
        raise UsageError(f"outcome must be succeeded, failed or written_off, got {outcome!r}")
    cost = call.body.get("cost") or {}
    if not isinstance(cost, Mapping):
        raise UsageError(f"cost must map units to whole amounts, got {cost!r}")
    amounts = {str(u): Call({}, {}, cost).amount(u) for u in cost}
    attempt = engine.coordinator.resolve(
        call.path["attempt_id"],
        by=who,
        outcome=outcome,  # type: ignore[arg-type]  # checked just above
        evidence=call.needs("evidence"),
        cost=amounts,
        confirm_above_hold=call.flag("confirm_above_hold"),
    )
    return attempt.to_dict()


def _resume(engine: Engine, who: Principal, call: Call) -> Any:
    run_id = call.path["run_id"]
    if not call.text("segment") and engine.queued_run(run_id) is not None:
        # Workers carry it: they continue it on this person's go-ahead, with their
        # plans and adapters; this server runs no agent's nodes.
        run = engine.coordinator.go_ahead(run_id, by=who)
        return {
            "run_id": run.id,
            "status": run.status.value,
            "epoch": run.epoch,
            "go_ahead": who.name,
        }
    # By default the run continues as its owner's segment, which a blocked run has let go of.
    segment = call.text("segment") or engine.run(run_id).owner_segment
    executor = engine.coordinator.resume(run_id, segment, by=who)
    try:
        result = executor.execute()
    except Blocked as blocked:  # resumed, and waiting again: the run's state says why
        run = engine.run(run_id)
        why = {"reason": blocked.reason, "attempt_id": blocked.attempt_id}
        return {"run_id": run.id, "status": run.status.value, "epoch": run.epoch, "blocked": why}
    run = engine.run(run_id)
    return {"run_id": run.id, "status": run.status.value, "epoch": run.epoch, "result": result}


def _submit(engine: Engine, who: Principal, call: Call) -> Any:
    """Queue a run for whichever worker is free (K1); the run, ``queued``."""
    given = call.body.get("input")
    if given is not None and not isinstance(given, dict):
        raise UsageError(f"input must be a JSON object, got {given!r}")
    run = engine.submit(
        call.needs("mission_id"),
        by=who,
        plan=call.needs("plan"),
        input=given,
        queue=call.text("queue") or "default",
    )
    return run.to_dict()


def _stop(engine: Engine, who: Principal, call: Call) -> Any:
    run = engine.stop_run(call.path["run_id"], by=who, reason=call.text("reason") or "stopped")
    return run.to_dict()


def _raise_limit(engine: Engine, who: Principal, call: Call) -> Any:
    mission_id, unit = call.path["mission_id"], call.needs("unit")
    version = engine.raise_limit(mission_id, unit, call.amount("limit"), by=who)
    balance = engine.balances(mission_id)[unit]
    return {"mission_id": mission_id, "contract_version": version, "balance": jsonable(balance)}


def _decide(deny: bool) -> Handler:
    def decide(engine: Engine, who: Principal, call: Call) -> Any:
        approval_id = call.path["approval_id"]
        status = engine.approve(approval_id, by=who, deny=deny)
        return {"approval_id": approval_id, "status": status.value}

    return decide


def _close_incident(engine: Engine, who: Principal, call: Call) -> Any:
    incident_id = call.path["incident_id"]
    engine.close_incident(incident_id, by=who, note=call.needs("note"))
    return {"incident_id": incident_id, "status": "closed"}


_PAGE = ("limit", "after")
E = Endpoint
ENDPOINTS: tuple[Endpoint, ...] = (
    E("GET", "/me", "me", "The principal the credential proves", "credential", _me),
    E("GET", "/missions", "missions", "List missions", "credential", _missions, _PAGE),
    E("GET", "/missions/{mission_id}", "mission", "A mission and its current contract",
      "credential", _mission),
    E("GET", "/missions/{mission_id}/ledger", "ledger",
      "A mission's balances per unit and the ledger check", "credential", _ledger),
    E("GET", "/missions/{mission_id}/incidents", "incidents", "A mission's incidents",
      "credential", _incidents, ("open", *_PAGE)),
    E("POST", "/missions/{mission_id}/raise-limit", "raise_limit",
      "Raise an allowance limit (a new contract version)", "raise_limit", _raise_limit,
      body={"unit": "string", "limit": "integer"}, required=("unit", "limit")),
    E("GET", "/runs", "runs", "List runs", "credential", _runs, ("mission", "status", *_PAGE)),
    E("POST", "/runs", "submit",
      "Submit a run of a plan (its module:attribute) for whichever worker is free", "run",
      _submit, body={"mission_id": "string", "plan": "string", "input": "object",
                     "queue": "string"}, required=("mission_id", "plan")),
    E("GET", "/runs/{run_id}", "run",
      "A run's state: nodes, unresolved attempts, waits, next actions", "credential", _run),
    E("GET", "/runs/{run_id}/timeline", "timeline", "The audit events about a run, newest page",
      "credential", _timeline, ("before", "limit")),
    E("POST", "/runs/{run_id}/recover", "recover",
      "Take a run over as a new segment (needs recover; force: needs stop)", "recover", _recover,
      body={"segment": "string", "force": "boolean"}, required=("segment",)),
    E("POST", "/runs/{run_id}/resume", "resume",
      "Continue a run under the resume policy (human mode: needs run); a run workers "
      "carry is given a go-ahead, and the next worker continues it", "run", _resume,
      body={"segment": "string"}),
    E("POST", "/runs/{run_id}/stop", "stop", "Stop a run", "stop", _stop,
      body={"reason": "string"}),
    E("GET", "/attempts", "attempts", "List attempts", "credential", _attempts,
      ("run", "mission", "unresolved", *_PAGE)),
    E("GET", "/search", "search",
      "Runs and attempts by a business key: an effect key, a request value, an ID prefix",
      "credential", _search, ("q", "before", "limit")),
    E("GET", "/attempts/{attempt_id}", "attempt",
      "An attempt with its evidence and next safe action", "credential", _attempt),
    E("POST", "/attempts/{attempt_id}/reconcile", "reconcile",
      "Ask the attempt's adapter for evidence and record it", "reconcile", _reconcile,
      body={"segment": "string"}),
    E("POST", "/attempts/{attempt_id}/confirm", "confirm",
      "Settle an uncertain attempt on its recorded evidence", "resolve", _confirm,
      body={"evidence_id": "string"}),
    E("POST", "/attempts/{attempt_id}/resolve", "resolve",
      "Settle an uncertain attempt as a person, with evidence", "resolve", _resolve,
      body={
          "outcome": "string",
          "evidence": "string",
          "cost": "object",
          "confirm_above_hold": "boolean",
      },
      required=("outcome", "evidence")),
    E("GET", "/approvals", "approvals", "List approvals", "credential", _approvals,
      ("run", "pending", *_PAGE)),
    E("GET", "/approvals/{approval_id}", "approval",
      "An approval with the exact request it is bound to", "credential", _approval),
    E("POST", "/approvals/{approval_id}/approve", "approve", "Approve a pending approval",
      "approve", _decide(deny=False)),
    E("POST", "/approvals/{approval_id}/deny", "deny", "Deny a pending approval",
      "approve", _decide(deny=True)),
    E("POST", "/incidents/{incident_id}/close", "close_incident",
      "Close an incident with a note", "resolve", _close_incident,
      body={"note": "string"}, required=("note",)),
    E("GET", "/audit", "audit", "Verify the audit hash chains", "credential", _audit,
      ("mission",)),
)  # fmt: skip
