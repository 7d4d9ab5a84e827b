"""The OpenAI and Anthropic adapters, on the real SDKs, against a loopback fake provider.

Each test names the rule it shows and asserts on what the provider received
and billed and what the store holds.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import genai_prices
import pytest

import charter
from _fake_models import INPUT, OUTPUT, FakeProvider
from charter import AttemptStatus
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.anthropic import AnthropicModels
from charter.adapters.models.openai import OpenAIModels
from charter.adapters.models.pricing import Pricing
from conftest import Principals, default_contract, stored

GPT, CLAUDE = "gpt-4o-mini", "claude-sonnet-4-5"
CALLS = [
    (
        "openai",
        "chat",
        {
            "model": GPT,
            "messages": [{"role": "user", "content": "hi"}],
            "max_completion_tokens": 50,
        },
    ),
    ("openai", "responses", {"model": GPT, "input": "hi", "max_output_tokens": 50}),
    (
        "anthropic",
        "messages",
        {"model": CLAUDE, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 50},
    ),
]


def contract(**allowance: int) -> dict[str, Any]:
    return default_contract(
        principals={
            "agent": {"run": ["openai.*", "anthropic.*"]},
            "alice": ["resolve", "raise_limit", "stop"],
        },
        allowance={"usd": 1_000_000, "input_tokens": 100_000, "output_tokens": 10_000, **allowance},
        units={"usd": {"scale": 6, "name": "USD"}},
    )


@pytest.fixture
def provider() -> Iterator[FakeProvider]:
    with FakeProvider() as fake:
        yield fake


def models(provider: FakeProvider, which: str) -> Any:
    make = OpenAIModels if which == "openai" else AnthropicModels
    return make(
        base_url=f"{provider.url}/v1" if which == "openai" else provider.url,
        api_key="test",
        timeout=5.0,
        lookup=provider.lookup,
    )


def call(
    engine: charter.Engine,
    who: Principals,
    mission: str,
    adapter: Any,
    op: str,
    request: Any,
    key: str = "m",
) -> charter.Attempt:
    ex = engine.start_run(mission, by=who.agent, segment_id=f"seg-{key}")
    return ex.perform(adapter, op, request, effect_key=key)


def priced(model: str, provider: str, input_tokens: int, output_tokens: int) -> int:
    price = genai_prices.calc_price(
        genai_prices.Usage(input_tokens=input_tokens, output_tokens=output_tokens),
        model,
        provider_id=provider,
    ).total_price
    return math.ceil(Decimal(price) * 10**6)


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize(("which", "op", "request_"), CALLS, ids=[c[1] for c in CALLS])
def test_L8_a_model_call_is_priced_from_its_usage_with_the_price_table_version(
    engine: charter.Engine,
    who: Principals,
    provider: FakeProvider,
    which: str,
    op: str,
    request_: dict[str, Any],
    stream: bool,
) -> None:
    mission = engine.create_mission(contract(), by=who.alice)
    attempt = call(
        engine, who, mission, models(provider, which), op, {**request_, "stream": stream}
    )

    assert attempt.status is AttemptStatus.SUCCEEDED
    assert attempt.effect_class == "read_only"
    model = request_["model"]
    cost = priced(model, which, INPUT, OUTPUT)
    assert attempt.actual == {"usd": cost, "input_tokens": INPUT, "output_tokens": OUTPUT}
    assert attempt.estimate["output_tokens"] == 50 and attempt.estimate["usd"] >= cost
    assert attempt.estimate["input_tokens"] >= INPUT
    assert attempt.price_source == f"genai-prices {genai_prices.__version__}: {which}/{model}"
    assert attempt.receipt["usage"]["output_tokens"] == OUTPUT
    assert "hello there" in str(attempt.result)
    balances = engine.balances(mission)
    assert balances["usd"].spent == cost and balances["output_tokens"].spent == OUTPUT
    assert provider.keys() == [attempt.idempotency_key]


@pytest.mark.parametrize(("which", "op", "request_"), CALLS, ids=[c[1] for c in CALLS])
def test_A5_each_call_sends_its_own_key_and_a_500_after_billing_is_sent_once(
    engine: charter.Engine,
    who: Principals,
    provider: FakeProvider,
    which: str,
    op: str,
    request_: dict[str, Any],
) -> None:
    """With the SDK's two default retries, the 500 would be sent three times
    and billed three times; with them off it is one UNKNOWN attempt."""
    mission = engine.create_mission(contract(), by=who.alice)
    adapter = models(provider, which)
    first = call(engine, who, mission, adapter, op, request_, key="a")
    provider.faults.append("500_after_billing")
    second = call(engine, who, mission, adapter, op, request_, key="b")

    assert provider.keys() == [first.idempotency_key, second.idempotency_key]
    assert first.idempotency_key != second.idempotency_key
    assert second.status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)["usd"].held == second.estimate["usd"]  # L4


@pytest.mark.parametrize(("which", "op", "request_"), CALLS, ids=[c[1] for c in CALLS])
def test_A3_a_stream_cut_off_is_unknown_with_its_partial_usage_as_evidence(
    engine: charter.Engine,
    who: Principals,
    provider: FakeProvider,
    which: str,
    op: str,
    request_: dict[str, Any],
) -> None:
    mission = engine.create_mission(contract(), by=who.alice)
    provider.faults.append("cut_stream")
    attempt = call(engine, who, mission, models(provider, which), op, {**request_, "stream": True})

    assert attempt.status is AttemptStatus.UNKNOWN
    assert "cut off" in (attempt.reason or "")
    (kept,) = engine.evidence(attempt.id)
    assert kept["verdict"] == "indeterminate"
    detail = json.loads(kept["detail"])
    assert detail["stream"] == "interrupted"
    if which == "anthropic":  # input counted at message_start, output so far
        assert detail["partial"]["usage"]["input_tokens"] == INPUT
    assert (
        engine.balances(mission)["usd"].held == attempt.estimate["usd"]
    )  # never settled at a guess


@pytest.mark.parametrize(("which", "op", "request_"), CALLS, ids=[c[1] for c in CALLS])
def test_R7_an_answer_lost_after_billing_keeps_its_hold_until_the_usage_lookup_settles_it(
    make_engine: Any,
    who: Principals,
    provider: FakeProvider,
    which: str,
    op: str,
    request_: dict[str, Any],
) -> None:
    engine = make_engine(evidence_settles="auto")
    who = Principals(who.credentials, who.digests, engine)
    mission = engine.create_mission(contract(), by=who.alice)
    provider.faults.append("drop_after_billing")
    adapter = models(provider, which)
    lost = call(engine, who, mission, adapter, op, request_)
    assert lost.status is AttemptStatus.UNKNOWN
    assert engine.balances(mission)["usd"].held == lost.estimate["usd"]

    found = engine.coordinator.reconcile(lost.id, adapter, by=who.alice)

    assert found.verdict == "applied"
    settled = engine.get_attempt(lost.id)
    billed = provider.billed[lost.idempotency_key]
    assert settled.status is AttemptStatus.SUCCEEDED
    assert settled.actual["usd"] == priced(
        request_["model"], which, billed["input_tokens"], billed["output_tokens"]
    )
    assert engine.balances(mission)["usd"].held == 0
    assert len(provider.received) == 1  # reconciled, never re-sent
    assert engine.check_ledger(mission) == []


def test_L9_without_a_usage_lookup_a_lost_answer_is_resolved_by_a_person(
    engine: charter.Engine, who: Principals, provider: FakeProvider
) -> None:
    mission = engine.create_mission(contract(), by=who.alice)
    provider.faults.append("drop_after_billing")
    adapter = AnthropicModels(base_url=provider.url, api_key="test", timeout=5.0)
    _, _, request_ = CALLS[2]
    lost = call(engine, who, mission, adapter, "messages", request_)
    assert engine.coordinator.reconcile(lost.id, adapter, by=who.alice).verdict == "indeterminate"
    assert engine.get_attempt(lost.id).status is AttemptStatus.UNKNOWN

    engine.coordinator.resolve(
        lost.id, by=who.alice, outcome="written_off", evidence="billed; the answer was lost"
    )

    assert engine.get_attempt(lost.id).status is AttemptStatus.WRITTEN_OFF
    assert engine.balances(mission)["usd"].spent == lost.estimate["usd"]


@pytest.mark.parametrize(("which", "op", "request_"), CALLS, ids=[c[1] for c in CALLS])
def test_L3_a_model_request_without_an_output_limit_is_refused_and_changes_nothing(
    engine: charter.Engine,
    who: Principals,
    provider: FakeProvider,
    which: str,
    op: str,
    request_: dict[str, Any],
) -> None:
    mission = engine.create_mission(contract(), by=who.alice)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    before = stored(engine, mission)
    unlimited = {k: v for k, v in request_.items() if not k.startswith("max_")}
    with pytest.raises(charter.AdmissionRefused, match="must set max"):
        ex.perform(models(provider, which), op, unlimited, effect_key="m")
    assert stored(engine, mission) == before
    assert provider.received == []


def test_L7_an_exhausted_token_allowance_refuses_the_call_before_it_is_sent(
    engine: charter.Engine, who: Principals, provider: FakeProvider
) -> None:
    mission = engine.create_mission(contract(output_tokens=40), by=who.alice)
    with pytest.raises(charter.AdmissionRefused):
        call(engine, who, mission, models(provider, "anthropic"), "messages", CALLS[2][2])
    assert provider.received == []


def test_L8_money_is_rounded_up_to_the_units_step() -> None:
    pricing = Pricing("openai", ModelUnits(scale=2, input_tokens=None))
    amounts = pricing.amounts(Usage(GPT, 1, 1))
    assert amounts == {"usd": 1, "output_tokens": 1}  # a fraction of a cent is a cent
