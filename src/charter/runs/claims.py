"""Claims as proof of a segment (X3): which executor may speak for which segment.

A claim is the secret an executor is handed when it comes to hold a run
(:func:`charter.runs.run.start`, a worker beginning a submitted run, a
resume): the run's row keeps the current holder's, which every local write
checks (:meth:`charter.runs.ownership.Segment.own`). A remote client's calls
come in alone, each naming a segment, an epoch and a claim, and one of them
may be about an attempt an *earlier* segment dispatched (a late report after a
takeover). So every claim issued is kept here too, as a digest with the run,
epoch and segment it was issued to: :func:`proves` tells a segment's own
claim from a stranger's, whichever segment holds the run now. The digest, not
the claim, is stored: the table proves a claim without being able to forge one.
"""

from __future__ import annotations

from charter.hashing import digest
from charter.storage import Tx


def issue(tx: Tx, run_id: str, *, epoch: int, segment_id: str, claim: str) -> None:
    """Keep ``claim``'s digest as issued to ``segment_id`` of ``run_id`` at
    ``epoch``; sent with the commit that hands the claim out (no round trip)."""
    tx.write(
        "INSERT INTO run_claims (run_id, epoch, segment_id, digest, issued_at_us) "
        "VALUES (?, ?, ?, ?, ?)",
        run_id,
        epoch,
        segment_id,
        digest(claim),
        tx.now_us,
    )


def issue_to_owner(tx: Tx, run_id: str, *, epoch: int, claim: str) -> None:
    """:func:`issue` to the segment that owns ``run_id`` at ``epoch`` (a resume)."""
    tx.write(
        "INSERT INTO run_claims (run_id, epoch, segment_id, digest, issued_at_us) "
        "SELECT id, epoch, owner_segment, ?, ? FROM runs WHERE id = ? AND epoch = ?",
        digest(claim),
        tx.now_us,
        run_id,
        epoch,
    )


def proves(tx: Tx, run_id: str, *, epoch: int, segment_id: str, claim: str) -> bool:
    """Whether ``claim`` was issued to ``segment_id`` of ``run_id`` at ``epoch``:
    the claim of the segment the caller names, whether or not it still holds
    the run. A claim handed out by a store older than the table (schema 21)
    proves its segment while it is still the run's holder."""
    row = tx.one(
        "SELECT 1 AS x FROM run_claims "
        "WHERE run_id = ? AND epoch = ? AND segment_id = ? AND digest = ?",
        run_id,
        epoch,
        segment_id,
        digest(claim),
    )
    if row is not None:
        return True
    held = tx.one(
        "SELECT 1 AS x FROM runs WHERE id = ? AND epoch = ? AND owner_segment = ? "
        "AND owner_claim = ?",
        run_id,
        epoch,
        segment_id,
        claim,
    )
    return held is not None
