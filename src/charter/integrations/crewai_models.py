"""A CrewAI LLM whose every call is a ``read_only`` attempt, for a crew run by
:func:`charter.integrations.crewai.kickoff`.

:class:`CrewModel` wraps a CrewAI LLM (``LLM(model=..., base_url=...)``,
CrewAI's own OpenAI client in 1.15, or an OpenAI-compatible one) built with
``max_retries=0`` and ``max_tokens``. Each call is estimated and priced as the
model adapters price (:mod:`charter.adapters.models`): the estimate an upper
bound from the request's size and its ``max_tokens``, the cost the usage the
call reports, priced with ``genai-prices``, token units beside money. It is
sent once, with its attempt's key as its ``Idempotency-Key`` header: CrewAI's
rate-limit retry wraps the attempt, not the request, so a call it asks again
after a refusal is a new attempt.

The recorded request is the call's identity on replay (A6), built from an
allow-list (:data:`MESSAGES`, :data:`SETTINGS`; see
:mod:`charter.integrations.fields`): the provider and model, each message's
role and content, an assistant message's tool calls, a tool message's call id
and name, the tools offered, the stop words and the settings that change the
answer. Never CrewAI's cache markers or anything a later release adds.
"""

from __future__ import annotations

import contextvars
import dataclasses
import hashlib
import json
import threading
from collections.abc import Mapping
from typing import Any

from charter import Context, Dispatch, EffectClass, Estimate, Evidence, Operation, Outcome
from charter.adapters import RecordedAttempt
from charter.adapters.models.pricing import (
    ModelUnits,
    Pricing,
    Usage,
    input_bound,
    max_tokens,
)
from charter.adapters.models.refusals import refused_or_raise
from charter.errors import ConfigError, MissingExtra, NotApplied, StateError, UsageError
from charter.integrations.fields import Shapes

try:
    from crewai.llms.base_llm import BaseLLM  # type: ignore[import-not-found,unused-ignore]
    from pydantic import BaseModel, PrivateAttr
except ImportError:  # pragma: no cover - the main environment has no crewai
    raise MissingExtra(
        "the CrewAI integration needs crewai: pip install 'charter[crewai]'", extra="crewai"
    ) from None

_CONTENT = {"content": True}

#: What a call's messages record, by role, content block or tool call type.
MESSAGES = Shapes(
    "CrewAI message, content block or tool call",
    ("role", "type"),
    {
        "system": _CONTENT,
        "user": _CONTENT,
        "assistant": {"content": True, "tool_calls": True},
        "tool": {"content": True, "tool_call_id": False, "name": False},
        "function": {"id": False, "function": False},
        "text": {"text": False},
        "image_url": {"image_url": False},
        "input_audio": {"input_audio": False},
        "file": {"file": False},
    },
)

#: The LLM's fields that change the answer: not timeouts, retries, keys,
#: addresses or headers.
SETTINGS = (
    "api",
    "temperature",
    "top_p",
    "seed",
    "n",
    "frequency_penalty",
    "presence_penalty",
    "logprobs",
    "top_logprobs",
    "reasoning_effort",
    "response_format",
)

#: What a call's answer is recorded as: text, the tool calls the executor
#: makes, or the structured output asked for (``response_model``).
ANSWERS = ("content", "tool_calls", "parsed")


@dataclasses.dataclass
class Binding:
    """One crew run in one node: its context, the crew, and how many calls each
    task made so far (their keys' turns and occurrences)."""

    ctx: Context
    base: str
    crew: Any
    counts: dict[str, int] = dataclasses.field(default_factory=dict)
    lock: threading.Lock = dataclasses.field(default_factory=threading.Lock)

    def task_label(self, task: Any) -> str:
        """A task's place in the crew (``t1``...), the same on every run; a task
        the crew does not list (one CrewAI makes itself) by CrewAI's own key of
        its description and expected output; none: ``crew``."""
        if task is None:
            return "crew"
        for n, listed in enumerate(self.crew.tasks, start=1):
            if listed is task:
                return f"t{n}"
        return f"task-{task.key}"

    def _next(self, counter: str) -> int:
        with self.lock:
            self.counts[counter] = self.counts.get(counter, 0) + 1
            return self.counts[counter]

    def model_key(self, task: Any) -> str:
        """The next model call's key: its task and its turn within the task."""
        label = self.task_label(task)
        return f"{self.base}:{label}:model:{self._next(f'{label}:model')}"

    def tool_key(self, task: Any, tool: str, arguments: Any) -> str:
        """A tool call's key: the task, the tool, a digest of its arguments as
        canonical JSON, and its occurrence among the task's calls of that tool
        with those arguments. It cannot tell apart two calls of one tool with
        the same arguments in one task other than by their order: the n-th
        such call gets the n-th such record, whichever model turn asked for it."""
        label = self.task_label(task)
        canonical = json.dumps(arguments, sort_keys=True, separators=(",", ":"))
        digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        call = f"{label}:tool:{tool}:{digest}"
        return f"{self.base}:{call}:{self._next(call)}"


