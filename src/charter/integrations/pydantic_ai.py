"""PydanticAI agents on Charter: every model request and tool call an attempt.

:class:`CharterDurability` is a PydanticAI durability capability, built on
PydanticAI's public durable-execution builder (``BaseDurabilityCapability``
and a ``DurableOperationBackend``). Attach it to an ``Agent``; an agent run
started inside :func:`in_node` (in an async Charter node) is then durable on
that node's context, and outside one the agent runs as it would without it:

- a **model request** is a ``read_only`` attempt, ``<name>.model_request``,
  priced as the model adapters price (:mod:`charter.adapters.models`): the
  estimate an upper bound (the request's size plus ``max_tokens`` at the
  output price, which the agent's model settings must set), the cost its
  usage, in money and token units; it is sent once (``max_retries=0``) with
  the attempt's key as its ``Idempotency-Key`` header;
- a **tool call** is an attempt ``<name>.<tool>`` of the effect class its
  :class:`ToolEffect` declares (``unsafe`` if none), keyed by the model's
  tool-call id; inside it, :func:`current_send` gives the tool the key and
  fencing token to send its target. An error PydanticAI hands the model
  (``ModelRetry``, ``ToolFailed``) settles a ``read_only`` tool's call FAILED
  and leaves any other tool's call UNKNOWN (A3, :mod:`charter.attempts.classify`);
- the request recorded is built from an allow-list of the fields that define
  the call (:mod:`charter.integrations.pydantic_ai_calls`), so the same conversation records the
  same request whenever it is made, and a node run again after a crash finds
  its attempts: recorded results come back without the model or the tool
  being called again, and an allowance, an approval or a stop condition of
  the contract applies to every call as to any attempt.

Needs the ``pydantic-ai`` extra (``pip install 'charter[pydantic-ai]'``)::

    durability = CharterDurability(tools={"pay": ToolEffect(EffectClass.UNSAFE)})
    agent = Agent(model, name="clerk", capabilities=[durability])

    @charter.node
    async def ask(ctx: charter.Context, question: str) -> str:
        with in_node(ctx):
            return (await agent.run(question)).output
"""

from __future__ import annotations

import copy
import dataclasses
import json
from collections.abc import Awaitable, Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, ClassVar

from charter import AttemptFailed, Context, Estimate
from charter.adapters import Dispatch, EffectClass, Evidence, Operation, Outcome, RecordedAttempt
from charter.adapters.models import ModelUnits, Usage
from charter.adapters.models.pricing import Pricing, UsageLookup, input_bound, max_tokens
from charter.adapters.models.refusals import refused_or_raise
from charter.attempts.classify import error_answer
from charter.errors import ConfigError, MissingExtra, StateError, UsageError

try:
    from pydantic_ai.durable_exec import (
        JSON_CODEC,
        BaseDurabilityCapability,
        BoundDurableOperation,
        CallToolResult,
        DurabilityEngineSpec,
        DurableOperation,
        DurableOperationBackend,
        EventStreamHandlerId,
        ModelRequestId,
        ToolsetCallToolId,
        ToolsetGetInstructionsId,
        ToolsetGetToolsId,
        ToolsetValidateToolArgumentsId,
    )
    from pydantic_ai.messages import ModelResponse
    from pydantic_ai.toolsets import FunctionToolset

    from charter.integrations.pydantic_ai_calls import json_of, model_call
except ImportError:  # pragma: no cover - shown by the test that hides the package
    raise MissingExtra(
        "the PydanticAI integration needs PydanticAI: pip install 'charter[pydantic-ai]'",
        extra="pydantic-ai",
    ) from None

_Operation = DurableOperation[Any, Any, Any]

#: The operation a model request is recorded under (``<name>.model_request``).
MODEL_REQUEST = "model_request"

#: The kinds of PydanticAI's recorded tool call that hold a value the tool returned.
_RETURNED = frozenset({"tool_return", "tool_content_result"})

#: Message content whose tokens its size does not bound (see ``input_bound``).
_MEDIA = frozenset({"image-url", "audio-url", "video-url", "document-url", "binary"})


