"""A fake model provider on loopback, speaking the OpenAI and Anthropic wire formats.

Chat completions, responses and messages, plain and streamed (SSE over chunked
HTTP/1.1), with the faults the model adapters must survive: a 500 after the
call was billed, an answer lost after billing, a stream cut off mid-chunk. It
records every request as received and what it billed per idempotency key, and
answers ``GET /v1/_usage/<key>`` with that usage (a stand-in for a provider's
usage lookup). Never the network.
"""

from __future__ import annotations

import json
import socket
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import httpx

from charter.adapters.models import Usage
from charter.sandbox.server import POLL_SECONDS

INPUT, OUTPUT = 12, 7
WORDS = ["hel", "lo ", "there"]


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: Any


@dataclass
class FakeProvider:
    """``faults``: consumed one per request, in order ('500_after_billing',
    'drop_after_billing', 'cut_stream'); ``None`` or an empty list: answer.
    ``chat``: the assistant message a chat completion answers, from the
    request's body (an agent's turns: tool calls, then text); by default, text.
    ``script``: a function of (kind, request) giving the answer's output in place
    of the fixed text (an agent's tool calls), for plain (unstreamed) requests."""

    faults: list[str | None] = field(default_factory=list)  # also '401_quoting_key'
    chat: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    script: Callable[[str, Any], Any] | None = None
    received: list[Received] = field(default_factory=list)
    billed: dict[str, dict[str, Any]] = field(default_factory=dict)
    url: str = ""

    def __enter__(self) -> FakeProvider:
        provider = self

        class Handler(_Handler):
            fake = provider

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(
            target=self._server.serve_forever, args=(POLL_SECONDS,), daemon=True
        ).start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def lookup(self, key: str) -> Usage | None:
        """The adapters' ``lookup``: what this provider billed for ``key``."""
        response = httpx.get(f"{self.url}/v1/_usage/{key}")
        if response.status_code == 404:
            return None
        return Usage(**response.json())

    def keys(self) -> list[str | None]:
        return [r.headers.get("idempotency-key") for r in self.received]


class _Handler(BaseHTTPRequestHandler):
    fake: FakeProvider
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_GET(self) -> None:
        key = self.path.rsplit("/", 1)[-1]
        usage = self.fake.billed.get(key)
        if usage is None:
            self._json(404, {"error": "no usage for this key"})
        else:
            self._json(200, usage)

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        headers = {k.lower(): v for k, v in self.headers.items()}
        self.fake.received.append(Received(self.path, headers, body))
        fault = self.fake.faults.pop(0) if self.fake.faults else None
        model = body["model"]
        key = headers.get("idempotency-key", "")
        if fault not in ("cut_stream", "401_quoting_key"):
            self.fake.billed[key] = {"model": model, "input_tokens": INPUT, "output_tokens": OUTPUT}
        if fault == "401_quoting_key":  # a refusal that quotes the credential back
            quoted = headers.get("authorization", "").removeprefix("Bearer ")
            message = f"Incorrect API key provided: {quoted}"
            self._json(401, {"error": {"message": message, "type": "invalid_request_error"}})
            return
        if fault == "slow_after_billing":  # past the adapter's timeout
            time.sleep(2.0)
        if fault in ("echo_key_after_billing", "huge_after_billing"):
            quoted = headers.get("authorization", "").removeprefix("Bearer ")
            answer = _answer(self.path.rsplit("/", 1)[-1], model)
            answer["echo"] = quoted if fault.startswith("echo") else "x" * (50 << 20)
            self._json(200, answer)
            return
        if fault == "500_after_billing":
            self._json(500, {"error": {"message": "internal error", "type": "server_error"}})
            return
        if fault == "drop_after_billing":
            self._drop()
            return
        kind = self.path.rsplit("/", 1)[-1]  # completions, responses, messages
        if not body.get("stream"):
            answer = _answer(kind, model)
            if kind == "completions" and self.fake.chat is not None:
                message = self.fake.chat(body)
                finish = "tool_calls" if message.get("tool_calls") else "stop"
                answer["choices"] = [{"index": 0, "message": message, "finish_reason": finish}]
            if self.fake.script is not None:
                answer["output"] = self.fake.script(kind, body)
            self._json(200, answer)
            return
        events = list(_events(kind, model))
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        for n, (name, data) in enumerate(events):
            if fault == "cut_stream" and n == 2:
                so_far = 2 if kind == "messages" else 0
                self.fake.billed[key] = {
                    "model": model,
                    "input_tokens": INPUT,
                    "output_tokens": so_far,
                }
                self.wfile.write(b"ffff\r\nevent: content_block_delta\ndata: {")  # then gone
                self.wfile.flush()
                self._drop()
                return
            self._chunk(f"event: {name}\ndata: {json.dumps(data)}\n\n" if name else data)
        self.wfile.write(b"0\r\n\r\n")

    def _chunk(self, text: str) -> None:
        raw = text.encode()
        self.wfile.write(f"{len(raw):x}\r\n".encode() + raw + b"\r\n")
        self.wfile.flush()

    def _json(self, status: int, data: Any) -> None:
        raw = json.dumps(data).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        self.wfile.write(raw)

    def _drop(self) -> None:
        self.close_connection = True
        self.connection.shutdown(socket.SHUT_RDWR)


