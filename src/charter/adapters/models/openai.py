"""The OpenAI API as an async adapter: chat completions and responses.

Built on the official SDK (extra ``charter[openai]``) with its retries off
(``max_retries=0``): with them, a 500 returned after the provider billed the
call is sent again and looks like one success while it was billed twice. The
attempt's idempotency key is sent with each request, never fixed on the
client (a fixed one would make a key-honouring provider answer every turn
with the first). ``"stream": true`` in a request streams it; the result is the
assembled answer, and a stream cut off is UNKNOWN with what it had reported.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from charter.adapters import Dispatch, Evidence, Outcome
from charter.adapters.models.base import ModelAdapter
from charter.adapters.models.pricing import (
    Usage,
)
from charter.adapters.models.refusals import refused_or_raise, unknown_stream
from charter.adapters.protocol import RecordedAttempt
from charter.errors import MissingExtra

#: The output limit each operation's request names.
_LIMITS = {"chat": ("max_completion_tokens", "max_tokens"), "responses": ("max_output_tokens",)}


def _openai() -> Any:
    try:
        import openai  # noqa: PLC0415 - an optional extra, loaded when an adapter is built
    except ImportError:
        raise MissingExtra(
            "the OpenAI adapter needs the openai SDK: pip install 'charter[openai]'",
            extra="openai",
        ) from None
    return openai


class OpenAIModels(ModelAdapter):
    """Chat completions (``chat``) and responses (``responses``), both ``read_only``.

    ``client``: an ``openai.AsyncOpenAI`` (its retries are turned off here),
    or one is made from ``base_url`` and ``api_key``. ``lookup``: what the
    provider billed for a key, for reconciling a lost answer (see
    :data:`~charter.adapters.models.pricing.UsageLookup`); without it a
    person decides. ``input_bound``: an upper bound on a request's input
    tokens, for requests with images or files.
    """

    provider = "openai"
    default_name = "openai"
    limits = _LIMITS
    _load = staticmethod(_openai)

    @staticmethod
    def _connect(sdk: Any, *, base_url: str | None, api_key: str | None, timeout: float) -> Any:
        return sdk.AsyncOpenAI(base_url=base_url, api_key=api_key, timeout=timeout)

    async def _send(self, client: Any, send: Dispatch) -> Outcome:
        body = dict(send.request)
        stream = bool(body.pop("stream", False))
        headers = {self.key_header: send.idempotency_key}
        chat = send.operation == "chat"
        create = client.chat.completions.create if chat else client.responses.create
        if stream and chat:
            body["stream_options"] = {"include_usage": True}
        send.check_deadline()
        try:
            answer = await create(**body, stream=stream, extra_headers=headers)
        except Exception as exc:
            refused_or_raise(exc)
        if not stream:
            data = answer.model_dump(mode="json")
            return self._outcome(data, data.get("usage"), send.operation)
        return await self._streamed(answer, send.operation)

    async def _streamed(self, stream: Any, operation: str) -> Outcome:
        seen = _Assembly(operation)
        try:
            async for event in stream:
                seen.add(event.model_dump(mode="json"))
        except Exception as exc:
            raise unknown_stream(exc, seen.partial()) from exc
        if seen.done is None:
            raise unknown_stream(ConnectionError("the stream ended early"), seen.partial())
        return self._outcome(seen.done, seen.done.get("usage"), operation)

    def _outcome(self, data: dict[str, Any], usage: Any, operation: str) -> Outcome:
        used = _usage(str(data.get("model", "")), usage or {}, operation)
        return self.pricing.outcome(data, used, {"id": data.get("id"), "model": used.model})

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return self.pricing.reconcile(attempt, self.lookup)


def _usage(model: str, usage: Mapping[str, Any], operation: str) -> Usage:
    """The SDK's usage (chat: prompt/completion tokens; responses: input/output)."""
    if operation == "chat":
        details = usage.get("prompt_tokens_details") or {}
        return Usage(
            model,
            int(usage.get("prompt_tokens") or 0),
            int(usage.get("completion_tokens") or 0),
            cache_read=int(details.get("cached_tokens") or 0),
        )
    details = usage.get("input_tokens_details") or {}
    return Usage(
        model,
        int(usage.get("input_tokens") or 0),
        int(usage.get("output_tokens") or 0),
        cache_read=int(details.get("cached_tokens") or 0),
    )


class _Assembly:
    """A stream's events, put together as the non-streamed answer would read."""

    def __init__(self, operation: str) -> None:
        self.operation = operation
        self.events = 0
        self.text: list[str] = []
        self.head: dict[str, Any] = {}
        self.done: dict[str, Any] | None = None

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        if self.operation == "responses":
            if event.get("type") == "response.output_text.delta":
                self.text.append(str(event.get("delta", "")))
            elif event.get("type") in ("response.created", "response.in_progress"):
                self.head = event.get("response") or {}
            elif event.get("type") == "response.completed":
                self.done = event.get("response")
            return
        self.head = self.head or {k: event.get(k) for k in ("id", "model", "created")}
        for choice in event.get("choices") or []:
            self.text.append(str((choice.get("delta") or {}).get("content") or ""))
            self.head["finish_reason"] = choice.get("finish_reason") or self.head.get(
                "finish_reason"
            )
        if event.get("usage"):  # the last chunk, with include_usage
            message = {"role": "assistant", "content": "".join(self.text)}
            choice = {"index": 0, "message": message, "finish_reason": self.head["finish_reason"]}
            self.done = {**self.head, "object": "chat.completion", "choices": [choice]}
            self.done["usage"] = event["usage"]

    def partial(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "model": self.head.get("model"),
            "id": self.head.get("id"),
            "text_chars": sum(len(t) for t in self.text),
            "usage": None,  # OpenAI reports usage only at the end of a stream
        }
