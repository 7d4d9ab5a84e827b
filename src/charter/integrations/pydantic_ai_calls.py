"""What a PydanticAI model request records: the allow-list of the fields that
define it (see :mod:`charter.integrations.fields` for why an allow-list).

Needs the ``pydantic-ai`` extra; :mod:`charter.integrations.pydantic_ai` is
the integration that records them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pydantic_core import to_jsonable_python

from charter.integrations.fields import Shapes

_CALL = {"tool_name": False, "tool_call_id": False, "args": False}
_RETURN = {"tool_name": False, "tool_call_id": False, "content": False}
_TEXT = {"content": False}

#: What a model request's messages record, by kind: each message's parts and
#: instructions; each part's text, tool call (name, id, arguments) or tool
#: return (name, id, value, outcome); a user prompt's content, media by its
#: URL or bytes. Never when a message was made, which run made it, the
#: provider's ids, usage, timings or anything a later release adds.
MESSAGES = Shapes(
    "PydanticAI message or message part",
    ("part_kind", "kind"),
    {
        "request": {"parts": True, "instructions": False},
        "response": {"parts": True},
        "system-prompt": _TEXT,
        "user-prompt": {"content": True},
        "instruction": _TEXT,
        "text": _TEXT,
        "thinking": _TEXT,
        "retry-feedback": _TEXT,
        "compaction": _TEXT,
        "tool-call": _CALL,
        "builtin-tool-call": _CALL,
        "tool-return": {**_RETURN, "outcome": False},
        "builtin-tool-return": _RETURN,
        "retry-prompt": _RETURN,
        "file": {"content": True},
        "text-content": _TEXT,
        "image-url": {"url": False},
        "audio-url": {"url": False},
        "video-url": {"url": False},
        "document-url": {"url": False},
        "binary": {"data": False, "media_type": False},
        "uploaded-file": {"file_id": False},
        "cache-point": {},
    },
)

#: What a tool definition records: its name, description and arguments' schema.
_TOOL = {"name": False, "description": False, "parameters_json_schema": False, "strict": False}
TOOLS = Shapes(
    "PydanticAI tool definition",
    ("kind",),
    dict.fromkeys(("function", "output", "external", "unapproved"), _TOOL),
)

#: What a request's parameters record: its tools, and the output it asks for.
_PARAMETERS = {
    "function_tools": True,
    "output_tools": True,
    "output_mode": False,
    "output_object": False,
    "allow_text_output": False,
    "allow_image_output": False,
    "native_tools": False,
    "thinking": False,
}

#: The model settings that change the answer (besides those of the model's own
#: provider, ``<provider>_...``): not timeouts, retries, headers or tiers.
SETTINGS = frozenset(
    {
        "max_tokens",
        "temperature",
        "top_p",
        "top_k",
        "parallel_tool_calls",
        "tool_choice",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "stop_sequences",
        "thinking",
        "extra_body",
    }
)


def json_of(value: Any) -> Any:
    """PydanticAI's objects as JSON, as its own codec writes them."""
    return to_jsonable_python(value, fallback=repr)


def model_call(provider: str, model: str, settings: Mapping[str, Any], params: Any) -> Any:
    """A model request as recorded: the model, the settings that change its
    answer, its messages and its parameters, each from its allow-list."""
    chosen = {k: v for k, v in settings.items() if k in SETTINGS or k.startswith(f"{provider}_")}
    return {
        "provider": provider,
        "model": model,
        "settings": json_of(chosen),
        "messages": MESSAGES.project(json_of(params.messages)),
        "parameters": TOOLS.pick(json_of(params.model_request_parameters), _PARAMETERS),
    }
