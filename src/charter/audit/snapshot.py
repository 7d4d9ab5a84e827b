"""Snapshots (S2): a mission's audit chain, state and artifact manifest, signed.

The format, version 1 (``docs/handoff.md`` describes it for readers without
Charter): a gzip-compressed tar (:mod:`~charter.audit.archive`) of

- ``snapshot.json``: the header, canonical JSON: format and version, the
  mission, its chain head, the signing key, the source store, a handover's
  target if any, and the SHA-256 and size of each entry below;
- ``snapshot.sig``: the raw 64-byte Ed25519 signature of ``snapshot.json``'s
  exact bytes (:mod:`~charter.audit.signing`);
- ``audit.jsonl``: the mission's audit events, one per line, as hashed;
- ``state.json``: the mission's records as its store holds them, table by
  table (``TABLES`` names every column and its type);
- ``artifacts.json``: the artifact manifest (SHA-256, size, location), and
  optionally ``artifacts/<sha256>`` entries with their bytes.

The signature covers the header; the header covers every entry by digest and
names the head the chain must end at. So :func:`load` checks, before anything
is written: the archive, the header's format and version, the signature with a
trusted key, every event's schema and the chain from genesis to the signed
head, the digests, every record's schema, and that the state is one mission's
and its ledger holds (L0-L2). The first failure is raised, naming what and where.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from charter.audit import archive, consistency
from charter.audit.chain import verify_events
from charter.audit.model import ChainHead
from charter.audit.signing import Signer, verify
from charter.errors import SnapshotMalformed, SnapshotTampered
from charter.hashing import canonical

FORMAT = "charter-snapshot"
VERSION = 2
#: The versions this engine reads: 1 is 2 without the escrow tables (L10).
READS = (1, 2)

_INT64 = (-(2**63), 2**63 - 1)

#: Every record of ``state.json`` and ``audit.jsonl``: table -> column -> type
#: (``str``/``int``; a trailing ``?`` allows null). The store's rows must have
#: exactly these columns: a schema change is a new format version.
TABLES: dict[str, dict[str, str]] = {
    "missions": dict.fromkeys(("id", "name", "created_by"), "str")
    | dict.fromkeys(("created_at_us", "contract_version", "attempts_admitted"), "int")
    | {"attempts_failed": "int", "audit_seq": "int", "audit_hash": "str?"}
    | {"audit_legacy_seq": "int"},
    "contract_versions": {"mission_id": "str", "version": "int"}
    | dict.fromkeys(("body", "digest", "reason", "created_by"), "str")
    | {"created_at_us": "int"},
    "allowances": {"mission_id": "str", "unit": "str"}
    | dict.fromkeys(("limit_amount", "available", "held", "spent", "overrun"), "int"),
    "ledger_entries": dict.fromkeys(("mission_id", "unit"), "str")
    | {"attempt_id": "str?"}
    | dict.fromkeys(("kind", "source", "target"), "str")
    | {"amount": "int", "price_source": "str?", "at_us": "int"},
    "incidents": dict.fromkeys(("id", "mission_id"), "str")
    | dict.fromkeys(("run_id", "attempt_id"), "str?")
    | dict.fromkeys(("kind", "detail", "status"), "str")
    | {"opened_at_us": "int", "closed_at_us": "int?", "closed_by": "str?", "close_note": "str?"},
    "runs": dict.fromkeys(("id", "mission_id", "principal", "status"), "str")
    | {"status_reason": "str?", "epoch": "int", "owner_segment": "str"}
    | {"lease_expires_us": "int", "recoveries": "int", "linked_from": "str?"}
    | dict.fromkeys(("created_at_us", "updated_at_us"), "int")
    | dict.fromkeys(("plan", "input"), "str?")
    | dict.fromkeys(("n_succeeded", "n_failed", "n_written_off", "n_voided"), "int")
    | dict.fromkeys(("owner_claim", "owner_process"), "str?"),
    "segments": dict.fromkeys(("run_id", "segment_id"), "str")
    | dict.fromkeys(("epoch", "started_at_us", "forced"), "int"),
    "attempts": dict.fromkeys(("id", "mission_id", "run_id", "node_id"), "str")
    | {"execution": "int", "effect_key": "str", "generation": "int"}
    | dict.fromkeys(("adapter", "operation", "effect_class", "status", "principal"), "str")
    | {"admitted_epoch": "int", "dispatched_epoch": "int?"}
    | dict.fromkeys(("idempotency_key", "request_hash", "request", "estimate"), "str")
    | dict.fromkeys(("actual", "result", "receipt", "price_source", "retry_of"), "str?")
    | {"reason": "str?", "send_deadline_us": "int?", "prepared_at_us": "int"}
    | dict.fromkeys(("dispatched_at_us", "settled_at_us"), "int?")
    | {"answered": "int"},
    "evidence": dict.fromkeys(("id", "attempt_id", "mission_id", "source", "verdict"), "str")
    | {"outcome": "str?", "detail": "str?", "epoch": "int?", "actor": "str"}
    | {"recorded_at_us": "int", "settled": "int"},
    "approvals": dict.fromkeys(
        ("id", "mission_id", "run_id", "effect_id", "scope", "request_hash", "status"), "str"
    )
    | {"requested_at_us": "int", "decided_by": "str?"}
    | dict.fromkeys(("decided_at_us", "expires_at_us"), "int?"),
    "node_executions": {"run_id": "str", "node_id": "str", "execution": "int"}
    | {"status": "str", "crashes": "int"}
    | dict.fromkeys(("result", "result_hash", "error"), "str?")
    | dict.fromkeys(("started_epoch", "started_at_us"), "int")
    | {"completed_at_us": "int?", "inherited_run": "str?", "inherited_execution": "int?"},
    "journal": {"run_id": "str", "node_id": "str", "execution": "int", "seq": "int"}
    | {"kind": "str", "value": "str"},
}
EVENT: dict[str, str] = (
    {"mission_id": "str", "seq": "int", "at_us": "int", "actor": "str"}
    | {"segment": "str?", "epoch": "int?"}
    | dict.fromkeys(("kind", "entity"), "str")
    | dict.fromkeys(("before", "after"), "str?")
    | dict.fromkeys(("payload", "payload_hash", "prev_hash", "hash"), "str")
)
#: Version 2: the escrow slices the mission lent (L10), their books, which slice
#: each hold was taken from, and each slice's own chain (``escrow_events``).
ESCROW_TABLES: dict[str, dict[str, str]] = {
    "escrow_slices": dict.fromkeys(("id", "mission_id", "holder", "status"), "str")
    | dict.fromkeys(("lease_expires_us", "leased_at_us"), "int")
    | {"returned_at_us": "int?", "returned_why": "str?"}
    | dict.fromkeys(("attempts_admitted", "attempts_failed", "audit_seq"), "int")
    | dict.fromkeys(("audit_hash", "audit_sealed"), "str?")
    | {"audit_legacy_seq": "int"},
    "escrow_accounts": {"slice_id": "str", "unit": "str"}
    | dict.fromkeys(("limit_amount", "available", "held", "spent", "overrun"), "int"),
    "escrow_holds": {"attempt_id": "str", "slice_id": "str"},
    "escrow_events": EVENT,
}
TABLES |= ESCROW_TABLES
ARTIFACT: dict[str, str] = {"sha256": "str", "size": "int", "location": "str"}
_HEADER: dict[str, type | tuple[type, ...]] = {
    "format": str,
    "version": int,
    "mission_id": str,
    "head": dict,
    "key_id": str,
    "public_key": str,
    "exported_at_us": int,
    "store_id": str,
    "handover": (dict, type(None)),
    "entries": dict,
}
_ENTRIES = ("audit.jsonl", "state.json", "artifacts.json")


@dataclass(frozen=True)
class Snapshot:
    """A snapshot's content, verified (by :func:`load`) or about to be signed."""

    header: Mapping[str, Any]
    events: Sequence[Mapping[str, Any]]
    state: Mapping[str, Sequence[Mapping[str, Any]]]
    artifacts: Sequence[Mapping[str, Any]]

    @property
    def mission_id(self) -> str:
        return str(self.header["mission_id"])

    @property
    def handover(self) -> Mapping[str, Any] | None:
        value = self.header.get("handover")
        return value if isinstance(value, Mapping) else None


