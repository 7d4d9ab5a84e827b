"""OpenTelemetry for Charter: spans for runs, nodes and attempts, and counters
of attempts, holds and spend.

:class:`OtelObserver` is an engine observer (:mod:`charter.telemetry`). It
needs the ``otel`` extra (``pip install 'charter[otel]'``, the OpenTelemetry
API); the application installs and configures the SDK, or passes its own
providers::

    engine = charter.Engine.open(url, observer=OtelObserver())

Spans: ``charter.run`` for a segment executing a run, a child ``charter.node``
for each node execution, and a child for each attempt it made, timed by the
store's record from admission to settlement (an attempt its node left
unsettled gets a second span when it settles, perhaps outside any run, in the
same trace and linked to the first). A model call's span follows the
GenAI semantic conventions (``chat gpt-4o-mini``, with the operation, the
provider, the model and the tokens); the attribute names are defined here, as
the conventions spell them. While a node runs, its span is the current one,
so spans the node's own code makes are its children.

Counters: ``charter.attempts`` (admitted, by scope and effect class),
``charter.holds`` (what admission held, by unit) and ``charter.spend`` (what
settlement charged, by unit), amounts in each unit's smallest step as the
ledger counts them (micro-dollars for ``usd`` at scale 6).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import Any

from charter import ObservedAttempt, ObservedNode, ObservedRun, Observer
from charter.errors import MissingExtra

try:
    from opentelemetry import context, metrics, trace
except ImportError:  # pragma: no cover - exercised by a test that hides the API
    raise MissingExtra(
        "OpenTelemetry telemetry needs the OpenTelemetry API: pip install 'charter[otel]'",
        extra="otel",
    ) from None

# GenAI semantic conventions (attribute names, as the conventions spell them).
GEN_AI_OPERATION_NAME = "gen_ai.operation.name"
GEN_AI_PROVIDER_NAME = "gen_ai.provider.name"
GEN_AI_REQUEST_MODEL = "gen_ai.request.model"
GEN_AI_REQUEST_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_RESPONSE_MODEL = "gen_ai.response.model"
GEN_AI_RESPONSE_ID = "gen_ai.response.id"
GEN_AI_USAGE_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_USAGE_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
#: Model calls are chat turns, whichever of the providers' APIs made them.
CHAT = "chat"

# Charter's own attributes.
RUN_ID = "charter.run.id"
MISSION_ID = "charter.mission.id"
SEGMENT_ID = "charter.segment.id"
EPOCH = "charter.epoch"
STATUS = "charter.status"
NODE_ID = "charter.node.id"
NODE_EXECUTION = "charter.node.execution"
ATTEMPT_ID = "charter.attempt.id"
ATTEMPT_SCOPE = "charter.attempt.scope"
ATTEMPT_KEY = "charter.attempt.key"
EFFECT_CLASS = "charter.attempt.effect_class"
UNIT = "charter.unit"

_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens")
#: How many attempts left unsettled by their node are remembered, to join
#: their settlement to their trace (the oldest are forgotten first).
HELD_LIMIT = 10_000


class OtelObserver(Observer):
    """Runs, nodes and attempts as OpenTelemetry spans and counters (see the
    module's text); the global providers unless others are given."""

    def __init__(
        self, tracer_provider: Any = None, meter_provider: Any = None, *, name: str = "charter"
    ) -> None:
        self.tracer = trace.get_tracer(name, tracer_provider=tracer_provider)
        meter = metrics.get_meter(name, meter_provider=meter_provider)
        self.attempts = meter.create_counter(
            "charter.attempts", unit="{attempt}", description="attempts admitted"
        )
        self.holds = meter.create_counter(
            "charter.holds", description="amounts held at admission, in the unit's steps"
        )
        self.spend = meter.create_counter(
            "charter.spend", description="amounts charged at settlement, in the unit's steps"
        )
        self._lock = threading.Lock()
        self._runs: dict[str, Any] = {}
        self._nodes: dict[tuple[str, str, int], tuple[Any, Any]] = {}
        self._open: dict[str, Any] = {}
        #: Attempts whose node ended before they settled: (the node's span, the
        #: attempt's first span), so that their settlement, made later and
        #: perhaps outside any run, joins the same trace.
        self._held: dict[str, tuple[Any, Any]] = {}

    def run_started(self, run: ObservedRun) -> None:
        span = self.tracer.start_span(
            "charter.run",
            attributes={
                RUN_ID: run.run_id,
                MISSION_ID: run.mission_id,
                SEGMENT_ID: run.segment_id,
                EPOCH: run.epoch,
                "charter.plan": run.plan,
            },
        )
        with self._lock:
            self._runs[run.run_id] = span

    def run_finished(self, run: ObservedRun, status: str) -> None:
        with self._lock:
            span = self._runs.pop(run.run_id, None)
        if span is not None:
            _end(span, status)

    def node_started(self, node: ObservedNode) -> None:
        with self._lock:
            parent = self._runs.get(node.run_id)
        span = self.tracer.start_span(
            "charter.node",
            context=None if parent is None else trace.set_span_in_context(parent),
            attributes={RUN_ID: node.run_id, NODE_ID: node.node_id, NODE_EXECUTION: node.execution},
        )
        token = context.attach(trace.set_span_in_context(span))
        with self._lock:
            self._nodes[(node.run_id, node.node_id, node.execution)] = (span, token)

    def node_finished(self, node: ObservedNode, status: str) -> None:
        with self._lock:
            span, token = self._nodes.pop((node.run_id, node.node_id, node.execution))
            held = {i: s for i, s in self._open.items() if s.parent_of == node}
            for attempt_id, opened in held.items():  # admitted, not settled: it keeps its hold
                del self._open[attempt_id]
                self._held[attempt_id] = (span.get_span_context(), opened.span.get_span_context())
            while len(self._held) > HELD_LIMIT:  # voided ones never settle
                del self._held[next(iter(self._held))]
        for opened in held.values():
            opened.span.end()
        context.detach(token)
        _end(span, status)

    def attempt_admitted(self, attempt: ObservedAttempt) -> None:
        scope = f"{attempt.adapter}.{attempt.operation}"
        self.attempts.add(1, {ATTEMPT_SCOPE: scope, EFFECT_CLASS: attempt.effect_class})
        for unit, amount in attempt.estimate.items():
            self.holds.add(amount, {UNIT: unit, ATTEMPT_SCOPE: scope})
        opened = self._start(attempt)
        opened.span.set_attribute(STATUS, str(attempt.status))
        with self._lock:
            self._open[attempt.id] = opened

    def attempt_settled(self, attempt: ObservedAttempt) -> None:
        scope = f"{attempt.adapter}.{attempt.operation}"
        for unit, amount in (attempt.actual or {}).items():
            self.spend.add(amount, {UNIT: unit, ATTEMPT_SCOPE: scope})
        with self._lock:
            opened = self._open.pop(attempt.id, None)
        opened = opened or self._start(attempt)
        span = opened.span
        span.set_attribute(STATUS, str(attempt.status))
        for unit, amount in (attempt.actual or {}).items():
            span.set_attribute(f"charter.cost.{unit}", amount)
        _gen_ai_usage(span, attempt)
        if attempt.status != "succeeded":
            span.set_status(trace.StatusCode.ERROR, str(attempt.status))
        end = attempt.settled_at_us
        span.end(end_time=None if end is None else end * 1000)

    def _start(self, attempt: ObservedAttempt) -> _Opened:
        node = ObservedNode(attempt.run_id, attempt.node_id, attempt.execution)
        links = []
        with self._lock:
            parent = self._nodes.get((node.run_id, node.node_id, node.execution))
            parent_span = parent[0] if parent else self._runs.get(attempt.run_id)
            held = self._held.pop(attempt.id, None)
        if held is not None:  # settled after its node ended, perhaps outside any run
            links = [trace.Link(held[1])]
            parent_span = parent_span or trace.NonRecordingSpan(held[0])
        gen_ai = _gen_ai_request(attempt)
        name = f"{CHAT} {gen_ai[GEN_AI_REQUEST_MODEL]}" if gen_ai else _scope(attempt)
        span = self.tracer.start_span(
            name,
            context=None if parent_span is None else trace.set_span_in_context(parent_span),
            kind=trace.SpanKind.CLIENT,
            links=links,
            start_time=attempt.prepared_at_us * 1000,
            attributes={
                ATTEMPT_ID: attempt.id,
                ATTEMPT_SCOPE: _scope(attempt),
                ATTEMPT_KEY: attempt.effect_key,
                EFFECT_CLASS: attempt.effect_class,
                RUN_ID: attempt.run_id,
                NODE_ID: attempt.node_id,
                **{f"charter.estimate.{u}": a for u, a in attempt.estimate.items()},
                **gen_ai,
            },
        )
        return _Opened(span, node)


class _Opened:
    """An attempt's span, open until the attempt settles or its node ends."""

    def __init__(self, span: Any, parent_of: ObservedNode) -> None:
        self.span, self.parent_of = span, parent_of


def _scope(attempt: ObservedAttempt) -> str:
    return f"{attempt.adapter}.{attempt.operation}"


def _end(span: Any, status: str) -> None:
    span.set_attribute(STATUS, status)
    if status == "failed":
        span.set_status(trace.StatusCode.ERROR, status)
    span.end()


def _gen_ai_request(attempt: ObservedAttempt) -> dict[str, Any]:
    """A model call's request attributes; ``{}`` for an attempt that is not one.

    A model call is one priced by genai-prices, whose price source names the
    provider and the model (``genai-prices 0.2: openai/gpt-4o-mini``)."""
    source = attempt.price_source or ""
    request = attempt.request
    if not source.startswith("genai-prices ") or not isinstance(request, Mapping):
        return {}
    provider = source.partition(": ")[2].partition("/")[0]
    found = {
        GEN_AI_OPERATION_NAME: CHAT,
        GEN_AI_PROVIDER_NAME: provider,
        GEN_AI_REQUEST_MODEL: str(request.get("model", "")),
    }
    limits = [request[k] for k in _LIMITS if isinstance(request.get(k), int)]
    if limits:
        found[GEN_AI_REQUEST_MAX_TOKENS] = limits[0]
    return found


def _gen_ai_usage(span: Any, attempt: ObservedAttempt) -> None:
    """A settled model call's response attributes: its model, ID and tokens."""
    receipt = attempt.receipt
    if not _gen_ai_request(attempt) or not isinstance(receipt, Mapping):
        return
    usage = receipt.get("usage")
    if isinstance(usage, Mapping):
        span.set_attribute(GEN_AI_USAGE_INPUT_TOKENS, int(usage.get("input_tokens") or 0))
        span.set_attribute(GEN_AI_USAGE_OUTPUT_TOKENS, int(usage.get("output_tokens") or 0))
        if usage.get("model"):
            span.set_attribute(GEN_AI_RESPONSE_MODEL, str(usage["model"]))
    if receipt.get("id"):
        span.set_attribute(GEN_AI_RESPONSE_ID, str(receipt["id"]))