#: The crew run the calls of this context belong to (set by ``kickoff``).
BOUND: contextvars.ContextVar[Binding] = contextvars.ContextVar("charter_crewai")


def bound() -> Binding:
    """The crew run this call belongs to (set by :func:`kickoff`)."""
    found = BOUND.get(None)
    if found is None:
        raise StateError(
            "governed CrewAI calls are made inside a crew run by "
            "charter.integrations.crewai.kickoff from a node"
        )
    return found


@dataclasses.dataclass(frozen=True)
class _Call:
    messages: Any
    tools: Any
    callbacks: Any
    task: Any
    agent: Any
    response_model: Any


_LIVE: contextvars.ContextVar[_Call] = contextvars.ContextVar("charter_crewai_model")


class CrewModel(BaseLLM):  # type: ignore[misc,unused-ignore]
    """The LLM to give an agent: each call an attempt ``<name>.chat`` of the
    node running the crew, answered from the record live and on replay.

    ``inner``: the CrewAI LLM that makes the call, with ``max_retries=0``
    (every request that leaves is an attempt) and ``max_tokens`` (the
    estimate's output bound). ``units``, ``lookup`` (a usage lookup by key, for
    ``reconcile``), ``input_bound`` and ``key_header`` are the model adapters'.
    """

    inner: Any
    name: str = "chat"
    units: Any = None
    lookup: Any = None
    input_bound: Any = None
    key_header: str = "Idempotency-Key"
    _pricing: Pricing | None = PrivateAttr(default=None)
    _counting: threading.Lock = PrivateAttr(default_factory=threading.Lock)

    def __init__(self, inner: Any, **options: Any) -> None:
        if not isinstance(inner, BaseLLM) or isinstance(inner, CrewModel):
            raise ConfigError(f"{type(inner).__name__} is not a CrewAI LLM to wrap")
        if getattr(inner, "max_retries", 0) != 0:
            raise ConfigError(
                f"{type(inner).__name__} retries on its own; build it with max_retries=0: "
                "every request that leaves is an attempt"
            )
        if getattr(inner, "stream", False):
            raise ConfigError("a streamed LLM is not governed call by call; build it unstreamed")
        super().__init__(model=inner.model, provider=inner.provider, inner=inner, **options)

    @property
    def operations(self) -> Mapping[str, Operation]:
        return {"chat": Operation(EffectClass.READ_ONLY)}

    @property
    def pricing(self) -> Pricing:
        if self._pricing is None:
            self._pricing = Pricing(str(self.inner.provider), self.units or ModelUnits())
        return self._pricing

    def supports_function_calling(self) -> bool:
        return bool(self.inner.supports_function_calling())

    def supports_stop_words(self) -> bool:
        return bool(self.inner.supports_stop_words())

    def get_context_window_size(self) -> int:
        return int(self.inner.get_context_window_size())

    def request(self, call: _Call) -> dict[str, Any]:
        """The call as recorded and hashed, each part from its allow-list."""
        messages = call.messages
        if isinstance(messages, str):
            messages = [{"role": "user", "content": messages}]
        inner = self.inner
        settings = {n: getattr(inner, n, None) for n in SETTINGS}
        asked = settings["response_format"]
        if isinstance(asked, type) and issubclass(asked, BaseModel):
            settings["response_format"] = asked.model_json_schema()
        extra = {k: v for k, v in inner.additional_params.items() if k != "extra_headers"}
        model = call.response_model
        return {
            "provider": str(inner.provider),
            "model": str(inner.model),
            "messages": MESSAGES.project(list(messages)),
            "tools": MESSAGES.project(list(call.tools or [])),
            "settings": {k: v for k, v in {**settings, **extra}.items() if v is not None},
            "stop": list(self.stop_sequences),
            "max_tokens": getattr(inner, "max_completion_tokens", None) or inner.max_tokens,
            "response_model": None if model is None else model.model_json_schema(),
        }

    def estimate(self, operation: str, request: Any) -> Estimate:
        limit = max_tokens(request, ("max_tokens",), f"{self.name}.{operation}")
        return self.pricing.estimate(request, limit, self.input_bound or input_bound)

    def dispatch(self, send: Dispatch) -> Outcome:
        call = _LIVE.get(None)
        if call is None:
            raise NotApplied(f"{self.name}: no live call here; a crew's agent makes it")
        inner = self.inner
        headers = {
            **(inner.additional_params.get("extra_headers") or {}),
            self.key_header: send.idempotency_key,
        }
        once = inner.model_copy(
            update={
                "additional_params": {**inner.additional_params, "extra_headers": headers},
                "stop": list(send.request["stop"]),
            }
        )
        # CrewAI wraps an LLM's call in a rate-limit retry: the request is made once.
        make = getattr(type(once).call, "__wrapped__", type(once).call)
        send.check_deadline()
        # The copy counts usage in its LLM's counters: this call's is what they
        # grew by while it was the only one made through them.
        with self._counting:
            before = once.get_token_usage_summary()
            try:
                answer = make(
                    once,
                    call.messages,
                    tools=call.tools,
                    callbacks=call.callbacks,
                    available_functions=None,
                    from_task=call.task,
                    from_agent=call.agent,
                    response_model=call.response_model,
                )
            except Exception as exc:
                _refused_or_raise(exc)
            used = once.get_token_usage_summary().delta_since(before)
        return self._outcome(send, _recorded(answer), used)

    def _outcome(self, send: Dispatch, recorded: Any, used: Any) -> Outcome:
        if not used.successful_requests:  # no usage reported: it costs its bound
            bound_ = self.estimate(send.operation, send.request)
            receipt = {"usage": "not reported: charged the estimate"}
            return Outcome.succeeded(recorded, cost=bound_.amounts, receipt=receipt)
        usage = Usage(
            send.request["model"],
            used.prompt_tokens,
            used.completion_tokens,
            cache_read=used.cached_prompt_tokens,
        )
        return self.pricing.outcome(recorded, usage, {"model": usage.model})

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return self.pricing.reconcile(attempt, self.lookup)

    def resolved_result(self, operation: str, outcome: str, result: Any) -> Any:
        """A person's ``result=`` for a model call: the answer as recorded
        (``{"content": text}`` or ``{"tool_calls": [...]}``), or nothing (the
        call is made again, N6)."""
        shape = isinstance(result, dict) and len(result) == 1 and next(iter(result)) in ANSWERS
        if outcome == "succeeded" and result is not None and not shape:
            raise UsageError(
                f"the result of a {self.name}.{operation} call is one of "
                f"{{'content': text}}, {{'tool_calls': [...]}} or {{'parsed': {{...}}}}",
                field="result",
            )
        return result

    def call(  # noqa: PLR0917 - CrewAI's LLM interface
        self,
        messages: Any,
        tools: Any = None,
        callbacks: Any = None,
        available_functions: Any = None,
        from_task: Any = None,
        from_agent: Any = None,
        response_model: Any = None,
    ) -> Any:
        """One model call as an attempt of the node running the crew: the
        answer CrewAI reads, from the record."""
        if available_functions:
            raise ConfigError(
                "a model call that runs tools itself (available_functions) would run them "
                "outside their attempts; let the agent's executor call the tools"
            )
        binding = bound()
        live = _Call(messages, tools, callbacks, from_task, from_agent, response_model)
        request = self.request(live)
        token = _LIVE.set(live)
        try:
            recorded = binding.ctx.attempt(self, "chat", request, key=binding.model_key(from_task))
        finally:
            _LIVE.reset(token)
        return _answer(recorded, response_model)


