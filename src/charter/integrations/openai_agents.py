"""The OpenAI Agents SDK on Charter: every model call and every function tool
call of an agent run is an attempt (A1-A7), replayed from its record after a
crash instead of being made again.

Two adapters, each usable on its own (an operator reconciles with them) and
bound to a node's context by :func:`run`:

- :class:`AgentModels`, the agent's model calls through the SDK's OpenAI
  Responses or Chat Completions model: ``read_only`` attempts, estimated and
  priced as the model adapters price them (an upper bound from the request's
  size and its ``max_tokens``, the usage priced with ``genai-prices``, token
  units beside money), made once (the client's retries off) with the
  attempt's own ``Idempotency-Key`` on the request. A model call's key is its
  turn in the agent run (``<key>:model:<n>``).
- :class:`AgentTools`, the agent's function tools as operations, each with
  its declared effect class; a call is an attempt keyed by its tool-call ID
  (``<key>:tool:<call id>``). A tool that needs a person's approval is named
  in the contract's ``approvals.required`` (``tools.pay``): its call waits as
  a Charter approval, durably, and the run resumes when it is given. Inside a
  tool, :func:`current_dispatch` is the attempt being sent: its idempotency key
  and fencing token, for the tool's target.

A model call's recorded request is its identity on replay (A6): the model,
the instructions, the input items, the tools, handoffs and output schema,
and the settings that change the answer, each from an allow-list
(:data:`INPUT`, :data:`SETTINGS`; see :mod:`charter.integrations.fields`), so
the same conversation records the same request whenever it is made.

The SDK's hooks (``RunHooks``, ``AgentHooks``) run again when a node is
replayed: they only observe. Effects belong in tools. Needs the
``openai-agents`` extra (``pip install 'charter[openai-agents]'``)::

    @charter.node
    async def triage(ctx: charter.Context, question: str) -> str:
        result = await run(ctx, agent, question, models=models, tools=tools)
        return str(result.final_output)
"""

from __future__ import annotations

import contextvars
import dataclasses
import json
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from charter import (
    AttemptFailed,
    CharterError,
    Context,
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    NotApplied,
    Operation,
    Outcome,
    RecordedAttempt,
)
from charter.adapters.models.base import ModelAdapter
from charter.adapters.models.openai import OpenAIModels
from charter.adapters.models.pricing import Usage
from charter.adapters.models.refusals import refused_or_raise
from charter.attempts.classify import error_answer
from charter.errors import ConfigError, MissingExtra, StateError, UsageError
from charter.integrations.fields import Shapes

try:
    import openai
    from agents import (
        Agent,
        FunctionTool,
        Handoff,
        Model,
        ModelProvider,
        ModelResponse,
        ModelSettings,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        RunConfig,
        Runner,
        RunResult,
    )
    from agents.exceptions import ModelBehaviorError, UserError
    from agents.tool import maybe_invoke_function_tool_failure_error_function
    from pydantic import BaseModel, TypeAdapter
except ImportError:  # pragma: no cover - exercised by a test that hides the SDK
    raise MissingExtra(
        "the OpenAI Agents SDK integration needs openai-agents: "
        "pip install 'charter[openai-agents]'",
        extra="openai-agents",
    ) from None

#: The two model APIs the SDK speaks to OpenAI, as the operation's name.
APIS = {"responses": OpenAIResponsesModel, "chat": OpenAIChatCompletionsModel}

_TEXT = {"text": False}

#: What a model call's input records, by item or content type: each message's
#: role and content, each tool call's id, name and arguments, each tool
#: output, a reasoning item's text. Never an item's own id, its status, or
#: anything a later release of the SDK or of ``openai`` adds to it.
INPUT = Shapes(
    "Responses API input item or content part",
    ("type",),
    {
        "message": {"role": False, "content": True},
        "input_text": _TEXT,
        "output_text": _TEXT,
        "summary_text": _TEXT,
        "reasoning_text": _TEXT,
        "refusal": {"refusal": False},
        "input_image": {"image_url": False, "file_id": False, "detail": False},
        "input_file": {"file_id": False, "file_url": False, "file_data": False, "filename": False},
        "input_audio": {"input_audio": False},
        "function_call": {"call_id": False, "name": False, "arguments": False},
        "function_call_output": {"call_id": False, "output": True},
        "reasoning": {"summary": True, "content": True},
        "item_reference": {"id": False},
    },
    default="message",  # the API's plain {"role", "content"} message names no type
)

