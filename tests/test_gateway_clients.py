"""G1, G2: agent frameworks' own MCP clients through `charter gateway`, unchanged.

The OpenAI Agents SDK and PydanticAI, each over stdio and over streamable
HTTP, with their models on the loopback fake provider: the model asks for
``payments.pay``, the gateway admits it and sends it once, the agent is told
what the upstream answered. Checked against the sandbox's records (what was
paid, with which key), the store (the attempt, the ledger) and what the model
was sent (the tools it was offered, the tool's answer).
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

import charter
from _fake_models import FakeProvider
from _gateway_agents import FRAMEWORKS, OPENAI_NAME, PAYMENT, TOOL, offered
from _gateway_world import world


@pytest.mark.parametrize("transport", ["stdio", "http"])
@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_G1_G2_an_agent_frameworks_mcp_client_pays_once_through_the_gateway(
    tmp_path: Path, store_address: str, framework: str, transport: str
) -> None:
    """Broken G1/G2: a framework's MCP client cannot list or call the gateway's
    tools, or its call is not one keyed attempt held and settled at its cost,
    or the agent is not told what the upstream answered."""
    agent, turns = FRAMEWORKS[framework]
    with world(tmp_path, store_address) as w, FakeProvider(**turns) as fake:
        if transport == "http":
            w.start()
        final = asyncio.run(agent(w, fake, transport, rename=True))

        [payment] = w.payments()
        assert final == f"paid {payment['id']}"  # the model was shown the upstream's answer
        first, second = offered(fake)  # two turns, each offered names OpenAI's API accepts
        assert first == second and len(first) == 2
        assert all(OPENAI_NAME.match(n) for n in first), first
        [attempt] = w.engine.attempts(mission_id=w.mission)
        assert (attempt.scope, attempt.principal) == (TOOL, "agent")
        assert attempt.status is charter.AttemptStatus.SUCCEEDED
        assert payment["idempotency_key"] == attempt.idempotency_key
        assert (payment["amount"], payment["reference"]) == (PAYMENT["amount"], "a-1")
        assert attempt.actual == {"usd_cents": PAYMENT["amount"]}
        usd = w.engine.balances(w.mission)["usd_cents"]
        assert (usd.spent, usd.held) == (PAYMENT["amount"], 0)
        assert [r.status for r in w.engine.runs(w.mission)] == [charter.RunStatus.COMPLETED]
        assert w.engine.check_ledger(w.mission) == []


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_G1_without_renaming_a_framework_offers_the_model_the_gateways_dotted_names(
    tmp_path: Path, store_address: str, framework: str
) -> None:
    """What the renaming above is for: left as they are, both frameworks offer
    the model the gateway's names, dot included, which OpenAI's API refuses
    (a 400 on the first model request); the fake accepts them, and the call
    goes through as above."""
    agent, turns = FRAMEWORKS[framework]
    with world(tmp_path, store_address) as w, FakeProvider(**turns) as fake:
        w.start()
        final: Any = asyncio.run(agent(w, fake, "http", rename=False))
        [payment] = w.payments()
        assert final == f"paid {payment['id']}"
        assert offered(fake)[0] == ["payments.get_payment", TOOL]
        assert not any(OPENAI_NAME.match(n) for n in offered(fake)[0])
        [attempt] = w.engine.attempts(mission_id=w.mission)
        assert payment["idempotency_key"] == attempt.idempotency_key


@pytest.mark.parametrize("framework", sorted(FRAMEWORKS))
def test_G1_with_the_separator_a_model_takes_both_frameworks_work_through_unchanged(
    tmp_path: Path, store_address: str, framework: str
) -> None:
    """Broken G1: a gateway whose file names tools ``upstream__tool``
    (``separator = "__"``) offers a name OpenAI's API refuses, or cannot map
    the call back to its upstream and scope; no renaming in the framework."""
    agent, turns = FRAMEWORKS[framework]
    with (
        world(tmp_path, store_address, gateway={"separator": "__"}) as w,
        FakeProvider(**turns) as fake,
    ):
        w.start()
        final: Any = asyncio.run(agent(w, fake, "http", rename=False))
        [payment] = w.payments()
        assert final == f"paid {payment['id']}"
        assert offered(fake)[0] == ["payments__get_payment", "payments__pay"]
        assert all(OPENAI_NAME.match(n) for n in offered(fake)[0])
        [attempt] = w.engine.attempts(mission_id=w.mission)
        assert attempt.scope == TOOL and payment["idempotency_key"] == attempt.idempotency_key
        assert w.engine.balances(w.mission)["usd_cents"].spent == PAYMENT["amount"]