def _recorded(answer: Any) -> dict[str, Any]:
    """What CrewAI's LLM answered, as recorded."""
    if isinstance(answer, str):
        return {"content": answer}
    if isinstance(answer, list):
        calls = [c.model_dump(mode="json") if isinstance(c, BaseModel) else c for c in answer]
        return {"tool_calls": [MESSAGES.project({"type": "function", **c}) for c in calls]}
    if isinstance(answer, BaseModel):
        return {"parsed": answer.model_dump(mode="json")}
    raise TypeError(f"a CrewAI LLM answered a {type(answer).__name__}")


def _answer(recorded: Mapping[str, Any], response_model: Any) -> Any:
    """The recorded answer as CrewAI reads it: text, the tool calls as OpenAI's
    dicts, or the structured output."""
    if "parsed" in recorded:
        return response_model.model_validate(recorded["parsed"])
    if "tool_calls" in recorded:
        return [dict(c) for c in recorded["tool_calls"]]
    return recorded["content"]


def _refused_or_raise(exc: Exception) -> Any:
    """CrewAI wraps the provider's error (a connection error as
    ``ConnectionError``, a missing model as ``ValueError``): read the one that
    says what happened."""
    for cause in _chain(exc):
        if getattr(cause, "status_code", None) is not None or type(cause.__cause__).__name__ == (
            "ConnectError"
        ):
            refused_or_raise(cause)
    raise exc


def _chain(exc: BaseException) -> list[Exception]:
    found: list[Exception] = []
    current: BaseException | None = exc
    while isinstance(current, Exception) and current not in found:
        found.append(current)
        current = current.__cause__ or current.__context__
    return found
