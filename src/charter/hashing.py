"""Hashing for the audit chains (S1): canonical JSON, digests, event hashes.

Pure arithmetic with no store behind it, so the storage layer, which appends
events, and the audit room, which verifies them, share one definition of what
an event's hash covers.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any

#: Where every chain began before schema 6 (see :func:`genesis`).
LEGACY_GENESIS = "0" * 64

#: Missions are chains; refusals that concern no mission go on this chain.
ENGINE_CHAIN = "engine"

#: CPython's C JSON encoder, made once per encoding (``JSONEncoder.encode`` makes it
#: anew on each call: 4% of an attempt's instructions).
_C_ENCODER = getattr(json.encoder, "c_make_encoder", None)


def json_encoder(default: Callable[[Any], Any], *, allow_nan: bool = True) -> Callable[[Any], str]:
    """Canonical JSON (sorted keys, no whitespace, ASCII), ``default`` giving what
    JSON cannot hold; with ``allow_nan=False`` NaN and infinities are a ValueError.

    The encoder keeps no record of the containers it is inside (a failed call
    would leave that record behind for the next): a value that contains itself is
    found by the depth it reaches, and is a ValueError as with ``json.dumps``.
    """
    if _C_ENCODER is None:  # pragma: no cover - an interpreter without the C encoder
        slow = json.JSONEncoder(
            sort_keys=True, separators=(",", ":"), allow_nan=allow_nan, default=default
        )
        return slow.encode
    fast = _C_ENCODER(
        None, default, json.encoder.encode_basestring_ascii, None, ":", ",", True, False, allow_nan
    )

    def encode(value: Any) -> str:
        try:
            return "".join(fast(value, 0))
        except RecursionError:
            raise ValueError("Circular reference detected (or nesting too deep)") from None

    return encode


#: Deterministic JSON: sorted keys, no whitespace; what JSON cannot hold, as its text.
canonical = json_encoder(str)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


#: The largest value (bytes of canonical JSON) an audit event carries itself;
#: a larger one is already stored in its own row (an attempt's result, its
#: evidence), and the event carries its SHA-256 and length (A10, S1).
INLINE_BYTES = 4096

#: The key of a value an audit event carries by reference.
STORED = "$stored"


def dumped(value: Any) -> str | None:
    """``value``'s canonical JSON, ``None`` for ``None``: how a value is stored."""
    return None if value is None else canonical(value)


def by_reference(value: Any, text: str | None = None) -> Any:
    """``value`` as an audit event carries it: itself, or when over
    :data:`INLINE_BYTES` its SHA-256 and length, so that an answer is stored
    once (in its row) and the chain still binds it. ``text``: its canonical
    JSON, when the caller has it already (see :func:`dumped`)."""
    if value is None or isinstance(value, bool | int | float):
        return value
    if text is None:
        text = canonical(value)  # ASCII: its length is its size in bytes
    if len(text) <= INLINE_BYTES:
        return value
    return {STORED: {"sha256": digest(text), "bytes": len(text)}}


def genesis(chain: str) -> str:
    """The hash a chain starts from: derived from its mission's id, so that a
    chain moved whole to another mission breaks at its first event."""
    return digest(canonical({"genesis": chain}))


def event_hash(prev_hash: str, fields: Mapping[str, Any]) -> str:
    """The chained hash of one event."""
    return digest(prev_hash + canonical(fields))


def checkpoint_statement(chain: str, seq: int, hash_: str | None) -> bytes:
    """What a signed checkpoint of a chain's head signs (S2)."""
    return canonical({"chain": chain, "hash": hash_, "seq": seq}).encode()


#: How an escrow slice's id begins (L10): a slice is a chain of its own, its head
#: on its row in ``escrow_slices``. Missions' ids begin otherwise (``mis_``).
SLICE_PREFIX = "esc_"


def head_table(chain: str) -> str:
    """The table whose row keeps ``chain``'s head: the mission's own row, an escrow
    slice's row for a slice's chain, or for the engine chain (which concerns no
    mission) its row in ``audit_chains``."""
    if chain == ENGINE_CHAIN:
        return "audit_chains"
    return "escrow_slices" if chain.startswith(SLICE_PREFIX) else "missions"


#: What an event's hash covers (with the previous event's hash).
HASHED_FIELDS = (
    "mission_id",
    "seq",
    "at_us",
    "actor",
    "segment",
    "epoch",
    "kind",
    "entity",
    "before",
    "after",
    "payload_hash",
)
#: What it covered before schema 6: not the mission's id.
LEGACY_HASHED_FIELDS = HASHED_FIELDS[1:]
