"""OpenTelemetry spans and counters for runs, nodes and attempts.

The example agent (examples/openai_agents_agent.py: three model calls, an
invoice lookup and a payment through the sandbox) runs under an engine whose
observer is :class:`OtelObserver`, with the SDK's in-memory span exporter and
metric reader. Checked: the spans, their parents, their attributes (the GenAI
conventions' on model calls) and the counters, against what the provider
billed and the sandbox took.
"""

from __future__ import annotations

import importlib
import signal
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import charter
from _agent_turns import clerk_turns
from _examples import agent_world, run_step
from _fake_models import INVOICE, FakeProvider, pay_invoice_script
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing
from charter.integrations import otel
from charter.integrations.openai_agents import AgentModels
from charter.sandbox import Sandbox
from conftest import Principals

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
sys.path.insert(0, str(EXAMPLES))
import openai_agents_agent as example  # noqa: E402 - the example, once examples/ is on the path
import pydantic_ai_agent as pydantic_example  # noqa: E402


class Telemetry:
    """An OpenTelemetry SDK set-up that keeps what it was given, in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        tracing = TracerProvider()
        tracing.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.observer = otel.OtelObserver(tracing, MeterProvider(metric_readers=[self.reader]))

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def counters(self) -> dict[str, dict[tuple[tuple[str, Any], ...], int]]:
        """Each counter's value by its attributes."""
        out: dict[str, dict[tuple[tuple[str, Any], ...], int]] = {}
        data = self.reader.get_metrics_data()
        assert data is not None
        for resource in data.resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    points = out.setdefault(metric.name, {})
                    for point in metric.data.data_points:
                        attrs = tuple(sorted((point.attributes or {}).items()))
                        points[attrs] = int(point.value)  # type: ignore[union-attr]
        return out


def at(scope: str, **attrs: str) -> tuple[tuple[str, Any], ...]:
    """A counter's attributes, as :meth:`Telemetry.counters` keys them."""
    named = {otel.ATTEMPT_SCOPE: scope, **{f"charter.attempt.{k}": v for k, v in attrs.items()}}
    if "unit" in attrs:
        named[otel.UNIT] = named.pop("charter.attempt.unit")
    return tuple(sorted(named.items()))


@pytest.fixture
def telemetry() -> Telemetry:
    return Telemetry()


@pytest.fixture
def observed(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]], telemetry: Telemetry
) -> Iterator[tuple[charter.Engine, Principals]]:
    config = charter.EngineConfig(credentials=creds[1])
    with charter.Engine.open(store_address, config=config, observer=telemetry.observer) as eng:
        yield eng, Principals(creds[0], creds[1], eng)


def mission(engine: charter.Engine, who: Principals, **changes: Any) -> str:
    principals = {
        "agent": {"run": ["agent-models.*", "tools.*"]},
        "alice": ["approve", "resolve", "run"],
    }
    return engine.create_mission(
        {**example.CONTRACT, "principals": principals, **changes}, by=who.alice
    )


