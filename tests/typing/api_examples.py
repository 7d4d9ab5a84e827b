"""User-facing API, type-checked under mypy strict (never executed)."""

from __future__ import annotations

from typing import Any

import charter


def offsite(
    engine: charter.Engine, agent: charter.Principal, mission_id: str, llm: charter.Adapter
) -> None:
    @charter.node(check=bool)
    def research(ctx: charter.Context, team: dict[str, Any]) -> str:
        answer: dict[str, Any] = ctx.attempt(llm, "complete", {"max_tokens": 400})
        when = ctx.now().isoformat()
        return f"{answer['text']} at {when}"

    plan = charter.Plan("offsite", (research,), ref="myapp.plans:offsite")
    executor: charter.Executor = engine.start_run(
        mission_id, by=agent, segment_id="seg-1", plan=plan, input={"size": 12}
    )
    executor.execute(plan)


def recover(engine: charter.Engine, run_id: str) -> list[str]:
    state, unresolved = engine.coordinator.recover(run_id, "seg-2")
    assert state.epoch >= 2
    return list(unresolved)
