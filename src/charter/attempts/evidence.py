"""The one evidence format (A3, A8, A9, S3): what an adapter reports, as recorded.

Whatever a send (:func:`charter.attempts.dispatch.send`) or a lookup reports becomes a
:class:`Report`:

- an :class:`~charter.adapters.Outcome` is evidence the effect was applied;
- :class:`~charter.errors.NotApplied` is the adapter's proof that it was not;
- any other exception is an unknown outcome (A3), its text kept as the reason;
- a report the store cannot hold (an amount outside [0, 2^63 - 1], a result
  that cannot be serialised, something that is not an Outcome at all) settles
  nothing: the outcome is unknown and the raw report is kept as evidence
  text (A9).

Everything in a report is what will be recorded: serialised as it will be
stored, with every secret scrubbed from that final text (S3), and each part a
target answered (a result, a receipt, a detail) at most the engine's
``answer_bytes`` of JSON: beyond that its head is kept with the whole's
length and SHA-256 and a note (:func:`bound`, A10). So there is one format for
everything an adapter tells the engine, and one large answer cannot make a
mission's record unmanageable.
:func:`record` is the one writer of evidence; :mod:`charter.attempts.store`
holds the evidence table's statements and reads it back.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any

from charter import secret
from charter.adapters import Dispatch, Evidence, Outcome
from charter.attempts import store
from charter.attempts.model import Attempt
from charter.errors import (
    AdapterError,
    NotApplied,
    OutcomeUnknown,
    SettlementUnrecorded,
)
from charter.hashing import by_reference, canonical, json_encoder
from charter.secret import Secret
from charter.storage import Tx


def _text(value: Any) -> Any:
    """How a value JSON cannot hold is recorded: a secret by its name, anything
    else as its text (which :func:`secret.scrub_text` then cleans)."""
    return secret.placeholder(value) if isinstance(value, Secret) else str(value)


#: How reports are checked: the canonical form they are stored in, refusing NaN.
_strict = json_encoder(_text, allow_nan=False)


class Unrecordable(Exception):
    """A report the store cannot hold; it settles nothing."""


@dataclass(frozen=True)
class Report:
    """What one send (or lookup) reported, ready to record.

    ``reason`` says why an outcome is unknown, or how non-application was
    proven; ``keep`` marks indeterminate evidence that must be stored: all
    there is of an unrecordable report, or what an adapter knew of an unknown
    outcome (:class:`~charter.errors.OutcomeUnknown`). ``unsent``: the engine
    itself did not call the adapter (its send deadline had passed), so no
    target answered anything.
    """

    evidence: Evidence
    reason: str | None = None
    keep: bool = False
    unsent: bool = False


def recordable(report: Report, secrets: list[Secret], limit: int) -> Report:
    """``report`` as it will be stored, or an unknown outcome keeping its raw text."""
    evidence = report.evidence
    try:
        outcome = evidence.outcome
        if outcome is not None:
            outcome = _outcome(outcome, secrets, limit)
        detail = _value(evidence.detail, secrets, limit)
        if not isinstance(evidence.source, str):
            raise Unrecordable(f"evidence source must be text, not {evidence.source!r}")
    except (Unrecordable, AdapterError, TypeError, ValueError, RecursionError) as exc:
        return garbage(repr(evidence), str(exc), secrets, limit)
    reason = None if report.reason is None else _clean(report.reason, secrets, limit)
    source = _clean(evidence.source, secrets, limit)
    recorded = Evidence(evidence.verdict, outcome, detail, source)
    return Report(recorded, reason, report.keep, report.unsent)


def from_late(order: Dispatch) -> Report:
    """The engine did not call the adapter: the send deadline had passed (F3)."""
    why = "send deadline passed before the engine called the adapter"
    return Report(
        Evidence.not_applied({"reason": why, "deadline_us": order.send_deadline_us}),
        f"not applied: {why}",
        unsent=True,
    )


def from_raised(exc: Exception, secrets: list[Secret], limit: int) -> Report:
    """What an adapter's exception reports: proof of non-application, a broken
    protocol, or (anything else) an unknown outcome (A3)."""
    if isinstance(exc, NotApplied):
        proof = Evidence.not_applied({"reason": exc.reason, **exc.evidence})
        return recordable(Report(proof, f"not applied: {exc.reason}"), secrets, limit)
    if isinstance(exc, OutcomeUnknown):  # unknown, with evidence to keep
        reason = f"outcome unknown: {exc.reason}"
        unknown = Report(Evidence.indeterminate(exc.evidence), reason, keep=True)
        return recordable(unknown, secrets, limit)
    if isinstance(exc, AdapterError):  # e.g. an Outcome out of range
        return garbage(f"{type(exc).__name__}: {exc}", exc.message, secrets, limit)
    return Report(Evidence.indeterminate(), _clean(f"{type(exc).__name__}: {exc}", secrets, limit))


def from_answer(answer: object, secrets: list[Secret], limit: int) -> Report:
    """What an adapter returned: an Outcome, or something it should not have."""
    if not isinstance(answer, Outcome):
        return garbage(repr(answer), f"adapter returned {type(answer).__name__}", secrets, limit)
    return recordable(Report(Evidence.applied(answer)), secrets, limit)


def unrecorded(attempt_id: str, report: Report, cause: Exception) -> SettlementUnrecorded:
    """The error for a send whose settlement could not be committed (A4).

    The attempt stays DISPATCHED: it is an uncertainty, never a failure to
    retry. What the target said travels on the error for the caller to log;
    recovery and reconcile obtain it again as evidence.
    """
    evidence = report.evidence
    return SettlementUnrecorded(
        f"attempt {attempt_id} was sent and its outcome ({evidence.verdict}) could not be "
        f"recorded ({type(cause).__name__}: {cause}); it stays DISPATCHED with its hold and "
        "is never retried on a guess: recover the run, then reconcile the attempt",
        attempt_id=attempt_id,
        verdict=evidence.verdict,
        outcome=None if evidence.outcome is None else _strict(evidence.outcome.result),
    )


def _outcome(outcome: Outcome, secrets: list[Secret], limit: int) -> Outcome:
    """The outcome as recorded: every part an adapter filled in clean and bounded,
    its price source included (an adapter may put a target's text there, and it
    is stored on the attempt, its ledger entries and the audit as well, S3, A10)."""
    price = outcome.price_source
    if price is not None and not isinstance(price, str):
        raise Unrecordable(f"price_source must be text, not {price!r}")
    # Made anew, so its amounts are checked again (A9), even if it was altered.
    return Outcome(
        outcome.status,
        _value(outcome.result, secrets, limit),
        outcome.cost,
        _value(outcome.receipt, secrets, limit),
        None if price is None else _clean(price, secrets, limit),
    )


def _value(value: Any, secrets: list[Secret], limit: int) -> Any:
    """``value`` as the store will hold it: the final text clean (S3) and at
    most ``limit`` bytes (A10)."""
    if value is None:
        return None
    text = _strict(value)
    clean = secret.scrub_text(text, secrets)
    if len(clean) > limit // 4 and len(clean.encode()) > limit:
        return bound(clean, limit)
    if clean == text and f'"{secret.MARK}"' not in text:
        return value
    return json.loads(clean)


#: The key of the record kept of an answer larger than the engine's bound (A10).
BOUNDED = "$bounded"


def bound(text: str, limit: int) -> dict[str, Any]:
    """What is kept of an answer whose JSON ``text`` is over ``limit`` bytes: its
    first ``limit`` bytes (as text), the whole's length and SHA-256, and a note."""
    whole = text.encode()
    return {
        BOUNDED: {
            "head": whole[:limit].decode(errors="ignore"),
            "bytes": len(whole),
            "sha256": hashlib.sha256(whole).hexdigest(),
            "note": f"the answer was {len(whole)} bytes of JSON; its first {limit} are "
            "kept (answer_bytes), the whole only as its length and SHA-256",
        }
    }