#: The model settings that change the answer: not timeouts, retries, headers,
#: metadata or what the provider stores.
SETTINGS = dict.fromkeys(
    (
        "temperature",
        "top_p",
        "frequency_penalty",
        "presence_penalty",
        "tool_choice",
        "parallel_tool_calls",
        "truncation",
        "max_tokens",
        "reasoning",
        "verbosity",
        "top_logprobs",
        "extra_body",
        "extra_args",
    ),
    False,
)

_RESPONSE = TypeAdapter(ModelResponse)
#: The call being sent, with its live arguments: set by the model wrapper or the
#: tool wrapper around ``ctx.aattempt`` and read by the adapter's send, which
#: Charter awaits in the same task (a task copies the context it starts in).
_LIVE: contextvars.ContextVar[_Call] = contextvars.ContextVar("charter_agents_call")
_SENDING: contextvars.ContextVar[Dispatch] = contextvars.ContextVar("charter_agents_sending")


@dataclasses.dataclass(frozen=True)
class _Call:
    """What the adapter needs to make one call besides its recorded request."""

    operation: str
    target: Any  # the model's name, or the FunctionTool to invoke
    args: tuple[Any, ...]  # a tool's (context, arguments)
    kwargs: Mapping[str, Any]  # a model's get_response arguments


def current_dispatch() -> Dispatch:
    """The attempt a tool call is being sent as: its idempotency key and fencing
    token, for a tool whose target deduplicates or fences by them."""
    send = _SENDING.get(None)
    if send is None:
        raise StateError(
            "current_dispatch() is for a function tool called through AgentTools; "
            "this code is not inside one"
        )
    return send


