"""A call: one intended effect, checked and estimated before admission (A1, A6).

What is recorded of a request is its canonical JSON, with each secret as its
name only (S3), and its hash is the request's identity on replay (A6). So a
request must read back exactly as it was sent: JSON-serialisable, string keys
only, no key that would read back as a secret, and Unicode text (A10): a lone
surrogate is refused, since no adapter can encode it (the attempt would be
left uncertain with nothing sent). A NUL in a request is kept: the recorded
JSON holds it as ``\u0000`` on every store.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from charter import secret
from charter.adapters import Adapter, EffectClass, Estimate
from charter.errors import AdapterError, AdmissionRefused
from charter.hashing import digest, json_encoder
from charter.ids import problem, refusal
from charter.secret import Secret

#: Requests are recorded as canonical JSON; NaN and infinities are refused.
#: Requests are recorded (and hashed) with each secret as its name only (S3).
encode_request = json_encoder(secret.placeholder, allow_nan=False)


@dataclass(frozen=True)
class Call:
    """One intended effect, before admission: what the caller asked for."""

    adapter: Adapter
    operation: str
    request: Any
    request_json: str
    request_hash: str
    effect_class: EffectClass
    estimate: Estimate

    @property
    def scope(self) -> str:
        return f"{self.adapter.name}.{self.operation}"

    @property
    def secrets(self) -> list[Secret]:
        """The request's secrets (S3); found without a search when it has none."""
        if f'"{secret.MARK}"' not in self.request_json:
            return []
        return list(secret.found(self.request))


def request_hash(adapter: str, operation: str, request_json: str) -> str:
    """The identity of a request: adapter, operation and canonical JSON body."""
    return digest(f"{adapter}\n{operation}\n{request_json}")


def prepare(adapter: Adapter, operation: str, request: Any) -> Call:
    """Validate a call and estimate it, outside any transaction."""
    spec = adapter.operations.get(operation)
    if spec is None:
        raise AdmissionRefused(
            f"adapter {adapter.name!r} has no operation {operation!r}; it declares "
            f"{sorted(adapter.operations)}",
            adapter=adapter.name,
            operation=operation,
        )
    try:
        request_json = encode_request(request)
    except (TypeError, ValueError) as exc:
        raise AdmissionRefused(
            f"the request for {adapter.name}.{operation} must be JSON-serialisable ({exc}); "
            "it is recorded before it is sent"
        ) from None
    if "\\ud" in request_json:  # a surrogate's escape: a pair, or one alone
        _refuse_surrogates(f"the request for {adapter.name}.{operation}", request)
    if not _text_keys(request):
        raise AdmissionRefused(
            f"the request for {adapter.name}.{operation} has a key that is not a string; "
            "it is recorded as JSON, where {1: x} and {'1': x} are one request, so a send "
            "rebuilt from the record would differ from the first: use string keys"
        )
    if f'"{secret.MARK}"' in request_json and secret.has_reserved_key(request):
        raise AdmissionRefused(
            f"the request for {adapter.name}.{operation} uses the key {secret.MARK!r}, "
            "which marks a recorded secret; wrap secret values in charter.Secret instead"
        )
    estimate = adapter.estimate(operation, request)
    if not isinstance(estimate, Estimate):
        raise AdapterError(f"adapter {adapter.name!r} estimate() must return an Estimate")
    return Call(
        adapter,
        operation,
        request,
        request_json,
        request_hash(adapter.name, operation, request_json),
        spec.effect,
        estimate,
    )


def _text_keys(value: Any) -> bool:
    """Whether every mapping key in ``value`` is a string (JSON would silently
    turn the others into strings, and a record would not read back as sent)."""
    if isinstance(value, dict):
        return all(isinstance(k, str) and _text_keys(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return all(_text_keys(v) for v in value)
    return True


def _refuse_surrogates(where: str, value: Any, path: str = "$") -> None:
    """Refuse the first text in ``value`` (key or value) holding a lone surrogate."""
    texts: list[tuple[str, str]] = []
    if isinstance(value, str):
        texts = [(f"at {path}", value)]
    elif isinstance(value, Secret):
        texts = [(f"a secret's name at {path}", value.name)]
    elif isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str):
                texts.append((f"a key in {path}", k))
            _refuse_surrogates(where, v, f"{path}[{k!r}]")
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            _refuse_surrogates(where, v, f"{path}[{i}]")
    for at, text in texts:
        found = problem(text)
        if found is not None and found[0] == "surrogate":
            raise refusal(f"{where}, {at}", text, found)