def _kept(text: str, limit: int) -> str:
    """``text`` as the store keeps it: a NUL or a lone surrogate (which no store
    holds, A10) written as its escape, and at most ``limit`` bytes, said when
    cut. An adapter's exception text is whatever the target sent: it must not
    make the settlement unrecordable."""
    if "\x00" in text:
        text = text.replace("\x00", "\\x00")
    try:
        data = text.encode()
    except UnicodeEncodeError:
        text = text.encode("utf-8", "backslashreplace").decode()
        data = text.encode()
    if len(data) <= limit:
        return text
    return data[:limit].decode(errors="ignore") + f" [cut at {limit} bytes]"


def _clean(text: str, secrets: list[Secret], limit: int) -> str:
    """A text an adapter reported (a reason, a price source, an evidence source)
    as the store keeps it: every secret scrubbed (S3), then :func:`_kept` (A10)."""
    return _kept(secret.scrub_text(text, secrets), limit)


def garbage(raw: str, problem: str, secrets: list[Secret], limit: int) -> Report:
    """An unrecordable report: unknown outcome, raw text kept as evidence (A9)."""
    text = _clean(raw, secrets, limit)
    problem = _clean(problem, secrets, limit)
    return Report(
        Evidence.indeterminate({"unrecordable_report": text, "problem": problem}),
        f"the adapter's report cannot be recorded ({problem}); kept as evidence text",
        keep=True,
    )


# -- recording: the one writer of evidence ------------------------------------------------


def record(
    tx: Tx,
    attempt: Attempt,
    evidence: Evidence,
    *,
    actor: str,
    epoch: int | None,
    settled: bool,
) -> str:
    """Store evidence, immutable, with the epoch it came from (F2, R7)."""
    evidence_id = tx.ids.new("evd")
    outcome = evidence.outcome
    outcome_json = (
        None
        if outcome is None
        else canonical(
            {
                "status": outcome.status,
                "result": outcome.result,
                "cost": dict(outcome.cost),
                "receipt": outcome.receipt,
                "price_source": outcome.price_source,
            }
        )
    )
    store.insert_evidence(
        tx, evidence_id, attempt, evidence, outcome_json, actor=actor, epoch=epoch, settled=settled
    )
    tx.audit(
        attempt.mission_id,
        "evidence.recorded",
        attempt.id,
        actor=actor,
        epoch=epoch,
        payload={
            "evidence_id": evidence_id,
            "source": evidence.source,
            "verdict": evidence.verdict,
            "outcome": None if outcome_json is None else by_reference(json.loads(outcome_json)),
            "detail": by_reference(evidence.detail),
        },
    )
    return evidence_id