def _jsonable(value: Any) -> Any:
    """A value as JSON, as the store gives it back: pydantic models dumped,
    dataclasses as dicts, keys sorted, the rest kept when JSON takes it, else
    its text. A tool's answer is shown to the model as this, live and replayed
    alike, so the next model call's request is the same either way (A6)."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_none=True)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _jsonable(dataclasses.asdict(value))
    if isinstance(value, Mapping):
        return {str(k): _jsonable(value[k]) for k in sorted(value, key=str)}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    if value is None or isinstance(value, str | int | float | bool):
        return value
    return str(value)


class AgentModels(ModelAdapter):
    """An agent's model calls as ``read_only`` attempts (see the module's text).

    ``client``: an ``openai.AsyncOpenAI`` (its retries are turned off here), or
    one is made from ``base_url`` and ``api_key``. ``api``: ``"responses"``
    (the SDK's default) or ``"chat"``. The other arguments (``timeout``,
    ``units``, ``name``, ``key_header``, ``lookup``, ``input_bound``) are the
    model adapters' (:class:`~charter.adapters.models.openai.OpenAIModels`).
    Every request must set ``ModelSettings(max_tokens=...)``: the estimate is
    an upper bound, and the output has none without it.
    """

    provider = "openai"
    default_name = "agent-models"
    _connect = staticmethod(OpenAIModels._connect)

    def __init__(self, client: Any = None, *, api: str = "responses", **options: Any) -> None:
        if api not in APIS:
            raise ConfigError(f"api must be one of {sorted(APIS)}, got {api!r}")
        self.api = api
        self.limits = {api: ("max_output_tokens",)}
        super().__init__(client, **options)

    @staticmethod
    def _load() -> Any:
        return openai

    async def _send(self, client: Any, send: Dispatch) -> Outcome:
        call = _live(send)
        model = APIS[send.operation](call.target, client)
        settings: ModelSettings = call.kwargs["model_settings"]
        headers = {**(settings.extra_headers or {}), self.key_header: send.idempotency_key}
        asked = {
            **call.kwargs,
            "model_settings": dataclasses.replace(settings, extra_headers=headers),
        }
        send.check_deadline()
        try:
            answer = await model.get_response(**asked)
        except Exception as exc:
            refused_or_raise(exc)
        details = answer.usage.input_tokens_details
        used = Usage(
            call.target,
            answer.usage.input_tokens,
            answer.usage.output_tokens,
            cache_read=(details.cached_tokens or 0) if details is not None else 0,
        )
        data = _RESPONSE.dump_python(answer, mode="json")
        return self.pricing.outcome(data, used, {"id": answer.response_id, "model": call.target})

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return self.pricing.reconcile(attempt, self.lookup)

    def resolved_result(self, operation: str, outcome: str, result: Any) -> Any:
        """A person's ``result=`` for a model call (``Coordinator.resolve(...,
        adapter=)`` asks): the SDK's model response as JSON, which the agent
        run reads back, or nothing (the call is then made again, N6)."""
        if outcome == "succeeded":
            try:
                _RESPONSE.validate_python(result)
            except ValueError as exc:
                raise UsageError(
                    f"the result of a {self.name}.{operation} call must be the SDK's model "
                    f"response as JSON (agents.ModelResponse): {exc}",
                    field="result",
                ) from None
        return result


ToolCost = Mapping[str, int] | Callable[[Any], Mapping[str, int]]
ToolLookup = Callable[[RecordedAttempt], Evidence | Awaitable[Evidence]]


class AgentTools:
    """Function tools as Charter operations, one per tool, by its name.

    ``effects``: each tool's effect class (an :class:`~charter.EffectClass`, or
    an :class:`~charter.Operation` for an ``idempotent_keyed`` tool's dedupe
    window); a tool without one is refused. A tool's error is read by the one
    rule of :func:`~charter.attempts.classify.error_answer`: a ``read_only``
    tool's call settles FAILED and the model is told as the SDK tells it (the
    message is recorded, so a replay tells the same); any other tool's call is
    UNKNOWN, with the error kept as evidence, since the tool may have acted
    before raising (raise :class:`~charter.NotApplied` to prove nothing
    happened). ``costs``: a tool's estimate, in allowance units, or a function
    of its arguments giving it; a call costs its estimate. ``lookups``: how to
    find out what became of a tool's uncertain call (for ``reconcile``).
    """

    def __init__(
        self,
        tools: Sequence[FunctionTool],
        *,
        effects: Mapping[str, EffectClass | Operation],
        name: str = "tools",
        costs: Mapping[str, ToolCost] | None = None,
        lookups: Mapping[str, ToolLookup] | None = None,
    ) -> None:
        self.name = name
        self.tools = {t.name: _checked(t, effects) for t in tools}
        self.operations: Mapping[str, Operation] = {
            n: e if isinstance(e, Operation) else Operation(e)
            for n, e in effects.items()
            if n in self.tools
        }
        self.costs = dict(costs or {})
        self.lookups = dict(lookups or {})

    def estimate(self, operation: str, request: Any) -> Estimate:
        cost = self.costs.get(operation, {})
        amounts = cost(request["arguments"]) if callable(cost) else cost
        return Estimate(dict(amounts), f"{self.name}/declared")

    async def dispatch(self, send: Dispatch) -> Outcome:
        call = _live(send)
        tool: FunctionTool = call.target
        # The tool's error comes here, to be read by the one rule (A3), not
        # turned into a message for the model by the SDK first.
        raw = dataclasses.replace(
            tool, _failure_error_function=None, _use_default_failure_error_function=False
        )
        send.check_deadline()
        token = _SENDING.set(send)
        try:
            output = await raw.on_invoke_tool(*call.args)
        except ModelBehaviorError as exc:  # arguments refused before the tool ran
            raise NotApplied(f"the tool refused its arguments: {exc}") from exc
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
            shown = await maybe_invoke_function_tool_failure_error_function(
                function_tool=tool, context=call.args[0], error=exc
            )
            return error_answer(
                self.operations[send.operation],
                {"error": error, "shown": shown},
                reason=f"tool {send.operation} raised {error}",
            )
        finally:
            _SENDING.reset(token)
        cost = self.estimate(send.operation, send.request).amounts
        return Outcome.succeeded(_jsonable(output), cost=cost)

    def reconcile(self, attempt: RecordedAttempt) -> Evidence | Awaitable[Evidence]:
        lookup = self.lookups.get(attempt.operation)
        if lookup is None:
            return Evidence.indeterminate({"tools": f"{attempt.operation}: no lookup declared"})
        return lookup(attempt)

    def bind(self, ctx: Context, key: str) -> dict[str, FunctionTool]:
        """The tools, each call made as an attempt of ``ctx``'s node."""
        return {n: self._governed(ctx, key, t) for n, t in self.tools.items()}

    def _governed(self, ctx: Context, key: str, tool: FunctionTool) -> FunctionTool:
        async def invoke(tool_ctx: Any, arguments: str) -> Any:
            try:
                request = {"arguments": json.loads(arguments or "{}")}
            except ValueError:  # the SDK tells the model, and nothing runs
                return await tool.on_invoke_tool(tool_ctx, arguments)
            live = _LIVE.set(_Call(tool.name, tool, (tool_ctx, arguments), {}))
            try:
                call_key = f"{key}:tool:{tool_ctx.tool_call_id}"
                return await ctx.aattempt(self, tool.name, request, key=call_key)
            except AttemptFailed as exc:  # shown to the model as the tool's failure
                recorded = exc.details.get("result")
                if isinstance(recorded, dict) and isinstance(recorded.get("shown"), str):
                    return recorded["shown"]  # as it was shown when the tool raised
                shown = await maybe_invoke_function_tool_failure_error_function(
                    function_tool=tool, context=tool_ctx, error=exc
                )
                if shown is None:
                    raise
                return shown
            finally:
                _LIVE.reset(live)

        return dataclasses.replace(tool, on_invoke_tool=invoke)