def test_a_run_is_a_span_its_nodes_children_and_their_attempts_grandchildren(
    observed: tuple[charter.Engine, Principals],
    telemetry: Telemetry,
    provider: FakeProvider,
    box: Sandbox,
) -> None:
    engine, who = observed
    m = mission(engine, who)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")
    assert ex.execute(example.build_plan(provider.url + "/v1", box.url)) == "Paid inv-7."

    spans = telemetry.finished()
    [run] = [s for s in spans if s.name == "charter.run"]
    [node] = [s for s in spans if s.name == "charter.node"]
    attempts = [s for s in spans if s not in (run, node)]
    assert run.parent is None
    assert dict(run.attributes or {}) == {
        otel.RUN_ID: ex.run_id,
        otel.MISSION_ID: m,
        otel.SEGMENT_ID: "seg-1",
        otel.EPOCH: 1,
        "charter.plan": "pay-invoice",
        otel.STATUS: "completed",
    }
    assert node.parent is not None and node.parent.span_id == run.context.span_id
    assert (node.attributes or {})[otel.NODE_ID] == "pay_invoice"
    assert {s.parent.span_id for s in attempts if s.parent} == {node.context.span_id}
    assert sorted(s.name for s in attempts) == [
        "chat gpt-4o-mini",
        "chat gpt-4o-mini",
        "chat gpt-4o-mini",
        "tools.invoice",
        "tools.pay",
    ]
    recorded = {a.id: a for a in engine.attempts(run_id=ex.run_id)}
    for span in attempts:
        attrs = dict(span.attributes or {})
        attempt = recorded[str(attrs[otel.ATTEMPT_ID])]
        assert attrs[otel.STATUS] == "succeeded"
        assert span.start_time == attempt.prepared_at_us * 1000
        assert span.end_time == (attempt.settled_at_us or 0) * 1000
        if span.name.startswith("chat"):
            assert {k: v for k, v in attrs.items() if k.startswith("gen_ai.")} == {
                otel.GEN_AI_OPERATION_NAME: "chat",
                otel.GEN_AI_PROVIDER_NAME: "openai",
                otel.GEN_AI_REQUEST_MODEL: "gpt-4o-mini",
                otel.GEN_AI_REQUEST_MAX_TOKENS: 200,
                otel.GEN_AI_RESPONSE_MODEL: "gpt-4o-mini",
                otel.GEN_AI_RESPONSE_ID: "resp_1",
                otel.GEN_AI_USAGE_INPUT_TOKENS: 12,
                otel.GEN_AI_USAGE_OUTPUT_TOKENS: 7,
            }
            assert attrs["charter.cost.usd"] == (attempt.actual or {})["usd"]
        else:
            assert not any(k.startswith("gen_ai.") for k in attrs)

    counters = telemetry.counters()
    models, pay = "agent-models.responses", "tools.pay"
    assert counters["charter.attempts"] == {
        at(models, effect_class="read_only"): 3,
        at("tools.invoice", effect_class="read_only"): 1,
        at(pay, effect_class="idempotent_keyed"): 1,
    }
    pricing = Pricing("openai", ModelUnits())
    billed = sum(pricing.amounts(Usage(**b))["usd"] for b in provider.billed.values())
    spend = counters["charter.spend"]
    assert spend[at(models, unit="usd")] == billed
    assert spend[at(pay, unit="usd")] == INVOICE["amount"]
    assert spend[at(models, unit="input_tokens")] == 3 * 12
    assert sum(v for k, v in spend.items() if (otel.UNIT, "usd") in k) == (
        engine.balances(m)["usd"].spent
    )
    holds = counters["charter.holds"]
    estimates = sum(a.estimate.get("usd", 0) for a in recorded.values())
    assert sum(v for k, v in holds.items() if (otel.UNIT, "usd") in k) == estimates
    assert holds[at(pay, unit="usd")] == INVOICE["amount"]


def test_a_blocked_node_ends_its_spans_and_the_resumed_one_reports_the_settlement(
    observed: tuple[charter.Engine, Principals],
    telemetry: Telemetry,
    provider: FakeProvider,
    box: Sandbox,
) -> None:
    engine, who = observed
    m = mission(engine, who, approvals={"required": ["tools.pay"], "ttl_seconds": 3600})
    plan = example.build_plan(provider.url + "/v1", box.url)
    ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")
    with pytest.raises(charter.Blocked):
        ex.execute(plan)
    first = telemetry.finished()
    assert {(s.name, (s.attributes or {})[otel.STATUS]) for s in first} == {
        ("charter.run", "blocked"),
        ("charter.node", "blocked"),
        ("chat gpt-4o-mini", "succeeded"),
        ("tools.invoice", "succeeded"),
        ("tools.pay", "prepared"),  # admitted, its hold kept while it waits
    }
    [approval] = engine.approvals(run_id=ex.run_id, pending=True)
    engine.approve(approval.id, by=who.alice)
    telemetry.spans.clear()

    assert engine.coordinator.resume(ex.run_id, "seg-1", by=who.agent).execute(plan)
    again = [s for s in telemetry.finished() if s.name not in ("charter.run", "charter.node")]
    # the replayed calls are not reported again: the payment settled, one model call made
    assert sorted((s.name, (s.attributes or {})[otel.STATUS]) for s in again) == [
        ("chat gpt-4o-mini", "succeeded"),
        ("tools.pay", "succeeded"),
    ]
    counted = telemetry.counters()["charter.attempts"]
    assert counted[at("tools.pay", effect_class="idempotent_keyed")] == 1


def test_an_observer_that_fails_changes_nothing(
    store_address: str, creds: tuple[dict[str, str], dict[str, str]], box: Sandbox
) -> None:
    class Broken(charter.Observer):
        def __getattribute__(self, name: str) -> Any:
            raise RuntimeError("telemetry is down")

    config = charter.EngineConfig(credentials=creds[1])
    with charter.Engine.open(store_address, config=config, observer=Broken()) as engine:
        who = Principals(creds[0], creds[1], engine)
        with FakeProvider(script=pay_invoice_script) as provider:
            m = mission(engine, who)
            ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")
            assert ex.execute(example.build_plan(provider.url + "/v1", box.url)) == "Paid inv-7."
        assert engine.run(ex.run_id).status is charter.RunStatus.COMPLETED
        assert len(box.payments()) == 1


def test_otel_without_its_extra_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    monkeypatch.delitem(sys.modules, "charter.integrations.otel")
    with pytest.raises(charter.MissingExtra) as missing:
        importlib.import_module("charter.integrations.otel")
    assert missing.value.details["extra"] == "otel"
    assert "charter[otel]" in missing.value.message