def _answer(kind: str, model: str) -> dict[str, Any]:
    text = "".join(WORDS)
    if kind == "completions":
        return {
            "id": "chatcmpl-1",
            "object": "chat.completion",
            "created": 0,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": text},
                    "finish_reason": "stop",
                }
            ],
            "usage": {
                "prompt_tokens": INPUT,
                "completion_tokens": OUTPUT,
                "total_tokens": INPUT + OUTPUT,
            },
        }
    if kind == "responses":
        return {
            "id": "resp_1",
            "object": "response",
            "created_at": 0,
            "model": model,
            "status": "completed",
            "output": [
                {
                    "type": "message",
                    "id": "msg_1",
                    "status": "completed",
                    "role": "assistant",
                    "content": [{"type": "output_text", "text": text, "annotations": []}],
                }
            ],
            "parallel_tool_calls": True,
            "tool_choice": "auto",
            "tools": [],
            "usage": {
                "input_tokens": INPUT,
                "output_tokens": OUTPUT,
                "total_tokens": INPUT + OUTPUT,
                "input_tokens_details": {"cached_tokens": 0},
                "output_tokens_details": {"reasoning_tokens": 0},
            },
        }
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [{"type": "text", "text": text}],
        "stop_reason": "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": INPUT, "output_tokens": OUTPUT},
    }


def _events(kind: str, model: str) -> Iterator[tuple[str, Any]]:
    """(SSE event name, data); an empty name: a raw SSE text."""
    if kind == "completions":
        head = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 0, "model": model}
        for word in WORDS:
            choice = {"index": 0, "delta": {"content": word}, "finish_reason": None}
            yield "", f"data: {json.dumps({**head, 'choices': [choice]})}\n\n"
        last = {"index": 0, "delta": {}, "finish_reason": "stop"}
        yield "", f"data: {json.dumps({**head, 'choices': [last]})}\n\n"
        usage = {"prompt_tokens": INPUT, "completion_tokens": OUTPUT, "total_tokens": 19}
        yield "", f"data: {json.dumps({**head, 'choices': [], 'usage': usage})}\n\n"
        yield "", "data: [DONE]\n\n"
        return
    if kind == "responses":
        done = _answer("responses", model)
        yield (
            "response.created",
            {
                "type": "response.created",
                "sequence_number": 0,
                "response": {**done, "status": "in_progress", "output": [], "usage": None},
            },
        )
        for n, word in enumerate(WORDS):
            yield (
                "response.output_text.delta",
                {
                    "type": "response.output_text.delta",
                    "sequence_number": n + 1,
                    "item_id": "msg_1",
                    "output_index": 0,
                    "content_index": 0,
                    "delta": word,
                    "logprobs": [],
                },
            )
        yield (
            "response.completed",
            {"type": "response.completed", "sequence_number": 9, "response": done},
        )
        return
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {"input_tokens": INPUT, "output_tokens": 1},
    }
    yield "message_start", {"type": "message_start", "message": message}
    yield (
        "content_block_start",
        {
            "type": "content_block_start",
            "index": 0,
            "content_block": {"type": "text", "text": ""},
        },
    )
    for word in WORDS:
        yield (
            "content_block_delta",
            {
                "type": "content_block_delta",
                "index": 0,
                "delta": {"type": "text_delta", "text": word},
            },
        )
    yield "content_block_stop", {"type": "content_block_stop", "index": 0}
    yield (
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": OUTPUT},
        },
    )
    yield "message_stop", {"type": "message_stop"}


#: The invoice the scripted agent pays (in micro-dollars), and its payee.
INVOICE = {"payee": "gazette", "amount": 4_500_000, "reference": "inv-7"}


def pay_invoice_script(kind: str, body: Any) -> list[dict[str, Any]]:
    """An agent's turns, by how many tool results its request carries: look the
    invoice up, pay it, then say it is paid (a Responses API output)."""
    done = [i for i in body["input"] if i.get("type") == "function_call_output"]
    if len(done) == 0:
        return [function_call("call_invoice", "invoice", {"payee": INVOICE["payee"]})]
    if len(done) == 1:
        return [function_call("call_pay", "pay", INVOICE)]
    text = f"Paid {INVOICE['reference']}."
    return [
        {
            "type": "message",
            "id": "msg_done",
            "status": "completed",
            "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}],
        }
    ]


def function_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """A Responses API output item: the model calls tool ``name``."""
    return {
        "type": "function_call",
        "id": f"fc_{uuid.uuid4().hex}",  # a provider's own id, new in every answer
        "call_id": call_id,
        "name": name,
        "arguments": json.dumps(arguments),
        "status": "completed",
    }