def _checked(tool: Any, effects: Mapping[str, EffectClass | Operation]) -> FunctionTool:
    if not isinstance(tool, FunctionTool):
        raise ConfigError(
            f"{type(tool).__name__} is not a function tool; AgentTools governs function tools "
            "(hosted tools run inside the model call)"
        )
    if tool.name not in effects:
        raise ConfigError(
            f"tool {tool.name!r} has no effect class; declare it in effects= "
            "(read_only, idempotent_keyed or unsafe)",
            tool=tool.name,
        )
    if tool.needs_approval is not False:
        raise ConfigError(
            f"tool {tool.name!r} asks the SDK for approval; on Charter an approval is the "
            "contract's: build the tool without needs_approval and list its scope "
            "in the contract's approvals.required",
            tool=tool.name,
        )
    return tool


def _live(send: Dispatch) -> _Call:
    call = _LIVE.get(None)
    if call is None or call.operation != send.operation:
        raise NotApplied(
            f"{send.operation}: no live call to make here; agent calls are sent from "
            "their agent run (charter.integrations.openai_agents.run)"
        )
    return call


class _Model(Model):
    """One model of an agent run: each ``get_response`` an attempt of the node."""

    def __init__(self, turns: _Provider, name: str) -> None:
        self.turns = turns
        self.name = name

    async def get_response(  # noqa: PLR0917 - the SDK's Model interface
        self,
        system_instructions: str | None,
        input: Any,
        model_settings: ModelSettings,
        tools: list[Any],
        output_schema: Any,
        handoffs: list[Any],
        tracing: Any,
        *,
        previous_response_id: str | None,
        conversation_id: str | None,
        prompt: Any,
    ) -> ModelResponse:
        asked = {
            "system_instructions": system_instructions,
            "input": input,
            "model_settings": model_settings,
            "tools": tools,
            "output_schema": output_schema,
            "handoffs": handoffs,
            "tracing": tracing,
            "previous_response_id": previous_response_id,
            "conversation_id": conversation_id,
            "prompt": prompt,
        }
        models = self.turns.models
        live = _LIVE.set(_Call(models.api, self.name, (), asked))
        try:
            data = await self.turns.ctx.aattempt(
                models, models.api, _request(self.name, asked), key=self.turns.next_key()
            )
        finally:
            _LIVE.reset(live)
        return _RESPONSE.validate_python(data)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[Any]:
        raise ConfigError(
            "a streamed agent run is not governed call by call; run it with "
            "charter.integrations.openai_agents.run (Runner.run)"
        )


