"""Plans as DAGs (N1): fan-out, fan-in, concurrency, refusals, checks, on a real store."""

from __future__ import annotations

import threading
from typing import Any

import pytest

import charter
from charter import RunStatus
from charter.testing import RecordingAdapter
from conftest import Principals, stored


def states(engine: charter.Engine, run_id: str) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for n in engine.node_executions(run_id):
        out.setdefault(n.node_id, []).append(n.status)
    return out


def _fan(barrier: threading.Barrier, adapter: RecordingAdapter) -> charter.Plan:
    @charter.node
    def split(ctx: charter.Context, value: Any) -> list[int]:
        return list(value["items"])

    def part(i: int) -> charter.Node:
        @charter.node(name=f"part{i}")
        def work(ctx: charter.Context, items: list[int]) -> int:
            barrier.wait(timeout=10)  # every part runs at once, or this times out
            ctx.attempt(adapter, "write", {"part": i}, key=f"part{i}")
            return items[i] * 10

        return work

    parts = [part(i) for i in range(3)]

    @charter.node
    def merge(ctx: charter.Context, results: dict[str, int]) -> dict[str, Any]:
        return {"total": sum(results.values()), "from": sorted(results)}

    return charter.Plan.graph(
        "fan", {split: [], **{p: [split] for p in parts}, merge: parts}, workers=3
    )


