"""A LangChain chat model's calls as ``read_only`` attempts, for a LangGraph
graph run by :func:`charter.integrations.langgraph.invoke`.

:class:`ChatModelCalls` wraps a chat model (``ChatOpenAI``, or any LangChain
chat model that reports its provider, model and output limit to LangSmith's
standard parameters and its usage as ``usage_metadata``); its ``model`` is the
chat model to give the graph. Each call is estimated and priced as the model
adapters price (:mod:`charter.adapters.models`): the estimate an upper bound
from the request's size and its ``max_tokens`` (a model without one is
refused), the cost the usage priced with ``genai-prices``, token units beside
money. It is sent once, with its attempt's key as its ``Idempotency-Key``
header (``extra_headers``), and keyed by the LangGraph task making it and its
turn within that task, which a resume from the checkpoint keeps.

The recorded request is the call's identity on replay (A6), built from an
allow-list (:data:`MESSAGES`, :data:`SETTINGS`; see
:mod:`charter.integrations.fields`): the provider and model, each message's
kind and content, an AI message's tool calls, a tool message's call id and
status, the tools bound and the settings that change the answer. Never a
message's id, its usage or its response metadata.
"""

from __future__ import annotations

import contextvars
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from charter import Blocked, Dispatch, EffectClass, Estimate, Evidence, Operation, Outcome
from charter.adapters import RecordedAttempt
from charter.adapters.models.pricing import ModelUnits, Pricing, Usage, UsageLookup, max_tokens
from charter.adapters.models.refusals import refused_or_raise
from charter.errors import ConfigError, NotApplied, UsageError
from charter.integrations.fields import Shapes
from charter.integrations.langgraph import bound

try:
    from langchain_core.language_models import BaseChatModel
    from langchain_core.messages import AIMessage, BaseMessage, message_to_dict
    from langchain_core.messages.utils import messages_from_dict
    from langchain_core.outputs import ChatGeneration, ChatResult
except ImportError:  # pragma: no cover - charter.integrations.langgraph raised first
    raise

_CONTENT = {"content": True}
_TEXT = {"text": False}

#: What a call's messages record, by message or content block type.
MESSAGES = Shapes(
    "LangChain message or content block",
    ("type",),
    {
        "system": _CONTENT,
        "human": _CONTENT,
        "ai": {"content": True, "tool_calls": True},
        "tool": {"content": True, "tool_call_id": False, "status": False},
        "tool_call": {"name": False, "args": False, "id": False},
        "text": _TEXT,
        "reasoning": {"reasoning": False},
        "image_url": {"image_url": False},
        "image": {"url": False, "base64": False, "file_id": False, "mime_type": False},
        "file": {"url": False, "base64": False, "file_id": False, "mime_type": False},
        "audio": {"url": False, "base64": False, "file_id": False, "mime_type": False},
    },
)

#: The invocation parameters that change the answer: not timeouts, retries,
#: headers, streaming or what the provider stores.
SETTINGS = dict.fromkeys(
    (
        "temperature",
        "top_p",
        "top_k",
        "seed",
        "stop",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "n",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "reasoning",
        "reasoning_effort",
        "verbosity",
        "extra_body",
    ),
    False,
)

_LIVE: contextvars.ContextVar[_Call] = contextvars.ContextVar("charter_langgraph_model")


@dataclasses.dataclass(frozen=True)
class _Call:
    messages: list[BaseMessage]
    stop: list[str] | None
    kwargs: Mapping[str, Any]