@dataclasses.dataclass(frozen=True)
class ToolEffect:
    """What a tool does outside, for Charter.

    ``effect``: the effect class of an uncertain call (A7); an
    ``idempotent_keyed`` tool sends :func:`current_send`'s key to a target
    that deduplicates by it for ``dedupe_window_seconds``. ``estimate``: an
    upper bound on a call's cost per unit, fixed or from the call's arguments;
    ``cost``: the actual cost from the tool's return value (the estimate when
    absent). ``lookup``: what the target did for a lost call, by its key, as
    evidence whose outcome holds the tool's return value (a person decides
    without one).
    """

    effect: EffectClass = EffectClass.UNSAFE
    dedupe_window_seconds: int | None = None
    estimate: Mapping[str, int] | Callable[[dict[str, Any]], Mapping[str, int]] = dataclasses.field(
        default_factory=dict
    )
    cost: Callable[[Any], Mapping[str, int]] | None = None
    lookup: Callable[[RecordedAttempt], Evidence] | None = None

    def __post_init__(self) -> None:
        self.operation()  # a keyed tool without its dedupe window is refused here

    def operation(self) -> Operation:
        return Operation(self.effect, dedupe_window_seconds=self.dedupe_window_seconds)

    def bound(self, args: dict[str, Any]) -> dict[str, int]:
        return dict(self.estimate(args) if callable(self.estimate) else self.estimate)


class _Operations(Mapping[str, Operation]):
    """The model request, the declared tools, and ``unsafe`` for any other tool."""

    def __init__(self, tools: Mapping[str, ToolEffect]) -> None:
        self._declared = {MODEL_REQUEST: Operation(EffectClass.READ_ONLY)}
        self._declared |= {name: tool.operation() for name, tool in tools.items()}

    def __getitem__(self, name: str) -> Operation:
        return self._declared.get(name) or Operation(EffectClass.UNSAFE)

    def __iter__(self) -> Iterator[str]:
        return iter(self._declared)

    def __len__(self) -> int:
        return len(self._declared)


class AgentAdapter:
    """An agent's model requests and tool calls as one Charter adapter.

    It estimates and reconciles; a call is sent only by its agent run (each
    attempt gets a :meth:`sending` copy holding the call). Pass it to
    ``Engine.coordinator.reconcile`` for a lost call.
    """

    def __init__(
        self,
        name: str,
        tools: Mapping[str, ToolEffect],
        units: ModelUnits,
        lookup: UsageLookup | None,
    ) -> None:
        self.name = name
        self.tools = dict(tools)
        self.operations: Mapping[str, Operation] = _Operations(self.tools)
        self.units = units
        self.lookup = lookup
        self._pricing: dict[str, Pricing] = {}
        self._send: Callable[[Dispatch], Awaitable[Outcome]] | None = None

    def pricing(self, provider: str) -> Pricing:
        if provider not in self._pricing:
            self._pricing[provider] = Pricing(provider, self.units)
        return self._pricing[provider]

    def estimate(self, operation: str, request: Any) -> Estimate:
        if operation == MODEL_REQUEST:
            limit = max_tokens(request["settings"], ("max_tokens",), f"{self.name}.{operation}")
            return self.pricing(request["provider"]).estimate(request, limit, _input_bound)
        tool = self.tools.get(operation, ToolEffect())
        return Estimate(tool.bound(request["args"]), f"{self.name}/declared")

    def sending(self, send: Callable[[Dispatch], Awaitable[Outcome]]) -> AgentAdapter:
        """This adapter, for one attempt whose call ``send`` makes."""
        one = copy.copy(self)
        one._send = send
        return one

    async def dispatch(self, send: Dispatch) -> Outcome:
        if self._send is None:  # a same-key replay asked outside the agent's run
            raise StateError(
                f"{self.name}.{send.operation} is sent only by its agent run; resume the run"
            )
        token = _SEND.set(send)
        try:
            return await self._send(send)
        finally:
            _SEND.reset(token)

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        if attempt.operation == MODEL_REQUEST:
            return self.pricing(attempt.request["provider"]).reconcile(attempt, self.lookup)
        tool = self.tools.get(attempt.operation)
        if tool is None or tool.lookup is None:
            return Evidence.indeterminate(
                {"lookup": f"tool {attempt.operation} declares no lookup; a person decides"}
            )
        found = tool.lookup(attempt)
        if found.outcome is None:
            return found
        # Recorded as a replay reads it: the tool's value in PydanticAI's
        # recorded form for a tool call, which it keeps loadable across releases.
        recorded = {"kind": "tool_return", "result": found.outcome.result}
        return dataclasses.replace(
            found, outcome=dataclasses.replace(found.outcome, result=recorded)
        )

    def resolved_result(self, operation: str, outcome: str, result: Any) -> Any:
        """A person's ``result=`` for one of these attempts, as the integration
        reads it back (``Coordinator.resolve(..., adapter=)`` asks): a model
        request's must be a model response as PydanticAI records it; a tool
        call's is the tool's plain value (or, failed, the failure's message),
        recorded as PydanticAI records a tool's return or failure."""
        if operation == MODEL_REQUEST:
            if outcome == "succeeded":
                try:
                    JSON_CODEC.load(ModelResponse, result)
                except ValueError as exc:
                    raise UsageError(
                        f"the result of a {self.name}.{MODEL_REQUEST} must be a model response "
                        f"as PydanticAI records it (a ModelResponse as JSON): {exc}",
                        field="result",
                    ) from None
            return result
        form = tool_form(result, failed=outcome != "succeeded")
        try:
            JSON_CODEC.load(CallToolResult, form)
        except ValueError as exc:
            raise UsageError(
                f"the result of {self.name}.{operation} is not a value PydanticAI can hand "
                f"the model as the tool's return: {exc}",
                field="result",
            ) from None
        return form

    def tool_outcome(self, name: str, args: dict[str, Any], payload: Any) -> Outcome:
        """What a tool's answer proves, from PydanticAI's recorded form of it
        (which names its kind): a value returned settles the attempt SUCCEEDED;
        an error PydanticAI hands the model (``ModelRetry``, ``ToolFailed``, a
        validation error raised inside the tool) is read by the one rule of
        :func:`~charter.attempts.classify.error_answer`: FAILED for a
        ``read_only`` tool, UNKNOWN for any other, which may have acted first."""
        kind = payload.get("kind")
        if kind not in _RETURNED:
            message = payload.get("message") or payload.get("title") or kind
            return error_answer(
                self.operations[name], payload, reason=f"tool {name} raised {kind}: {message}"
            )
        tool = self.tools.get(name, ToolEffect())
        value = payload.get("result")
        cost = tool.cost(value) if tool.cost is not None else tool.bound(args)
        return Outcome.succeeded(payload, cost=cost, price_source=f"{self.name}/declared")