def test_N1_fan_out_runs_ready_nodes_concurrently_and_fan_in_receives_each_checked_result(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    barrier = threading.Barrier(3)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")

    result = ex.execute(_fan(barrier, adapter), {"items": [1, 2, 3]})

    assert result == {"total": 60, "from": ["part0", "part1", "part2"]}
    assert sorted(s.request["part"] for s in adapter.sent) == [0, 1, 2]
    rows = {n.node_id: n for n in engine.node_executions(ex.run_id)}
    assert {k: r.status for k, r in rows.items()} == dict.fromkeys(
        ["merge", "part0", "part1", "part2", "split"], "completed"
    )
    # The consumer started only after every producer's checked result was durable.
    assert all(
        rows[p].completed_at_us is not None
        and rows[p].completed_at_us <= rows["merge"].started_at_us
        for p in ("part0", "part1", "part2")
    )
    assert engine.run(ex.run_id).status is RunStatus.COMPLETED


@pytest.mark.parametrize(
    ("edges", "words"),
    [
        ({"a": ["b"], "b": ["a"]}, "cycle"),
        ({"a": ["a"]}, "cycle"),
        ({"a": [], "b": ["nowhere"]}, "unknown node"),
        ({"a/../b": []}, "not allowed"),
    ],
)
def test_N1_cycles_unknown_dependencies_and_bad_ids_are_refused_before_anything_runs(
    engine: charter.Engine, mission: str, edges: dict[str, list[str]], words: str
) -> None:
    ran: list[str] = []

    def make(name: str) -> charter.Node:
        return charter.node(name=name)(lambda ctx, value: ran.append(name))

    before = stored(engine, mission)
    with pytest.raises(charter.PlanError, match=words):
        charter.Plan.graph("bad", {make(n): deps for n, deps in edges.items()})
    assert ran == []
    assert stored(engine, mission) == before


def test_N1_duplicate_node_ids_are_refused_with_their_names() -> None:
    a1 = charter.node(name="a")(lambda ctx, value: 1)
    a2 = charter.node(name="a")(lambda ctx, value: 2)
    with pytest.raises(charter.PlanError, match=r"duplicate node names \['a'\]"):
        charter.Plan.graph("dup", {a1: [], a2: []})
    with pytest.raises(charter.PlanError, match="duplicate"):
        charter.Plan("dup", (a1, a2))


def test_N1_a_failing_check_in_a_fan_out_fails_the_run_and_the_consumer_never_starts(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    started: list[str] = []

    @charter.node
    def root(ctx: charter.Context, value: Any) -> int:
        return 1

    @charter.node(check=lambda r: r > 100, retries=1)
    def weak(ctx: charter.Context, value: int) -> int:
        return value

    @charter.node
    def strong(ctx: charter.Context, value: int) -> int:
        ctx.attempt(adapter, "write", {"strong": value})
        return value + 1

    @charter.node
    def join(ctx: charter.Context, value: Any) -> Any:
        started.append("join")
        return value

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    plan = charter.Plan.graph(
        "checked", {root: [], weak: [root], strong: [root], join: [weak, strong]}
    )
    with pytest.raises(Exception, match="failed its check"):
        ex.execute(plan)

    assert started == []
    assert states(engine, ex.run_id) == {
        "root": ["completed"],
        "weak": ["failed", "failed"],
        "strong": ["completed"],
    }
    failed = [n for n in engine.node_executions(ex.run_id) if n.node_id == "weak"]
    assert all(n.result_hash is None for n in failed)
    assert engine.run(ex.run_id).status is RunStatus.FAILED


def test_N1_a_sequence_plan_is_the_chain_of_its_nodes(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    @charter.node
    def first(ctx: charter.Context, value: int) -> int:
        return value + 1

    @charter.node
    def second(ctx: charter.Context, value: int) -> int:
        return value * 10

    plan = charter.Plan("seq", (first, second))
    assert plan.shape.deps == {"first": (), "second": ("first",)}
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(plan, 4) == 50


# -- N3: plan changes at run time ---------------------------------------------------------


def _planner(adapter: RecordingAdapter, steps: list[charter.Step]) -> charter.Plan:
    @charter.node
    def plan_reviews(ctx: charter.Context, value: Any) -> int:
        return ctx.extend(*steps)

    @charter.node
    def review(ctx: charter.Context, value: Any) -> dict[str, Any]:
        ctx.attempt(adapter, "write", {"review": value["region"]})
        return {"reviewed": value["region"]}

    @charter.node
    def summary(ctx: charter.Context, value: dict[str, Any]) -> list[str]:
        return sorted(v["reviewed"] for v in value.values())

    return charter.Plan("reviews", (plan_reviews,), functions=(review, summary))


REVIEWS = [
    charter.Step("review-n", "review", after=("plan_reviews",), input={"region": "north"}),
    charter.Step("review-s", "review", after=("plan_reviews",), input={"region": "south"}),
    charter.Step("summary", "summary", after=("review-n", "review-s")),
]


def test_N3_a_running_node_extends_the_plan_as_a_new_audited_version(
    engine: charter.Engine, mission: str, who: Principals, adapter: RecordingAdapter
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    assert ex.execute(_planner(adapter, REVIEWS)) == ["north", "south"]

    assert sorted(s.request["review"] for s in adapter.sent) == ["north", "south"]
    assert set(states(engine, ex.run_id)) == {"plan_reviews", "review-n", "review-s", "summary"}
    (v,) = engine.plan_versions(ex.run_id)
    assert (v["version"], v["node_id"], [s["id"] for s in v["steps"]]) == (
        2,
        "plan_reviews",
        ["review-n", "review-s", "summary"],
    )
    (event,) = [e for e in engine.audit_events(mission) if e["kind"] == "plan.versioned"]
    assert (event["before"], event["after"]) == ("1", "2")
    assert engine.verify_audit(mission)[0].ok


@pytest.mark.parametrize(
    ("steps", "words"),
    [
        ([charter.Step("x", "review", after=("nowhere",))], "unknown node"),
        ([charter.Step("plan_reviews", "review")], "already has a node"),
        ([charter.Step("x", "rm_rf")], "offers no node function"),
    ],
)
def test_N3_a_bad_plan_change_is_refused_and_records_nothing(
    engine: charter.Engine,
    mission: str,
    who: Principals,
    adapter: RecordingAdapter,
    steps: list[charter.Step],
    words: str,
) -> None:
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked, match=words) as blocked:
        ex.execute(_planner(adapter, steps))
    # A bad change is the node's bug, not its declared failure: the run waits for
    # the fixed code (N6).
    assert isinstance(blocked.value.__cause__, charter.PlanError)
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION
    assert engine.plan_versions(ex.run_id) == []
    assert "plan.versioned" not in [e["kind"] for e in engine.audit_events(mission)]
    assert adapter.sent == []