def _sha(data: bytes) -> dict[str, Any]:
    return {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}


def pack(
    *,
    mission_id: str,
    head: ChainHead,
    events: Iterable[Mapping[str, Any]],
    state: Mapping[str, Sequence[Mapping[str, Any]]],
    artifacts: Sequence[Mapping[str, Any]],
    signer: Signer,
    exported_at_us: int,
    store_id: str,
    handover: Mapping[str, Any] | None = None,
    blobs: Mapping[str, bytes] | None = None,
    headroom: int = 0,
) -> bytes:
    """The signed archive of one mission (the caller verified its chain), refused
    with :class:`~charter.errors.SnapshotMalformed` if it passes a bound that
    :func:`load` holds it to, with ``headroom`` bytes to spare
    (:func:`charter.audit.archive.write`)."""
    body = {
        "audit.jsonl": "".join(canonical(dict(e)) + "\n" for e in events).encode(),
        "state.json": canonical({t: state.get(t, []) for t in TABLES}).encode(),
        "artifacts.json": canonical(list(artifacts)).encode(),
    }
    header = canonical(
        {
            "format": FORMAT,
            "version": VERSION,
            "mission_id": mission_id,
            "head": {"seq": head.seq, "hash": head.hash, "legacy": head.legacy},
            "key_id": signer.key_id,
            "public_key": signer.public_key,
            "exported_at_us": exported_at_us,
            "store_id": store_id,
            "handover": None if handover is None else dict(handover),
            "entries": {name: _sha(data) for name, data in body.items()},
        }
    ).encode()
    extra = {f"artifacts/{sha}": data for sha, data in sorted((blobs or {}).items())}
    entries = {"snapshot.json": header, "snapshot.sig": signer.sign(header), **body, **extra}
    return archive.write(entries, mtime=exported_at_us // 1_000_000, headroom=headroom)


# -- reading ---------------------------------------------------------------------------


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out = dict(pairs)
    if len(out) != len(pairs):
        raise ValueError("a key appears twice in one object")
    return out


def _no_constants(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def parse(entry: str, data: bytes) -> Any:
    """Strict JSON: UTF-8, no NaN, no duplicate keys, bounded nesting."""
    try:
        return json.loads(
            data.decode(),
            object_pairs_hook=_no_duplicates,
            parse_constant=_no_constants,
        )
    except RecursionError:
        raise SnapshotMalformed(
            f"entry {entry} is nested too deeply to be a snapshot's",
            problem="too_deep",
            entry=entry,
        ) from None
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        raise SnapshotMalformed(
            f"entry {entry} is not strict JSON: {str(exc)[:200]}", problem="bad_json", entry=entry
        ) from None


def check_record(entry: str, record: Any, schema: Mapping[str, str], where: str) -> None:
    """``record`` has exactly ``schema``'s columns, each of its type."""
    if not isinstance(record, dict) or set(record) != set(schema):
        names = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise SnapshotMalformed(
            f"{where} in {entry} does not have the format's columns: got {str(names)[:300]}, "
            f"expected {sorted(schema)}",
            problem="bad_record",
            entry=entry,
        )
    for column, kind in schema.items():
        value = record[column]
        if value is None and kind.endswith("?"):
            continue
        ok = (
            isinstance(value, str)
            if kind.startswith("str")
            else isinstance(value, int)
            and not isinstance(value, bool)
            and _INT64[0] <= value <= _INT64[1]
        )
        if not ok:
            raise SnapshotMalformed(
                f"{where} in {entry}: column {column} must be {kind}, got {str(value)[:80]!r}",
                problem="bad_record",
                entry=entry,
                column=column,
            )


def _header(entries: Mapping[str, bytes]) -> dict[str, Any]:
    for name in ("snapshot.json", "snapshot.sig", *_ENTRIES):
        if name not in entries:
            raise SnapshotMalformed(
                f"the archive has no {name}: not a complete snapshot",
                problem="missing_entry",
                entry=name,
            )
    header = parse("snapshot.json", entries["snapshot.json"])
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        raise SnapshotMalformed(
            f"snapshot.json does not name the format {FORMAT!r}: not a Charter snapshot",
            problem="unknown_format",
            entry="snapshot.json",
        )
    if header.get("version") not in READS or isinstance(header.get("version"), bool):
        raise SnapshotMalformed(
            f"snapshot format version {str(header.get('version'))[:20]} is not one this "
            f"engine reads (it reads versions {READS}); import it with a matching release",
            problem="unsupported_version",
            entry="snapshot.json",
        )
    for name, kind in _HEADER.items():
        value = header.get(name)
        if name not in header or not isinstance(value, kind) or isinstance(value, bool):
            raise SnapshotMalformed(
                f"snapshot.json: {name} is missing or of the wrong type",
                problem="bad_header",
                entry="snapshot.json",
            )
    check_record(
        "snapshot.json", header["head"], {"seq": "int", "hash": "str?"} | {"legacy": "int"}, "head"
    )
    handover = header["handover"]
    if handover is not None and (
        set(handover) != {"to_store", "runs"}
        or not isinstance(handover["to_store"], str)
        or not isinstance(handover["runs"], list)
        or not all(isinstance(r, str) for r in handover["runs"])
    ):
        raise SnapshotMalformed(
            "snapshot.json: handover must be null or name to_store and the runs fenced",
            problem="bad_header",
            entry="snapshot.json",
        )
    if set(header["entries"]) != set(_ENTRIES):
        raise SnapshotMalformed(
            f"snapshot.json must list exactly the entries {list(_ENTRIES)}",
            problem="bad_header",
            entry="snapshot.json",
        )
    for name in _ENTRIES:
        check_record(
            "snapshot.json", header["entries"][name], {"sha256": "str", "size": "int"}, name
        )
    return header


def _digest(entries: Mapping[str, bytes], header: Mapping[str, Any], name: str) -> None:
    if _sha(entries[name]) != header["entries"][name]:
        raise SnapshotTampered(
            f"entry {name} does not match the digest the signed header gives it: it was "
            "changed after signing",
            problem="digest_mismatch",
            entry=name,
        )


def _events(entries: Mapping[str, bytes], header: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The events, each of the format's schema, chained from genesis to the signed head."""
    events = []
    for number, line in enumerate(entries["audit.jsonl"].split(b"\n")[:-1], start=1):
        event = parse("audit.jsonl", line)
        check_record("audit.jsonl", event, EVENT, f"line {number}")
        events.append(event)
    if not entries["audit.jsonl"].endswith(b"\n") and entries["audit.jsonl"]:
        raise SnapshotTampered(
            "audit.jsonl ends inside an event: its tail was cut",
            problem="chain_broken",
            entry="audit.jsonl",
        )
    head = header["head"]
    result = verify_events(
        header["mission_id"], events, ChainHead(head["seq"], head["hash"], head["legacy"])
    )
    if not result.ok:
        raise SnapshotTampered(
            f"the audit chain breaks at event {result.broken_at}: {result.problem}",
            problem="chain_broken",
            entry="audit.jsonl",
            seq=result.broken_at,
        )
    _digest(entries, header, "audit.jsonl")
    return events


def _state(entries: Mapping[str, bytes], header: Mapping[str, Any]) -> dict[str, Any]:
    state = parse("state.json", entries["state.json"])
    tables = set(TABLES) if header["version"] >= 2 else set(TABLES) - set(ESCROW_TABLES)
    if not isinstance(state, dict) or set(state) != tables:
        raise SnapshotMalformed(
            f"state.json must hold exactly the tables {sorted(tables)}",
            problem="bad_record",
            entry="state.json",
        )
    missing: dict[str, list[Any]] = {table: [] for table in ESCROW_TABLES}
    state = missing | state
    for table, schema in TABLES.items():
        rows = state[table]
        if not isinstance(rows, list):
            raise SnapshotMalformed(
                f"state.json: {table} is not a list of records",
                problem="bad_record",
                entry="state.json",
            )
        for number, row in enumerate(rows, start=1):
            check_record("state.json", row, schema, f"{table} record {number}")
    _digest(entries, header, "state.json")
    return state


def _artifacts(entries: Mapping[str, bytes], header: Mapping[str, Any]) -> list[dict[str, Any]]:
    manifest = parse("artifacts.json", entries["artifacts.json"])
    if not isinstance(manifest, list):
        raise SnapshotMalformed(
            "artifacts.json is not a list", problem="bad_record", entry="artifacts.json"
        )
    for number, item in enumerate(manifest, start=1):
        check_record("artifacts.json", item, ARTIFACT, f"artifact {number}")
    _digest(entries, header, "artifacts.json")
    listed = {item["sha256"] for item in manifest}
    for name, data in entries.items():
        if name.startswith("artifacts/") and (
            name[len("artifacts/") :] not in listed
            or hashlib.sha256(data).hexdigest() != name[len("artifacts/") :]
        ):
            raise SnapshotTampered(
                f"entry {name} is not the artifact its name and the manifest say",
                problem="artifact_mismatch",
                entry=name,
            )
    return manifest


def load(data: bytes, trusted: Iterable[str]) -> Snapshot:
    """Verify a snapshot file's bytes completely (see the module's docstring)."""
    entries = archive.read(data)
    header = _header(entries)
    verify(trusted, header["key_id"], entries["snapshot.json"], entries["snapshot.sig"])
    events = _events(entries, header)
    state = _state(entries, header)
    manifest = _artifacts(entries, header)
    consistency.check(header, events, state, manifest)
    return Snapshot(header, events, state, manifest)
