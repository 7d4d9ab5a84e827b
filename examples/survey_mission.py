"""An example mission as a graph: survey regions, merge, wait, publish.

Seven nodes, run by ``tests/test_example_mission.py`` across several processes:

- ``regions`` asks a person how many regions may be surveyed (a human-input
  wait, W1);
- ``plan_surveys`` extends the plan at run time with one ``survey-*`` node per
  region, a ``merge`` after all of them and a ``publish`` after it (N3);
- the ``survey-*`` nodes run concurrently (a fan-out), each paying the survey
  vendor through the payments sandbox (an attempt, A1-A9);
- ``merge`` (the fan-in) writes the report into the run's workspace and saves
  it as an artifact (N2), then waits a cooling-off period (a timer, W1);
- ``publish`` declares the report it uses (put back from the artifact store if
  the workspace lost it) and pays the publisher, a new payee, which needs an
  approval (W2).

Run one step of it as ``python survey_mission.py CONFIG.json`` (the test
writes the configuration): ``start`` a run, or ``resume`` one as a segment; the
step prints one JSON line saying how it ended.

Needs ``pip install 'charter[http]'``: the payments sandbox is an HTTP API.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import charter
from charter.cli.demo import payments_adapter
from charter.testing import kill_at

PRICE = {"north": 12_00, "south": 9_50, "east": 7_25, "west": 8_00}
COOL_OFF_SECONDS = 1.0

CONTRACT = {
    "objective": "Survey regions and publish the report",
    "principals": {
        "agent": {"run": ["payments.*"]},
        "ops": ["approve", "consume", "resolve", "stop", "run"],
    },
    "allowance": {"usd": 100_00},
    "units": {"usd": {"scale": 2, "name": "USD"}},
    "approvals": {"required": ["payments.pay_new_payee"], "ttl_seconds": 3600},
}


def build_plan(url: str) -> charter.Plan:
    payments = payments_adapter(url)

    def pay(ctx: charter.Context, payee: str, amount: int, ref: str, *, new: bool = False) -> Any:
        operation = "pay_new_payee" if new else "pay"
        request = {"amount": amount, "currency": "usd", "payee": payee, "reference": ref}
        return ctx.attempt(payments, operation, request, key=ref)

    @charter.node
    def regions(ctx: charter.Context, _: Any) -> list[str]:
        budget = ctx.ask("budget", "How many regions may we survey?", answer=int)
        return sorted(PRICE)[:budget]

    @charter.node
    def plan_surveys(ctx: charter.Context, names: list[str]) -> int:
        surveys = [
            charter.Step(f"survey-{n}", "survey", after=("plan_surveys",), input=n) for n in names
        ]
        merge = charter.Step("merge", "merge", after=tuple(s.id for s in surveys))
        publish = charter.Step("publish", "publish", after=("merge",))
        return ctx.extend(*surveys, merge, publish)

    @charter.node(name="survey")
    def survey(ctx: charter.Context, region: str) -> dict[str, Any]:
        paid = pay(ctx, "survey-vendor", PRICE[region], f"survey-{region}")
        return {"region": region, "payment": paid["id"]}

    @charter.node(name="merge")
    def merge(ctx: charter.Context, found: dict[str, dict[str, Any]]) -> dict[str, Any]:
        ctx.workspace.mkdir(parents=True, exist_ok=True)
        rows = sorted(found.values(), key=lambda r: str(r["region"]))
        lines = [f"{r['region']}: {r['payment']}" for r in rows]
        (ctx.workspace / "report.txt").write_text("\n".join(lines) + "\n")
        saved = ctx.save("report.txt")
        ctx.sleep("cool-off", COOL_OFF_SECONDS)
        return saved

    @charter.node(name="publish", uses=("report.txt",))
    def publish(ctx: charter.Context, report: dict[str, Any]) -> dict[str, Any]:
        text = (ctx.workspace / "report.txt").read_text()
        paid = pay(ctx, "gazette", 5_00 + len(text), "publish", new=True)
        return {"report": report["sha256"], "payment": paid["id"]}

    return charter.Plan("survey", (regions, plan_surveys), functions=(survey, merge, publish))


def main(argv: list[str]) -> int:
    cfg = json.loads(Path(argv[0]).read_text())
    hook = kill_at(cfg["kill_at"], cfg["nth"]) if cfg.get("kill_at") else None
    config = charter.EngineConfig(
        credentials=cfg["digests"], artifacts=cfg["artifacts"], workspace=cfg["workspace"]
    )
    with charter.Engine.open(cfg["store"], config=config, crash_hook=hook) as engine:
        agent = engine.authenticate(cfg["credential"])
        plan = build_plan(cfg["url"])
        if cfg["step"] == "start":
            ex = engine.start_run(cfg["mission"], by=agent, segment_id="seg-1")
        else:
            ex = engine.coordinator.resume(cfg["run"], cfg["segment"], by=agent)
        print(json.dumps({"run_id": ex.run_id}), flush=True)
        try:
            result = ex.execute(plan)
        except charter.Blocked as blocked:
            print(json.dumps({"ended": "blocked", "reason": blocked.reason}), flush=True)
            return 0
        print(json.dumps({"ended": "completed", "result": result}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