def tool_form(value: Any, *, failed: bool = False) -> Any:
    """``value`` as PydanticAI records a tool call: as it is when it already
    is such a record (it names its ``kind`` and loads as one), else the tool's
    plain return value (or, ``failed``, the failure's message to the model)."""
    try:
        JSON_CODEC.load(CallToolResult, value)
    except ValueError:
        if failed:
            message = value if isinstance(value, str) else json.dumps(value)
            return {"kind": "tool_failed", "message": message}
        return {"kind": "tool_return", "result": value}
    return value


def _loaded(operation: _Operation, recorded: Any, what: str) -> Any:
    """A recorded result, loaded as PydanticAI reads it. One it cannot read
    stops the node (a person fixes the record); it is never handed to the
    model, which PydanticAI would do with a validation error from a tool."""
    try:
        return operation.result_codec.load(recorded)
    except ValueError as exc:
        raise StateError(
            f"the recorded result of {what} is not in the form PydanticAI reads ({exc}); "
            "resolve such attempts with the integration's adapter, which checks it"
        ) from None


def _input_bound(request: Any) -> int:
    """The request's input tokens, bounded by its size (media is refused there)."""
    return input_bound({**request, "messages": _typed_media(request["messages"])})


def _typed_media(value: Any) -> Any:
    """PydanticAI marks media with ``kind``; ``input_bound`` looks for ``type``."""
    if isinstance(value, dict):
        media = {"type": value["kind"]} if value.get("kind") in _MEDIA else {}
        return {**{k: _typed_media(v) for k, v in value.items()}, **media}
    if isinstance(value, list):
        return [_typed_media(v) for v in value]
    return value


@dataclasses.dataclass
class _Node:
    """The node an agent run is durable on, and the agent runs started in it."""

    ctx: Context
    runs: int = 0
    requests: dict[str, int] = dataclasses.field(default_factory=dict)

    def next_request(self, run_id: str) -> int:
        self.requests[run_id] = self.requests.get(run_id, 0) + 1
        return self.requests[run_id]


