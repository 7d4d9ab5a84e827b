"""The adapter conformance kit, run on the built-in adapters (A3, A10, S3).

``check_adapter`` drives an adapter through a real engine against a scripted
target. Every built-in HTTP adapter passes it here: against the scripted JSON
API (whose lookups answer lists) and against the payments sandbox. An adapter
with the old, per-adapter readings (any 200 lookup proves application, an
error answer is a failure) fails it, naming the cases: the kit asserts.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar

import anyio
import pytest
from mcp import Client
from mcp.server.mcpserver import Context, MCPServer

import charter
from _fake_models import FakeProvider
from charter.adapters.http import HttpAdapter
from charter.adapters.models import Usage
from charter.adapters.models.anthropic import AnthropicModels
from charter.adapters.models.openai import OpenAIModels
from charter.attempts.classify import error_answer
from charter.conformance import CASES, ECHO_CASES, LOOKUP_CASES, TEXT_CASES, check_adapter
from charter.conformance.http_target import ScriptedHttp
from charter.integrations.mcp import KEY_META, McpTools
from charter.sandbox import Sandbox, declaration
from charter.testing import RecordingAdapter

REQUEST = {"amount": 5_00, "currency": "usd", "payee": "acme", "reference": "inv-1"}


@pytest.fixture
def target() -> Iterator[ScriptedHttp]:
    with ScriptedHttp() as scripted:
        yield scripted


def test_A3_A10_S3_the_http_adapter_passes_every_case_against_a_list_shaped_lookup(
    target: ScriptedHttp,
) -> None:
    with target.declaration().build() as adapter:
        report = check_adapter(adapter, target, operation="create", request=REQUEST)
    assert report.not_played == []
    assert {r.case for r in report.results} == set(CASES)
    # What the target saw: each effect applied at most once, the lost ones included.
    assert max(target.applies.values()) == 1


class _OldReadings(HttpAdapter):
    """The HTTP adapter as it read answers before the one rule: any 200 lookup is
    the effect applied, at its estimate; a 500 is a failure."""

    def reconcile(self, attempt: charter.RecordedAttempt) -> charter.Evidence:
        path = f"/v1/things?key={attempt.idempotency_key}"
        response = self._client.get(path, headers=self._headers())
        if response.status_code == 200:
            found = charter.Outcome.succeeded(response.text, cost=dict(attempt.estimate))
            return charter.Evidence.applied(found)
        return charter.Evidence.indeterminate()

    def dispatch(self, send: charter.Dispatch) -> charter.Outcome:
        try:
            return super().dispatch(send)
        except Exception as exc:
            if "HTTP 500" in str(exc):
                return charter.Outcome.failed({"error": str(exc)})
            raise


def test_A3_the_kit_fails_an_adapter_that_reads_answers_the_old_way(
    target: ScriptedHttp,
) -> None:
    adapter = _OldReadings(target.declaration())
    with pytest.raises(AssertionError) as broken:
        check_adapter(adapter, target, operation="create", request=REQUEST)
    adapter.close()
    text = str(broken.value)
    for case in ("error_after_applying", "lookup_empty", "lookup_list", "lookup_malformed"):
        assert f"{case}:" in text
    assert "lookup_found:" not in text  # what is right stays right
    assert "refused_before_applying:" not in text


class SandboxTarget:
    """The payments sandbox as a scripted target, through its own faults."""

    FAULTS: ClassVar[dict[str, str]] = {
        "applied_then_lost": "drop_after_apply",
        "error_after_applying": "error_after_apply",
        "refused_before_applying": "refuse",
        "timeout": "slow",
        "lookup_down": "lookups_unavailable",
    }

    def __init__(self, box: Sandbox, api_key: str) -> None:
        self.box, self.secret = box, api_key

    def arm(self, case: str) -> bool:
        if case in ("lookup_found", "nul_in_request", "surrogate_in_request"):
            return True  # it behaves as it always does
        fault = self.FAULTS.get(case)
        if fault is None:
            return False  # it cannot echo, answer 50 MB or answer a list to a key lookup
        self.box.fault(fault, seconds=1.5 if fault == "slow" else 0.0)
        return True

    def applied(self, key: str) -> int:
        return sum(p["idempotency_key"] == key for p in self.box.payments())

    def received(self, key: str) -> int:
        """The creates logged with ``key``; one it applied was received even before
        its answer (a slow one) is logged."""
        logged = sum(
            r["kind"] == "create" and r["idempotency_key"] == key for r in self.box.requests()
        )
        return max(logged, self.applied(key))


def test_A3_the_sandbox_adapter_passes_every_case_the_sandbox_can_play(tmp_path: Path) -> None:
    key = "sk-sandbox-conformance-0123456789"
    with Sandbox(tmp_path / "box.db", api_key=key) as box:
        adapter = declaration(box.url, timeout_seconds=0.5, api_key=key).build()
        target = SandboxTarget(box, key)
        report = check_adapter(adapter, target, operation="pay", request=REQUEST)
        adapter.close()
    assert set(report.not_played) == {
        "lookup_empty",
        "lookup_list",
        "lookup_malformed",
        "lookup_other",
        "lookup_several",
        "lookup_refused",
        "lookup_reset",
        "lookup_timeout",
        "echo_in_header",
        "echo_in_body",
        "echo_in_exception",
        "echo_in_bytes",
        "huge_answer",
    }


def test_the_kit_refuses_an_unknown_case_or_operation(target: ScriptedHttp) -> None:
    adapter: Any = RecordingAdapter()
    with pytest.raises(ValueError, match="unknown case"):
        check_adapter(adapter, target, operation="write", request=REQUEST, cases=("nope",))
    with pytest.raises(ValueError, match="no operation"):
        check_adapter(adapter, target, operation="nope", request=REQUEST)


def test_A3_an_error_answer_is_unknown_unless_the_effect_is_read_only() -> None:
    """The one rule, on its own: FAILED only where nothing outside can have changed."""
    answer = {"error": "boom"}
    read = charter.Operation(charter.EffectClass.READ_ONLY)
    assert error_answer(read, answer, reason="x").status == "failed"
    for effect, window in (
        (charter.EffectClass.UNSAFE, None),
        (charter.EffectClass.IDEMPOTENT_KEYED, 60),
    ):
        with pytest.raises(charter.OutcomeUnknown) as unknown:
            error_answer(charter.Operation(effect, window), answer, reason="tool failed")
        assert unknown.value.evidence == {"answer": answer}


# -- the model adapters, against a fake provider speaking each API --------------------------


class ProviderTarget:
    """A fake model provider as a scripted target. A model call's only effect is
    its bill: "applied" is "billed". Its lookup is the usage by key."""

    FAULTS: ClassVar[dict[str, str]] = {
        "applied_then_lost": "drop_after_billing",
        "error_after_applying": "500_after_billing",
        "refused_before_applying": "401_quoting_key",
        "timeout": "slow_after_billing",
        "echo_in_body": "echo_key_after_billing",
        "echo_in_exception": "401_quoting_key",
        "huge_answer": "huge_after_billing",
    }

    def __init__(self, provider: FakeProvider, secret: str) -> None:
        self.provider, self.secret = provider, secret
        self.lookup_case: str | None = None

    #: How the usage lookup fails to answer: whatever it raises proves nothing.
    RAISED: ClassVar[dict[str, type[Exception]]] = {
        "lookup_down": ConnectionError,
        "lookup_refused": ConnectionRefusedError,
        "lookup_reset": ConnectionResetError,
        "lookup_timeout": TimeoutError,
    }

    def arm(self, case: str) -> bool:
        if case in ("lookup_found", "lookup_empty", *self.RAISED):
            self.lookup_case = case
            return True
        if case in ("nul_in_request", "surrogate_in_request"):
            return True
        fault = self.FAULTS.get(case)
        if fault is None:
            return False  # no header echo, and a usage lookup answers no lists
        self.provider.faults.append(fault)
        return True

    def lookup(self, key: str) -> Usage | None:
        case, self.lookup_case = self.lookup_case, None
        if case in self.RAISED:
            raise self.RAISED[case]("the usage API did not answer")
        if case == "lookup_empty":
            return None  # usage is reported late: nothing yet
        return self.provider.lookup(key)

    def applied(self, key: str) -> int:
        return int(key in self.provider.billed)

    def received(self, key: str) -> int:
        return self.provider.keys().count(key)


MODEL_CALLS = {  # the operation, a request, and a text field the provider carries
    "openai": ("responses", {"model": "gpt-4o-mini", "input": "hi", "max_output_tokens": 20}),
    "anthropic": (
        "messages",
        {"model": "claude-sonnet-4-5", "max_tokens": 20, "system": "be brief", "messages": []},
    ),
}


@pytest.mark.parametrize("which", sorted(MODEL_CALLS))
def test_A3_S3_each_model_adapter_passes_every_case_its_provider_can_play(which: str) -> None:
    secret = "sk-model-conformance-8d1f3c5a9e"
    operation, request = MODEL_CALLS[which]
    if which == "anthropic":
        request = {**request, "messages": [{"role": "user", "content": "hi"}]}
    with FakeProvider() as provider:
        target = ProviderTarget(provider, secret)
        make = OpenAIModels if which == "openai" else AnthropicModels
        url = f"{provider.url}/v1" if which == "openai" else provider.url
        adapter = make(base_url=url, api_key=secret, timeout=1.0, lookup=target.lookup)
        report = check_adapter(
            adapter, target, operation=operation, request=request, text_field="model"
        )
    assert set(report.not_played) == {
        "same_key_replay",  # a model call is read_only: nothing is replayed
        "lookup_list",
        "lookup_malformed",
        "lookup_other",
        "lookup_several",
        "echo_in_header",
        "echo_in_bytes",
    }


# -- MCP tools, against the SDK's own server -------------------------------------------------


class ToolTarget:
    """An MCP server's tool as a scripted target: ``create`` applies, then acts
    as the armed case says. MCP has no lookup and no declared refusal, and an
    in-memory session holds no credential to echo."""

    def __init__(self) -> None:
        self.secret = "no-credential-held-by-an-in-memory-session"
        self.case: str | None = None
        self.done: Counter[str] = Counter()
        self.calls: Counter[str] = Counter()
        self.server = MCPServer("things")

        @self.server.tool()
        async def create(amount: int, reference: str, ctx: Context) -> str:
            key = str((ctx.request_context.meta or {}).get(KEY_META))
            self.calls[key] += 1
            self.done[key] += 1
            case, self.case = self.case, None
            if case == "error_after_applying":
                raise RuntimeError("the ledger write timed out after the transfer")
            if case == "timeout":
                await anyio.sleep(2.0)
            if case == "huge_answer":
                return "x" * (50 << 20)
            return f"created {reference} for {amount}"

    def arm(self, case: str) -> bool:
        if case not in ("error_after_applying", "timeout", "huge_answer", *TEXT_CASES):
            return False
        self.case = case
        return True

    def applied(self, key: str) -> int:
        return self.done[key]

    def received(self, key: str) -> int:
        return self.calls[key]


class _CallPerLoop:
    """An MCP session opened for each call: the kit sends from a loop of its own
    each time, and an in-memory client belongs to the loop that opened it."""

    def __init__(self, server: MCPServer) -> None:
        self.server = server

    async def call_tool(self, name: str, arguments: Any, **options: Any) -> Any:
        async with Client(self.server) as client:
            return await client.call_tool(name, arguments, **options)


def test_A3_the_mcp_tools_pass_every_case_a_tool_can_play() -> None:
    target = ToolTarget()

    async def connect() -> McpTools:
        async with Client(target.server) as client:
            return await McpTools.connect(client, name="things", timeout_seconds=1.0)

    tools = asyncio.run(connect())
    tools.session = _CallPerLoop(target.server)
    report = check_adapter(
        tools, target, operation="create", request={"amount": 5, "reference": "inv-1"}
    )
    assert set(report.not_played) == {
        "applied_then_lost",
        "refused_before_applying",
        "same_key_replay",  # the tool is unsafe: nothing is replayed
        *LOOKUP_CASES,
        *ECHO_CASES,
    }