class ChatModelCalls:
    """A LangChain chat model's calls as ``read_only`` attempts ``<name>.chat``.

    ``model`` must be built without retries of its own (``max_retries=0``:
    every request that leaves is an attempt) and with an output limit
    (``max_tokens``). ``units``, ``lookup`` (a usage lookup by key, for
    ``reconcile``), ``input_bound`` and ``key_header`` are the model adapters'.
    """

    def __init__(
        self,
        model: BaseChatModel,
        *,
        name: str = "chat",
        units: ModelUnits | None = None,
        lookup: UsageLookup | None = None,
        input_bound: Callable[[Any], int] | None = None,
        key_header: str = "Idempotency-Key",
    ) -> None:
        if getattr(model, "max_retries", 0) != 0:
            raise ConfigError(
                f"{type(model).__name__} retries on its own; build it with max_retries=0: "
                "every request that leaves is an attempt"
            )
        params = model.asdict()  # the model's public description: its type and settings
        provider = str(params.get("_type", "")).partition("-")[0]
        self.model_name = params.get("model_name") or params.get("model")
        if not provider or not self.model_name:
            raise ConfigError(f"{type(model).__name__} names no provider or model to price by")
        self.inner = model
        self.name = name
        self.operations = {"chat": Operation(EffectClass.READ_ONLY)}
        self.pricing = Pricing(str(provider), units or ModelUnits())
        self.lookup = lookup
        self.input_bound = input_bound
        self.key_header = key_header
        #: The chat model to give the graph: each call an attempt of its node.
        self.model = GovernedChatModel(calls=self)

    def request(
        self, messages: Sequence[BaseMessage], stop: list[str] | None, kwargs: Mapping[str, Any]
    ) -> dict[str, Any]:
        """The call as recorded and hashed, each part from its allow-list."""
        params = {**self.inner.asdict(), "stop": stop, **kwargs}  # as the model sends them
        limit = params.get("max_tokens") or params.get("max_completion_tokens")
        return {
            "model": str(params.get("model") or params.get("model_name") or self.model_name),
            "messages": MESSAGES.project([m.model_dump(mode="json") for m in messages]),
            "settings": MESSAGES.pick(params, SETTINGS),
            "max_tokens": limit,
        }

    def estimate(self, operation: str, request: Any) -> Estimate:
        limit = max_tokens(request, ("max_tokens",), f"{self.name}.{operation}")
        return self.pricing.estimate(request, limit, self.input_bound)

    def dispatch(self, send: Dispatch) -> Outcome:
        call = _LIVE.get(None)
        if call is None:
            raise NotApplied(f"{self.name}: no live call here; a graph's node makes it")
        headers = {
            **(call.kwargs.get("extra_headers") or {}),
            self.key_header: send.idempotency_key,
        }
        send.check_deadline()
        try:
            answer = self.inner.invoke(
                call.messages, stop=call.stop, **{**call.kwargs, "extra_headers": headers}
            )
        except Exception as exc:
            refused_or_raise(exc)
        if not isinstance(answer, AIMessage):
            raise TypeError(f"{type(self.inner).__name__} answered a {type(answer).__name__}")
        used = answer.usage_metadata
        if not used:  # what it cost is not known: it costs its upper bound
            bound = self.estimate(send.operation, send.request)
            receipt = {"id": answer.id, "usage": "not reported: charged the estimate"}
            return Outcome.succeeded(message_to_dict(answer), cost=bound.amounts, receipt=receipt)
        details = used.get("input_token_details")
        cached = details.get("cache_read", 0) if details else 0
        model = str(answer.response_metadata.get("model_name") or send.request["model"])
        usage = Usage(model, used["input_tokens"], used["output_tokens"], cache_read=cached)
        return self.pricing.outcome(message_to_dict(answer), usage, {"id": answer.id})

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return self.pricing.reconcile(attempt, self.lookup)

    def resolved_result(self, operation: str, outcome: str, result: Any) -> Any:
        """A person's ``result=`` for a model call: the AI message as LangChain
        writes it (``message_to_dict``), or nothing (the call is made again, N6)."""
        if outcome == "succeeded" and result is not None:
            try:
                message = messages_from_dict([result])[0]
            except (KeyError, TypeError, ValueError) as exc:
                raise UsageError(
                    f"the result of a {self.name}.{operation} call must be an AI message "
                    f"as message_to_dict writes it: {exc}",
                    field="result",
                ) from None
            if not isinstance(message, AIMessage):
                raise UsageError(f"a {self.name}.{operation} result is an AI message")
        return result


class GovernedChatModel(BaseChatModel):
    """The chat model a graph calls: each call an attempt of its node, the
    answer handed back from the record, live and on replay alike."""

    calls: Any  # the ChatModelCalls it belongs to

    @property
    def _llm_type(self) -> str:
        return f"charter-{self.calls.inner._llm_type}"

    def bind_tools(self, tools: Sequence[Any], **options: Any) -> Any:
        """The tools as the wrapped model binds them, on this model."""
        return self.bind(**self.calls.inner.bind_tools(tools, **options).kwargs)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: Any = None,
        **kwargs: Any,
    ) -> ChatResult:
        binding = bound()
        calls: ChatModelCalls = self.calls
        request = calls.request(messages, stop, kwargs)
        token = _LIVE.set(_Call(messages, stop, kwargs))
        try:
            recorded = binding.ctx.attempt(calls, "chat", request, key=binding.model_key())
        except Blocked as exc:
            binding.stop(exc)
        finally:
            _LIVE.reset(token)
        return ChatResult(generations=[ChatGeneration(message=messages_from_dict([recorded])[0])])