@pytest.mark.parametrize("settled_by", ["confirm", "resolve"])
def test_settlements_made_outside_a_run_are_observed_and_agree_with_the_ledger(
    observed: tuple[charter.Engine, Principals], telemetry: Telemetry, box: Sandbox, settled_by: str
) -> None:
    """The first model call's answer is lost after it was billed: UNKNOWN. It
    is settled outside any run, on its usage lookup confirmed by a person, or
    written off by one, and the run resumes. The spend counters and each
    attempt's last span say what the ledger says."""
    engine, who = observed
    with FakeProvider(script=pay_invoice_script, faults=["500_after_billing"]) as provider:
        m = mission(engine, who)
        plan = example.build_plan(provider.url + "/v1", box.url)
        ex = engine.start_run(m, by=who.agent, segment_id="seg-1", input="gazette")
        with pytest.raises(charter.Blocked):
            ex.execute(plan)
        [lost] = engine.attempts(run_id=ex.run_id)
        models = AgentModels(base_url=provider.url + "/v1", api_key="sk-test")
        if settled_by == "confirm":
            models.lookup = provider.lookup
            assert engine.coordinator.reconcile(lost.id, models, by=who.alice).conclusive
            engine.coordinator.confirm(lost.id, by=who.alice)
        else:
            engine.coordinator.resolve(
                lost.id, by=who.alice, outcome="written_off", evidence="billed, answer lost"
            )
        # told at once, before any run goes on
        spend = telemetry.counters()["charter.spend"]
        assert (
            spend[at("agent-models.responses", unit="usd")]
            == engine.get_attempt(lost.id).actual["usd"]
        )
        resumed = engine.coordinator.resume(ex.run_id, "seg-1", by=who.alice)
        assert resumed.execute(plan) == "Paid inv-7."

    balances = engine.balances(m)
    spend = telemetry.counters()["charter.spend"]
    for unit, balance in balances.items():
        told = sum(v for k, v in spend.items() if (otel.UNIT, unit) in k)
        assert told == balance.spent, unit
    last: dict[str, ReadableSpan] = {}
    for span in sorted(telemetry.finished(), key=lambda s: s.end_time or 0):
        if otel.ATTEMPT_ID in (span.attributes or {}):
            last[str((span.attributes or {})[otel.ATTEMPT_ID])] = span
    recorded = engine.attempts(run_id=ex.run_id)
    assert set(last) == {a.id for a in recorded}
    for attempt in recorded:
        attrs = dict(last[attempt.id].attributes or {})
        assert attrs[otel.STATUS] == attempt.status.value
        costs = {k.removeprefix("charter.cost."): v for k, v in attrs.items() if "cost." in k}
        assert costs == (attempt.actual or {})
        assert last[attempt.id].end_time == (attempt.settled_at_us or 0) * 1000
    # the settlement joins the trace of the node that made the call, linked to its first span
    [first] = [
        s for s in telemetry.finished() if (s.attributes or {}).get(otel.ATTEMPT_ID) == lost.id
    ][:1]
    settled = last[lost.id]
    assert settled is not first and settled.parent is not None and first.parent is not None
    assert settled.parent.span_id == first.parent.span_id
    assert [link.context.span_id for link in settled.links] == [first.context.span_id]


@pytest.mark.crash
def test_a_read_only_call_recovery_writes_off_is_observed_as_settled(
    store_address: str, tmp_path: Path, telemetry: Telemetry
) -> None:
    """Under A7's opt-in, recovery writes off the model request a dead process
    left behind (outside any run): the observer is told, at its full hold."""
    contract = {**pydantic_example.CONTRACT, "read_only_unknown": "write_off"}
    with agent_world(store_address, tmp_path, contract, clerk_turns) as world:
        example_file = EXAMPLES / "pydantic_ai_agent.py"
        code, out = run_step(example_file, world.cfg, tmp_path, kill_at="settlement.before", nth=1)
        assert code == -signal.SIGKILL
        [lost] = world.engine.attempts(run_id=out[0]["run_id"])
        config = charter.EngineConfig(credentials=world.cfg["digests"])
        with charter.Engine.open(store_address, config=config, observer=telemetry.observer) as eng:
            eng.coordinator.recover(lost.run_id, "seg-2")
            written = eng.get_attempt(lost.id)
    assert written.status is charter.AttemptStatus.WRITTEN_OFF
    [span] = telemetry.finished()
    assert (span.attributes or {})[otel.STATUS] == "written_off"
    assert span.end_time == (written.settled_at_us or 0) * 1000
    spend = telemetry.counters()["charter.spend"]
    assert {dict(k)[otel.UNIT]: v for k, v in spend.items()} == written.actual == lost.estimate