_NODE: ContextVar[_Node | None] = ContextVar("charter_pydantic_ai_node", default=None)
_SEND: ContextVar[Dispatch | None] = ContextVar("charter_pydantic_ai_send", default=None)


@contextmanager
def in_node(ctx: Context) -> Iterator[None]:
    """Make the agent runs started inside durable on ``ctx``, the node's context.

    Runs are told apart by the order they start in, so the same runs start in
    the same order when the node runs again.
    """
    token = _NODE.set(_Node(ctx))
    try:
        yield
    finally:
        _NODE.reset(token)


def current_send() -> Dispatch:
    """The attempt a tool is running in: send its ``idempotency_key`` and
    ``fencing_token`` to the tool's target."""
    send = _SEND.get()
    if send is None:
        raise StateError("current_send() is for a tool called by a durable agent run (in_node)")
    return send


def _node() -> _Node:
    node = _NODE.get()
    if node is None:  # pragma: no cover - the capability is transparent outside in_node
        raise StateError("an agent run is durable only inside in_node(ctx)")
    return node


class _Backend(DurableOperationBackend[None]):
    """PydanticAI's durable operations, each as what it is for Charter."""

    def __init__(self, durability: CharterDurability) -> None:
        self._durability = durability

    def bind(self, operation: _Operation) -> BoundDurableOperation[Any, Any, Any]:
        return _Bound(operation, self._durability)

    def config_for_tool(
        self, operation: _Operation, *, tool: object | None, tool_name: str
    ) -> None:
        return None

    def registrations(self) -> tuple[()]:
        return ()


class _Bound(BoundDurableOperation[Any, Any, Any]):
    def __init__(self, operation: _Operation, durability: CharterDurability):
        self._operation = operation
        self._durability = durability

    @property
    def operation(self) -> _Operation:
        return self._operation

    async def __call__(self, params: Any, *, config: object | None = None) -> Any:
        kind = self._operation.operation_id
        if isinstance(kind, ModelRequestId):
            return await self._durability.model_request(self._operation, params)
        if isinstance(kind, ToolsetCallToolId):
            return await self._durability.tool_call(self._operation, params)
        if isinstance(
            kind,
            ToolsetValidateToolArgumentsId
            | ToolsetGetToolsId
            | ToolsetGetInstructionsId
            | EventStreamHandlerId,
        ):
            # No effect outside (checking arguments, listing tools, handing
            # events to the caller's handler): done again when the node runs again.
            return await self._operation.handler(params)
        raise ConfigError(
            f"{type(kind).__name__} is not supported in a Charter node: "
            "compaction, batch requests and capabilities' own durable operations are not "
            "attempts yet; leave them out of agents run with CharterDurability"
        )