def _request(model: str, asked: Mapping[str, Any]) -> dict[str, Any]:
    """The call as recorded and hashed: what the model is asked, and with what,
    each part from its allow-list (:data:`INPUT`, :data:`SETTINGS`)."""
    settings: ModelSettings = asked["model_settings"]
    schema = asked["output_schema"]
    return {
        "model": model,
        "instructions": asked["system_instructions"],
        "input": INPUT.project(_jsonable(asked["input"])),
        "tools": [_tool_json(t) for t in asked["tools"]],
        "handoffs": [h.tool_name for h in asked["handoffs"]],
        "output_schema": None if schema is None or schema.is_plain_text() else schema.json_schema(),
        "settings": INPUT.pick(_jsonable(settings.to_json_dict()), SETTINGS),
        "max_output_tokens": settings.max_tokens,
        "previous_response_id": asked["previous_response_id"],
        "conversation_id": asked["conversation_id"],
    }


def _tool_json(tool: Any) -> dict[str, Any]:
    if isinstance(tool, FunctionTool):
        return {
            "name": tool.name,
            "description": tool.description,
            "parameters": tool.params_json_schema,
        }
    return {"type": type(tool).__name__, "name": getattr(tool, "name", None)}


class _Provider(ModelProvider):
    """The models of one agent run in one node: numbers its turns (the calls' keys)."""

    def __init__(self, ctx: Context, models: AgentModels, key: str) -> None:
        self.ctx, self.models, self.key = ctx, models, key
        self.turn = 0

    def get_model(self, model_name: str | None) -> Model:
        if not model_name:
            raise ConfigError("give the agent a model name (Agent(model=...)) to price it by")
        return _Model(self, model_name)

    def next_key(self) -> str:
        self.turn += 1
        return f"{self.key}:model:{self.turn}"


async def run(
    ctx: Context,
    agent: Agent[Any],
    input: str | list[Any],
    *,
    models: AgentModels,
    tools: AgentTools,
    key: str | None = None,
    run_config: RunConfig | None = None,
    **options: Any,
) -> RunResult:
    """Run ``agent`` as ``Runner.run`` does, each model and tool call an attempt
    of ``ctx``'s node. ``key`` names this agent run in the node (default: the
    agent's name): give each run of one node its own. ``options`` go to
    ``Runner.run`` (``max_turns``, ``context``, ``hooks``...)."""
    label = key or agent.name
    governed = _governed(agent, tools.bind(ctx, label))
    config = dataclasses.replace(
        run_config or RunConfig(), model_provider=_Provider(ctx, models, label)
    )
    try:
        return await Runner.run(governed, input, run_config=config, **options)
    except UserError as exc:
        # The SDK wraps what a tool raised ("Error running tool ..."): Charter's
        # own errors reach the node as they are, so that it can tell a failure
        # (AttemptFailed) or an answer never recorded (AnswerNotRecorded, N6)
        # from a bug.
        cause = exc.__cause__
        if isinstance(cause, CharterError):
            raise cause.with_traceback(cause.__traceback__) from None
        raise


def _governed(
    agent: Agent[Any], bound: Mapping[str, FunctionTool], seen: dict[int, Agent[Any]] | None = None
) -> Agent[Any]:
    """``agent`` (and the agents it hands off to, cycles kept) with governed tools."""
    seen = {} if seen is None else seen
    if id(agent) in seen:
        return seen[id(agent)]
    if agent.model is not None and not isinstance(agent.model, str):
        raise ConfigError(
            f"agent {agent.name!r} holds its own Model, which would call outside Charter; "
            "give it a model name and let AgentModels make the calls"
        )
    tools = []
    for tool in agent.tools:
        if not isinstance(tool, FunctionTool) or tool.name not in bound:
            raise ConfigError(
                f"agent {agent.name!r} has a tool {getattr(tool, 'name', tool)!r} that "
                "AgentTools does not govern; declare it there",
            )
        tools.append(bound[tool.name])
    clone = seen[id(agent)] = agent.clone(tools=tools)
    clone.handoffs = [
        _governed(h, bound, seen) if isinstance(h, Agent) else _handing_off(h, bound)
        for h in agent.handoffs
    ]
    return clone


def _handing_off(
    handoff: Handoff[Any, Any], bound: Mapping[str, FunctionTool]
) -> Handoff[Any, Any]:
    invoke = handoff.on_invoke_handoff

    async def governed(*args: Any) -> Agent[Any]:
        return _governed(await invoke(*args), bound)

    return dataclasses.replace(handoff, on_invoke_handoff=governed)
