"""A call: one intended effect, checked and estimated before admission (A1, A6).

What is recorded of a request is its canonical JSON, with each secret as its
name only (S3), and its hash is the request's identity on replay (A6). So a
request must read back exactly as it was sent: JSON-serialisable, string keys
only, no key that would read back as a secret.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from charter import secret
from charter.adapters import Adapter, EffectClass, Estimate
from charter.errors import AdapterError, AdmissionRefused
from charter.hashing import digest, json_encoder
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
