"""The resume policy (R9): what stands in the way of continuing a run, and
who or what may let it continue. Nothing else decides it.

No mode continues past an unresolved attempt, an expired approval, revoked
authority, a stop condition, an exhausted limit, an open incident, too many
takeovers of one effect or crashes, or a non-determinism (:func:`blockers`). Beyond that,
the mode (:func:`mode`: the engine's, made stricter, never looser, by the
contract) says who decides: ``automatic`` continues, ``rules`` asks the
engine's resume rules, ``human`` needs an authenticated principal holding
``run`` in the mission (:func:`judge`) — after an interruption. A run whose
executor let go of it (a wait, K2; a pause for its allowance or an incident,
L5, L7; a worker stopping, K4) and whose owner was not lost holding it since
was not interrupted: once what it waits for has come, it goes on as it would
have, under any mode. What let it go on (an approval, a raised limit, a closed
incident) was a person's decision already, and everything above still stands
in the way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from charter.contracts.authority import may_run
from charter.contracts.contract import RESUME_STRICTNESS, Contract, ResumeMode
from charter.recovery.state import RecoveryState
from charter.runs import run as runs
from charter.runs import store as run_store
from charter.runs.run import Run, RunStatus
from charter.storage import Tx


def mode(engine: ResumeMode, contract: Contract) -> ResumeMode:
    """The engine's mode, made stricter (never looser) by the contract."""
    if contract.resume is None:
        return engine
    return max(engine, contract.resume, key=RESUME_STRICTNESS.index)


def judge(
    state: RecoveryState,
    contract: Contract,
    how: ResumeMode,
    by: str | None,
    rules: Sequence[Callable[[Any], bool]],
    *,
    let_go: bool = False,
) -> list[str]:
    """What stands in the way of continuing, by the recorded state and the mode
    ``how``; ``by`` is the authenticated principal asking, if any; ``let_go``:
    the run's executor let go of it and no owner was lost holding it since.
    Resume rules are called here: the caller holds no transaction (a rule may
    read the engine)."""
    found = blockers(state, contract)
    went_on_by_itself = by is None and let_go and not interrupted(state)
    if not found and how == "human" and not went_on_by_itself:
        if by is None:
            found.append(
                "the resume policy is 'human': an authenticated principal "
                "must authorise the continuation"
            )
        elif not may_run(contract, by):
            found.append(f"principal {by!r} has no 'run' right to authorise the continuation")
    if not found and how == "rules":
        failed = [getattr(r, "__name__", repr(r)) for r in rules if not r(state)]
        if failed:
            found.append(f"resume rules refused: {failed}")
    return found


def shown_waiting(tx: Tx, run: Run, blockers: Sequence[str], actor: str) -> bool:
    """K5: a run that ``blockers`` keep from going on, and that no executor holds,
    is never left ``active`` (a lease nobody renews, no wake, in no inbox): it
    waits with them as its reason, ``paused`` when only its allowance or open
    incidents stand in the way (a raised limit or a closed incident wakes it, as
    after an admission refused for them, L7), else ``needs_intervention``.
    Whether its status changed (a refusal keeps that change)."""
    if not blockers or run.status is not RunStatus.ACTIVE or run_store.held_alive(tx, run):
        return False
    lifted = all(
        b.startswith("allowance exhausted: ") or b.endswith(" open incident(s)") for b in blockers
    )
    status = RunStatus.PAUSED if lifted else RunStatus.NEEDS_INTERVENTION
    runs.set_status(tx, run, status, "resume refused: " + "; ".join(blockers), actor=actor)
    return True


def interrupted(state: RecoveryState) -> bool:
    """Whether the run needs a person's look whatever let go of it: it waits for
    intervention, or a node execution was left running."""
    return state.run.status is RunStatus.NEEDS_INTERVENTION or any(
        n["status"] == "running" for n in state.nodes
    )


def blockers(state: RecoveryState, contract: Contract) -> list[str]:
    """What no mode continues past (R9), read from the run's recovery state."""
    out: list[str] = []
    uncertain = [a.id for a in state.attempts if a.status.unresolved]
    if uncertain:
        out.append(f"{len(uncertain)} unresolved attempt(s): {', '.join(uncertain)}")
    for w in state.waits:
        if w["expired"]:
            out.append(f"approval {w['id']} expired")
        elif w.get("renews"):
            out.append(f"approval {w['id']} renews an expired one and awaits a decision")
    a = state.assessment
    if not may_run(contract, state.run.principal):
        out.append(f"principal {state.run.principal!r} no longer has the 'run' right")
    if a["stop_conditions"]:
        out.append("stop condition: " + ", ".join(a["stop_conditions"]))
    if a["exhausted"]:
        out.append("allowance exhausted: " + ", ".join(a["exhausted"]))
    if a["open_incidents"]:
        out.append(f"{a['open_incidents']} open incident(s)")
    if state.takeovers > contract.max_recoveries:
        out.append(
            f"an attempt was left unresolved by {state.takeovers} takeovers "
            f"(limit {contract.max_recoveries})"
        )
    if any(
        n["status"] == "running" and n["crashes"] >= contract.max_node_crashes for n in state.nodes
    ):
        out.append(f"a node crashed {contract.max_node_crashes} times in a row")
    if state.run.status in (RunStatus.STOPPING,):
        out.append("the run is stopping")
    reason = state.run.status_reason or ""
    if state.run.status is RunStatus.NEEDS_INTERVENTION and reason.startswith("non-determinism"):
        # Unlike an unresolved attempt, nothing recorded can clear this: replay
        # would diverge again. Stop the run; review a new linked one.
        out.append(reason)
    return out
