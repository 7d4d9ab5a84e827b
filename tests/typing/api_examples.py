"""User-facing API, type-checked under mypy strict (never executed).

Every type written here is named through the face (``charter.X``) or the
errors module: what a public method takes or returns, a caller can name.
"""

from __future__ import annotations

from typing import Any

import charter
from charter import errors


def offsite(
    engine: charter.Engine, agent: charter.Principal, mission_id: str, llm: charter.Adapter
) -> None:
    @charter.node(check=bool)
    def research(ctx: charter.Context, team: dict[str, Any]) -> str:
        try:
            answer: dict[str, Any] = ctx.attempt(llm, "complete", {"max_tokens": 400})
        except charter.AttemptFailed:
            raise charter.NodeFailed("the model refused the question") from None
        when = ctx.now().isoformat()
        return f"{answer['text']} at {when}"

    plan = charter.Plan("offsite", (research,), ref="myapp.plans:offsite")
    executor: charter.Executor = engine.start_run(
        mission_id, by=agent, segment_id="seg-1", plan=plan, input={"size": 12}
    )
    executor.execute(plan)


def outside_a_node(executor: charter.Executor, llm: charter.Adapter) -> charter.AttemptStatus:
    attempt: charter.Attempt = executor.perform(llm, "complete", {}, effect_key="q1")
    return attempt.status


def recover(engine: charter.Engine, run_id: str) -> list[str]:
    coordinator: charter.Coordinator = engine.coordinator
    state, unresolved = coordinator.recover(run_id, "seg-2")
    assert state.epoch >= 2
    recovered: charter.RecoveryState = coordinator.state(run_id)
    actions: list[charter.NextAction] = recovered.next_actions
    return [*unresolved, *(action.id for action in actions)]


def read(engine: charter.Engine, mission_id: str, attempt_id: str) -> int:
    mission: charter.Mission = engine.mission(mission_id)
    balances: dict[str, charter.Balance] = engine.balances(mission.id)
    approvals: list[charter.Approval] = engine.approvals(pending=True)
    waits: list[charter.Wait] = engine.waits(open_only=True)
    checks: list[charter.Verification] = engine.verify_audit(mission.id)
    attempt: charter.Attempt = engine.get_attempt(attempt_id)
    return (
        sum(b.available for b in balances.values())
        + len(approvals)
        + len(waits)
        + len(checks)
        + (attempt.status is charter.AttemptStatus.SUCCEEDED)
    )


def decide(engine: charter.Engine, approval_id: str, by: charter.Principal) -> bool:
    try:
        status: charter.ApprovalStatus = engine.approve(approval_id, by=by)
    except errors.NotAuthorized as refused:
        return refused.code == "not_authorized"
    return status is charter.ApprovalStatus.APPROVED