@dataclasses.dataclass(init=False, kw_only=True)
class CharterDurability(BaseDurabilityCapability[Any]):
    """The capability that makes an agent's runs inside :func:`in_node` durable.

    ``tools``: each tool's :class:`ToolEffect` (``unsafe`` when undeclared).
    ``units``: the allowance units a model request is counted in.
    ``lookup``: what the provider billed for a key, to reconcile a lost model
    request (see :data:`~charter.adapters.models.pricing.UsageLookup`).
    ``name``: the scope of its attempts (``<name>.<operation>``; the agent's
    name by default).
    """

    engine_spec: ClassVar[DurabilityEngineSpec] = DurabilityEngineSpec(
        engine_name="Charter",
        durable_unit_noun="attempt",
        durable_container_noun="node",
        codec=JSON_CODEC,  # results are recorded as JSON
        wrapped_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
        toolset_lifecycles={
            "function": "enter-always",
            "mcp": "enter-in-durable-unit",
            "dynamic": "enter-never",
        },
        journal_discovery=False,
        unsupported_runtime_toolset_kinds=frozenset({"function", "mcp", "dynamic"}),
    )

    def __init__(
        self,
        *,
        tools: Mapping[str, ToolEffect] | None = None,
        units: ModelUnits | None = None,
        lookup: UsageLookup | None = None,
        name: str | None = None,
        key_header: str = "Idempotency-Key",
    ) -> None:
        super().__init__(name=name)
        self.tools = dict(tools or {})
        self.units = units or ModelUnits()
        self.lookup = lookup
        self.key_header = key_header
        self._adapter: AgentAdapter | None = None

    @property
    def adapter(self) -> AgentAdapter:
        """The adapter the attempts are recorded under (to reconcile a lost call)."""
        if self._adapter is None or self._adapter.name != self.name:
            self._adapter = AgentAdapter(self.name, self.tools, self.units, self.lookup)
        return self._adapter

    @property
    def in_durable_context(self) -> bool:
        return _NODE.get() is not None

    def get_durable_operation_backend(self) -> DurableOperationBackend[Any]:
        return _Backend(self)

    def get_default_run_id(self) -> str | None:
        node = _NODE.get()
        if node is None:
            return None
        node.runs += 1
        return f"{node.ctx.run_id}:{node.ctx.node_id}:{node.runs}"

    async def before_run(self, ctx: Any) -> None:
        """Refuse, before anything is sent, what Charter would not govern:
        PydanticAI's own approvals, and a tool named as the model's operation."""
        await super().before_run(ctx)
        if not self.in_durable_context or self._agent is None:
            return
        asking: list[str] = []

        def check(leaf: Any) -> None:
            if isinstance(leaf, FunctionToolset):
                asking.extend(n for n, t in leaf.tools.items() if t.requires_approval)

        for toolset in self._agent.toolsets:
            toolset.apply(check)
        if asking:
            raise ConfigError(
                f"tools {sorted(asking)} ask for PydanticAI's approval; under Charter an approval "
                "is the contract's: list the tool's scope in approvals.required instead",
                tools=sorted(asking),
            )
        if MODEL_REQUEST in self.tools:
            raise ConfigError(f"a tool may not be named {MODEL_REQUEST!r}: the model's operation")

    async def model_request(self, operation: _Operation, params: Any) -> Any:
        """One model request as a ``read_only`` attempt, priced from its usage."""
        node = _node()
        model = params.run_context.model
        settings = dict(params.model_settings or {})
        request = model_call(model.system, model.model_name, settings, params)
        run_id = params.run_context.run_id
        key = f"{run_id}/model/{node.next_request(run_id)}"
        pricing = self.adapter.pricing(request["provider"])

        async def send(dispatch: Dispatch) -> Outcome:
            headers = {
                **settings.get("extra_headers", {}),
                self.key_header: dispatch.idempotency_key,
            }
            once = {**settings, "max_retries": 0, "extra_headers": headers}
            dispatch.check_deadline()
            try:
                answer = await operation.handler(dataclasses.replace(params, model_settings=once))
            except Exception as exc:
                refused_or_raise(exc)
            used = _usage(answer, request["model"])
            receipt = {"id": answer.provider_response_id, "model": used.model}
            return pricing.outcome(operation.result_codec.dump(answer), used, receipt)

        recorded = await node.ctx.aattempt(
            self.adapter.sending(send), MODEL_REQUEST, request, key=key
        )
        return _loaded(operation, recorded, f"{self.name}.{MODEL_REQUEST} {key}")

    async def tool_call(self, operation: _Operation, params: Any) -> Any:
        """One tool call as an attempt of its declared effect class, keyed by its call id."""
        node = _node()
        call_id = params.ctx.tool_call_id
        args = json_of(params.tool_args)
        request = {"tool": params.name, "tool_call_id": call_id, "args": args}
        key = f"{params.ctx.run_id}/tool/{call_id}"
        adapter = self.adapter

        async def send(dispatch: Dispatch) -> Outcome:
            dispatch.check_deadline()
            payload = operation.result_codec.dump(await operation.handler(params))
            return adapter.tool_outcome(params.name, args, payload)

        try:
            recorded = tool_form(
                await node.ctx.aattempt(adapter.sending(send), params.name, request, key=key)
            )
        except AttemptFailed as exc:  # the tool's error, recorded: the model is told it again
            if exc.details.get("result") is None:
                raise
            recorded = tool_form(exc.details["result"], failed=True)
        return _loaded(operation, recorded, f"{self.name}.{params.name} {key}")


def _usage(answer: Any, model: str) -> Usage:
    """What a PydanticAI response says it used, as the model adapters count it."""
    if not isinstance(answer, ModelResponse):  # pragma: no cover - the model's contract
        raise StateError(f"a model request answered {type(answer).__name__}")
    used = answer.usage
    return Usage(
        answer.model_name or model,
        used.input_tokens,
        used.output_tokens,
        cache_read=used.cache_read_tokens,
        cache_write=used.cache_write_tokens,
    )
