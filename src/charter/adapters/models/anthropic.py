"""The Anthropic Messages API as an async adapter.

Built on the official SDK (extra ``charter[anthropic]``) with its retries off
(``max_retries=0``) and the attempt's idempotency key sent with each request.
``"stream": true`` in a request streams it. The SDK lets a transport error in
the middle of a stream reach the caller unwrapped; whatever the error, a
stream cut off is UNKNOWN with the usage it had reported (the input tokens
from ``message_start``, the output tokens so far from ``message_delta``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from charter.adapters import Dispatch, Evidence, Outcome
from charter.adapters.models.base import ModelAdapter
from charter.adapters.models.pricing import Usage
from charter.adapters.models.refusals import refused_or_raise, unknown_stream
from charter.adapters.protocol import RecordedAttempt
from charter.errors import MissingExtra


def _anthropic() -> Any:
    try:
        import anthropic  # noqa: PLC0415 - an optional extra, loaded when an adapter is built
    except ImportError:
        raise MissingExtra(
            "the Anthropic adapter needs the anthropic SDK: pip install 'charter[anthropic]'",
            extra="anthropic",
        ) from None
    return anthropic


class AnthropicModels(ModelAdapter):
    """Messages (``messages``), ``read_only``; the arguments as for
    :class:`~charter.adapters.models.openai.OpenAIModels`."""

    provider = "anthropic"
    default_name = "anthropic"
    limits: Mapping[str, tuple[str, ...]] = {"messages": ("max_tokens",)}
    _load = staticmethod(_anthropic)

    @staticmethod
    def _connect(sdk: Any, *, base_url: str | None, api_key: str | None, timeout: float) -> Any:
        return sdk.AsyncAnthropic(base_url=base_url, api_key=api_key, timeout=timeout)

    async def _send(self, client: Any, send: Dispatch) -> Outcome:
        body = dict(send.request)
        stream = bool(body.pop("stream", False))
        send.check_deadline()
        try:
            answer = await client.messages.create(
                **body, stream=stream, extra_headers={self.key_header: send.idempotency_key}
            )
        except Exception as exc:
            refused_or_raise(exc)
        if not stream:
            return self._outcome(answer.model_dump(mode="json"))
        seen = _Assembly()
        try:
            async for event in answer:
                seen.add(event.model_dump(mode="json"))
        except Exception as exc:  # the SDK lets raw transport errors through
            raise unknown_stream(exc, seen.partial()) from exc
        if not seen.stopped:
            raise unknown_stream(ConnectionError("the stream ended early"), seen.partial())
        return self._outcome(seen.message)

    def _outcome(self, message: dict[str, Any]) -> Outcome:
        used = _usage(str(message.get("model", "")), message.get("usage") or {})
        return self.pricing.outcome(message, used, {"id": message.get("id"), "model": used.model})

    def reconcile(self, attempt: RecordedAttempt) -> Evidence:
        return self.pricing.reconcile(attempt, self.lookup)


def _usage(model: str, usage: Mapping[str, Any]) -> Usage:
    """Anthropic counts cached input apart; :class:`Usage` counts all input."""
    read = int(usage.get("cache_read_input_tokens") or 0)
    write = int(usage.get("cache_creation_input_tokens") or 0)
    return Usage(
        model,
        int(usage.get("input_tokens") or 0) + read + write,
        int(usage.get("output_tokens") or 0),
        cache_read=read,
        cache_write=write,
    )


class _Assembly:
    """A message stream's events, put together as the non-streamed message."""

    def __init__(self) -> None:
        self.message: dict[str, Any] = {}
        self.events = 0
        self.stopped = False
        self._json: dict[int, list[str]] = {}

    def add(self, event: dict[str, Any]) -> None:
        self.events += 1
        kind = event.get("type")
        if kind == "message_start":
            self.message = {**event["message"], "content": []}
        elif kind == "content_block_start":
            self.message["content"].append(dict(event["content_block"]))
        elif kind == "content_block_delta":
            block = self.message["content"][event["index"]]
            delta = event["delta"]
            if delta.get("type") == "text_delta":
                block["text"] = block.get("text", "") + delta["text"]
            elif delta.get("type") == "input_json_delta":
                self._json.setdefault(event["index"], []).append(delta["partial_json"])
        elif kind == "content_block_stop" and event["index"] in self._json:
            text = "".join(self._json.pop(event["index"]))
            self.message["content"][event["index"]]["input"] = json.loads(text or "{}")
        elif kind == "message_delta":
            self.message.update({k: v for k, v in event["delta"].items() if v is not None})
            usage = dict(self.message.get("usage") or {})
            usage.update({k: v for k, v in (event.get("usage") or {}).items() if v is not None})
            self.message["usage"] = usage
        elif kind == "message_stop":
            self.stopped = True

    def partial(self) -> dict[str, Any]:
        return {
            "events": self.events,
            "id": self.message.get("id"),
            "model": self.message.get("model"),
            "usage": self.message.get("usage"),
        }
