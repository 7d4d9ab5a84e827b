"""The runs room's tables: every statement on ``runs`` and ``segments`` (F1, F2, N4).

:mod:`~charter.runs.run` says what a status change means and
:mod:`~charter.runs.ownership` decides who may write; both write through here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from charter.hashing import digest
from charter.ledger.escrow import store as escrow_store
from charter.runs.liveness import owner_dead
from charter.runs.model import Run, RunStatus
from charter.storage import Prefetched, Row, Tx
from charter.storage.paging import Position, page

#: What a run counts of its settled attempts, by attempt status (R5 reports
#: them without scanning history): each has its ``n_<status>`` column, which
#: takes them in tallies (``attempts.settlement.tally``), not one by one.
SETTLED = ("succeeded", "failed", "written_off", "voided")
_SETTLED_SQL = "(" + ", ".join(f"'{s}'" for s in SETTLED) + ")"


#: The run's (``r``) attempts in a settled status (the blank) its row does not count yet.
_UNTALLIED = (
    "SELECT COUNT(*) FROM attempts a WHERE a.run_id = r.id AND a.tallied = 0 AND a.status {}"
)

#: A run's settled counts: its row's, and its attempts' not tallied there yet.
_SETTLED_COUNTS = (
    "SELECT "
    + ", ".join(f"r.n_{s} + ({_UNTALLIED.format('= ' + repr(s))}) AS n_{s}" for s in SETTLED)
    + " FROM runs r WHERE r.id = ?"
)
_UNTALLIED_OF_MISSION = (
    "SELECT a.run_id, a.status, COUNT(*) AS n FROM runs r JOIN attempts a ON a.run_id = r.id "
    f"WHERE r.mission_id = ? AND a.tallied = 0 AND a.status IN {_SETTLED_SQL} "
    "GROUP BY a.run_id, a.status"
)
_TALLY = (
    "UPDATE runs SET n_succeeded = n_succeeded + ?, n_failed = n_failed + ?, "
    "n_written_off = n_written_off + ?, n_voided = n_voided + ? WHERE id = ?"
)

_COLUMNS = (
    "id, mission_id, principal, status, status_reason, epoch, owner_segment, "
    "lease_expires_us, recoveries, linked_from, created_at_us, updated_at_us"
)

#: The mission's chain head, read with a transaction's first read of the run
#: (under the mission's gate): an embedded store need not read it again when the
#: transaction's events are chained (see ``SQLiteDriver.recall``).
_HEAD = (
    "m.id AS head_of, m.audit_seq AS head_seq, m.audit_hash AS head_hash, "
    "m.audit_sealed AS head_sealed, m.books AS head_books"
)

_STANDING = (
    "SELECT r.status, r.epoch, r.owner_segment, r.owner_claim, r.lease_expires_us, r.linked_from, "
    f"m.contract_version, m.attempts_admitted, m.attempts_failed, {_HEAD}, "
    "(SELECT COUNT(*) FROM incidents i WHERE i.mission_id = r.mission_id "
    "AND i.status = 'open') AS open_incidents, "
    # When the first of the mission's lent slices lapses (L10): an admission
    # through the mission's gate returns it.
    "(SELECT MIN(s.lease_expires_us) FROM escrow_slices s WHERE s.mission_id = r.mission_id "
    "AND s.status = 'open') AS escrow_lapse "
    # No row locks: the caller holds the mission's gate.
    "FROM missions m JOIN runs r ON m.id = r.mission_id WHERE r.id = ?"
)

#: A run's status, how many slices its mission has lent (L10): a settlement
#: through the mission's gate then asks whose hold it resolves; and how many of
#: its settled attempts its row does not count yet (``attempts.settlement.tally_due``).
_STATUS_AHEAD = (
    "SELECT r.status, (SELECT COUNT(*) FROM escrow_slices s WHERE s.mission_id = r.mission_id "
    "AND s.status = 'open') AS slices, "
    f"({_UNTALLIED.format('IN ' + _SETTLED_SQL)}) AS untallied, {_HEAD} "
    "FROM missions m JOIN runs r ON m.id = r.mission_id WHERE r.id = ?"
)

_SET_LEASE = "UPDATE runs SET lease_expires_us = ? WHERE id = ? AND epoch = ?"


#: A stored status to its member: a dict read, where calling the enum is a µs a row.
_STATUS = {s.value: s for s in RunStatus}


def from_row(r: Row) -> Run:
    return Run(
        r["id"],
        r["mission_id"],
        r["principal"],
        _STATUS[r["status"]],
        r["status_reason"],
        r["epoch"],
        r["owner_segment"],
        r["lease_expires_us"],
        r["recoveries"],
        r["linked_from"],
        r["created_at_us"],
        r["updated_at_us"],
    )


# -- records -------------------------------------------------------------------------


def run(tx: Tx, run_id: str) -> Run | None:
    row = tx.one(f"SELECT {_COLUMNS} FROM runs WHERE id = ?", run_id)
    return None if row is None else from_row(row)


def list_runs(
    tx: Tx,
    mission_id: str | None = None,
    *,
    status: RunStatus | None = None,
    limit: int | None = None,
    after: Position | None = None,
) -> list[Run]:
    where, params = ([], []) if mission_id is None else (["mission_id = ?"], [mission_id])
    if status is not None:
        where.append("status = ?")
        params.append(status.value)
    sql, args = page(
        f"SELECT {_COLUMNS} FROM runs", where, params, key="created_at_us", after=after, limit=limit
    )
    return [from_row(r) for r in tx.all(sql, *args)]


def insert(
    tx: Tx,
    run_id: str,
    *,
    mission_id: str,
    principal: str,
    segment_id: str,
    claim: str,
    process: str | None,
    lease_expires_us: int,
    plan: str | None,
    input_json: str | None,
    linked_from: str | None,
) -> None:
    """A new active run at epoch 1 and its first segment."""
    tx.run(
        "INSERT INTO runs (id, mission_id, principal, status, epoch, owner_segment, "
        "owner_claim, owner_process, lease_expires_us, created_at_us, updated_at_us, plan, "
        "input, linked_from) VALUES (?, ?, ?, 'active', 1, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
        run_id,
        mission_id,
        principal,
        segment_id,
        claim,
        process,
        lease_expires_us,
        tx.now_us,
        tx.now_us,
        plan,
        input_json,
        linked_from,
    )
    tx.run(
        "INSERT INTO segments (run_id, segment_id, epoch, started_at_us) VALUES (?, ?, 1, ?)",
        run_id,
        segment_id,
        tx.now_us,
    )
    issue_claim(tx, run_id, epoch=1, segment_id=segment_id, claim=claim)
    expect_attempts(tx, mission_id, run_id)


def expect_attempts(tx: Tx, mission_id: str, run_id: str) -> None:
    """A new run's first admission and settlement read its standing and status:
    expected (:meth:`Tx.expect`), its first attempt decides on copies as later ones do."""
    tx.expect(mission_id, _STANDING, run_id)
    tx.expect(mission_id, _STATUS_AHEAD, run_id)


def change_status(
    tx: Tx, run_id: str, before: RunStatus, after: RunStatus, reason: str | None
) -> bool:
    """Move a run from ``before`` to ``after``; ``False`` if it was no longer ``before``."""
    return bool(
        tx.run(
            "UPDATE runs SET status = ?, status_reason = ?, updated_at_us = ? "
            "WHERE id = ? AND status = ?",
            after.value,
            reason,
            tx.now_us,
            run_id,
            before.value,
        )
    )


def add_tally(tx: Tx, run_id: str, statuses: Sequence[str]) -> None:
    """Add settled attempts (their statuses, each one of :data:`SETTLED`) to the run's counts."""
    if statuses:
        tx.write(_TALLY, *(statuses.count(s) for s in SETTLED), run_id)


def settled_counts(tx: Tx, run_id: str) -> dict[str, int] | None:
    """The run's settled attempts by status (every one of :data:`SETTLED`): its
    row's counts and those not tallied there yet, found through the index of its
    unresolved attempts (``attempts_untallied``), a few dozen at most."""
    row = tx.one(_SETTLED_COUNTS, run_id)
    return None if row is None else {outcome: int(row[f"n_{outcome}"]) for outcome in SETTLED}


def status(tx: Tx, run_id: str) -> RunStatus | None:
    row = tx.one("SELECT status FROM runs WHERE id = ?", run_id)
    return None if row is None else RunStatus(row["status"])


def status_ahead(tx: Tx, mission_id: str, run_id: str) -> Prefetched:
    """The run's status as a read sent ahead (it travels with the next
    statement), or recalled: a settlement makes it on every attempt."""
    return tx.recall(mission_id, _STATUS_AHEAD, run_id)


def follower(tx: Tx, run_id: str) -> str | None:
    """The run linked from ``run_id``, if one was started (N4)."""
    row = tx.one("SELECT id FROM runs WHERE linked_from = ?", run_id)
    return None if row is None else str(row["id"])


def recorded_plan(tx: Tx, run_id: str) -> Row | None:
    """The plan reference and input (JSON) recorded on the run, so another
    process can resume it: ``plan`` and ``input``, each possibly ``None``."""
    return tx.one("SELECT plan, input FROM runs WHERE id = ?", run_id)


def plan_ref(tx: Tx, run_id: str) -> str | None:
    row = tx.one("SELECT plan FROM runs WHERE id = ?", run_id)
    plan: str | None = None if row is None else row["plan"]
    return plan


# -- ownership (F1, F2) --------------------------------------------------------------


def standing(tx: Tx, mission_id: str, run_id: str) -> Row | None:
    """What its owner checks before every write: the run's owner, epoch, claim
    and lease, with the mission's contract version, counters, open incidents and
    chain head (with the books, :meth:`Tx.books`), in one statement. It reads
    the missions' and incidents' tables too, all of the mission's own rows:
    recalled (see :meth:`Tx.recall`)."""
    lane = tx.lane(mission_id)
    if lane is not None:
        return tx.recall(mission_id, escrow_store.STANDING, lane.chain, run_id).row
    return tx.recall(mission_id, _STANDING, run_id).row


def current_epoch(tx: Tx, run_id: str) -> int | None:
    row = tx.one("SELECT epoch FROM runs WHERE id = ?", run_id)
    return None if row is None else int(row["epoch"])


def extend_lease(tx: Tx, run_id: str, epoch: int, expires_us: int) -> None:
    """Move the lease's end, sent with the next statement (no round trip of its own)."""
    tx.write(_SET_LEASE, expires_us, run_id, epoch)


def restart_lease(tx: Tx, run_id: str, epoch: int, expires_us: int) -> None:
    """Move the lease's end now (a resume: the owner's lease starts afresh)."""
    tx.run(_SET_LEASE, expires_us, run_id, epoch)


def renew_lease(
    tx: Tx, run_id: str, *, epoch: int, segment_id: str, claim: str | None, expires_us: int
) -> bool:
    """Extend a live lease held by this segment and claim; ``False`` if the lease
    expired or the run was taken over or claimed by another executor meanwhile."""
    return bool(
        tx.run(
            "UPDATE runs SET lease_expires_us = ? WHERE id = ? AND epoch = ? "
            "AND owner_segment = ? AND COALESCE(owner_claim, '') = ? "
            "AND lease_expires_us > ?",
            expires_us,
            run_id,
            epoch,
            segment_id,
            claim or "",
            tx.now_us,
        )
    )


def owner_claim(tx: Tx, run_id: str) -> str | None:
    """The claim of the executor holding the run; ``None`` when none holds it."""
    row = tx.one("SELECT owner_claim FROM runs WHERE id = ?", run_id)
    held: str | None = None if row is None else row["owner_claim"]
    return held


def held_alive(tx: Tx, run: Run) -> bool:
    """Whether a live executor holds the run (F1, R1): its claim is set, its lease
    runs by the store's clock, and its process is not provably gone."""
    row = tx.one("SELECT owner_claim, owner_process FROM runs WHERE id = ?", run.id)
    return (
        row is not None
        and row["owner_claim"] is not None
        and run.lease_expires_us > tx.now_us
        and not owner_dead(row["owner_process"])
    )


def let_go(tx: Tx, run_id: str) -> bool:
    """Whether the run's last executor let go of it (a wait, a pause, a stopping
    worker) and no owner was lost holding it since: it was not interrupted (R9)."""
    return tx.one("SELECT run_id FROM runs_let_go WHERE run_id = ?", run_id) is not None


def owner_process(tx: Tx, run_id: str) -> str | None:
    """The process of the executor holding the run, as recorded (JSON); ``None`` when
    none holds it or none was recorded."""
    row = tx.one("SELECT owner_process FROM runs WHERE id = ?", run_id)
    held: str | None = None if row is None else row["owner_process"]
    return held


def hold(tx: Tx, run_id: str, epoch: int, claim: str, process: str | None) -> None:
    """Make ``claim``, in ``process``, the one executor holding the run at ``epoch``."""
    tx.run(
        "UPDATE runs SET owner_claim = ?, owner_process = ? WHERE id = ? AND epoch = ?",
        claim,
        process,
        run_id,
        epoch,
    )
    issue_claim_to_owner(tx, run_id, epoch=epoch, claim=claim)
    tx.write("DELETE FROM runs_let_go WHERE run_id = ?", run_id)


def release(tx: Tx, run_id: str, epoch: int, claim: str | None) -> bool:
    """Let go of the run if ``claim`` still holds it at ``epoch``: it stopped itself,
    which R9 tells from an interruption (:func:`let_go`). Returns whether it held it."""
    released = tx.run(
        "UPDATE runs SET owner_claim = NULL, owner_process = NULL "
        "WHERE id = ? AND epoch = ? AND owner_claim = ?",
        run_id,
        epoch,
        claim,
    )
    if released:
        tx.write("INSERT INTO runs_let_go (run_id) VALUES (?) ON CONFLICT DO NOTHING", run_id)
    return bool(released)


def segment_used(tx: Tx, run_id: str, segment_id: str) -> bool:
    row = tx.one(
        "SELECT 1 AS x FROM segments WHERE run_id = ? AND segment_id = ?", run_id, segment_id
    )
    return row is not None


def take_over(
    tx: Tx,
    run_id: str,
    *,
    from_epoch: int,
    epoch: int,
    segment_id: str,
    lease_expires_us: int,
    forced: bool,
) -> None:
    """A new segment owns the run at ``epoch``, idle (no executor holds it), and
    the segment is recorded so its ID is never used again (R1, R2)."""
    # An owner taken over while it still held the run was interrupted (R9).
    tx.run(
        "DELETE FROM runs_let_go WHERE run_id = ? AND EXISTS "
        "(SELECT 1 FROM runs WHERE id = ? AND owner_claim IS NOT NULL)",
        run_id,
        run_id,
    )
    tx.run(
        "UPDATE runs SET epoch = ?, owner_segment = ?, owner_claim = NULL, owner_process = NULL, "
        "lease_expires_us = ?, recoveries = recoveries + 1, updated_at_us = ? "
        "WHERE id = ? AND epoch = ?",
        epoch,
        segment_id,
        lease_expires_us,
        tx.now_us,
        run_id,
        from_epoch,
    )
    tx.run(
        "INSERT INTO segments (run_id, segment_id, epoch, started_at_us, forced) "
        "VALUES (?, ?, ?, ?, ?)",
        run_id,
        segment_id,
        epoch,
        tx.now_us,
        int(forced),
    )


def count_by_status(tx: Tx) -> dict[str, int]:
    """How many runs the store holds in each status (for the metrics endpoint)."""
    rows = tx.all("SELECT status, COUNT(*) AS n FROM runs GROUP BY status")
    return {r["status"]: int(r["n"]) for r in rows}


def hand_off(tx: Tx, run_id: str, reason: str) -> int:
    """Fence a run for a handover (S5): a new epoch no executor holds, no claim, and
    the terminal status ``handed_off``; returns the new epoch."""
    row = tx.one(
        "UPDATE runs SET status = 'handed_off', status_reason = ?, epoch = epoch + 1, "
        "owner_claim = NULL, owner_process = NULL, updated_at_us = ? WHERE id = ? "
        "RETURNING epoch",
        reason,
        tx.now_us,
        run_id,
    )
    assert row is not None
    return int(row["epoch"])


# -- claims as proof of a segment (X3) -------------------------------------------------
# A claim is the secret an executor is handed when it comes to hold a run (a new
# run, a worker beginning a submitted one, a resume); the run's row keeps the
# current holder's, which every local write checks (Segment.own). A remote
# client's calls come in alone, naming a segment, an epoch and a claim, and one
# may be about an attempt an earlier segment dispatched (a late report after a
# takeover): so every claim issued is kept too, as a digest with the run, epoch
# and segment it went to. The digest, not the claim: the table proves a claim
# without being able to forge one.


def issue_claim(tx: Tx, run_id: str, *, epoch: int, segment_id: str, claim: str) -> None:
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


def issue_claim_to_owner(tx: Tx, run_id: str, *, epoch: int, claim: str) -> None:
    """:func:`issue_claim` to the segment that owns ``run_id`` at ``epoch`` (a resume)."""
    tx.write(
        "INSERT INTO run_claims (run_id, epoch, segment_id, digest, issued_at_us) "
        "SELECT id, epoch, owner_segment, ?, ? FROM runs WHERE id = ? AND epoch = ?",
        digest(claim),
        tx.now_us,
        run_id,
        epoch,
    )


def claim_proves(tx: Tx, run_id: str, *, epoch: int, segment_id: str, claim: str) -> bool:
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


# -- snapshots (S2): a mission's rows as recorded, and back ------------------------------


def snapshot(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """The mission's runs and segments as recorded; a run's settled counts are
    its whole counts, with the attempts not tallied yet (an import tallies every
    settled attempt it writes)."""
    runs = [
        dict(r)
        for r in tx.all(
            "SELECT * FROM runs WHERE mission_id = ? ORDER BY created_at_us, id", mission_id
        )
    ]
    by_id = {run["id"]: run for run in runs}
    for r in tx.all(_UNTALLIED_OF_MISSION, mission_id):
        by_id[r["run_id"]][f"n_{r['status']}"] += int(r["n"])
    return {
        "runs": runs,
        "segments": [
            dict(r)
            for r in tx.all(
                "SELECT s.* FROM segments s JOIN runs r ON r.id = s.run_id "
                "WHERE r.mission_id = ? ORDER BY s.run_id, s.epoch, s.segment_id",
                mission_id,
            )
        ],
    }


def restore(tx: Tx, tables: Mapping[str, Sequence[Mapping[str, Any]]]) -> None:
    tx.copy("INSERT INTO runs", tables["runs"])
    tx.copy("INSERT INTO segments", tables["segments"])


# -- submitted runs (K1): a run with no owner yet, and its first segment --------------


def insert_queued(
    tx: Tx,
    run_id: str,
    *,
    mission_id: str,
    principal: str,
    plan: str,
    input_json: str | None,
) -> None:
    """A submitted run: no owner yet (epoch 0, no segment), its lease long ended."""
    tx.run(
        "INSERT INTO runs (id, mission_id, principal, status, epoch, owner_segment, "
        "lease_expires_us, created_at_us, updated_at_us, plan, input) "
        "VALUES (?, ?, ?, 'queued', 0, '', 0, ?, ?, ?, ?)",
        run_id,
        mission_id,
        principal,
        tx.now_us,
        tx.now_us,
        plan,
        input_json,
    )


def begin(
    tx: Tx, run_id: str, *, segment_id: str, claim: str, process: str | None, expires_us: int
) -> bool:
    """The submitted run's first segment owns it (epoch 1), held by ``claim``;
    ``False`` if it was begun, or stopped, meanwhile."""
    begun = tx.run(
        "UPDATE runs SET status = 'active', epoch = 1, owner_segment = ?, owner_claim = ?, "
        "owner_process = ?, lease_expires_us = ?, updated_at_us = ? "
        "WHERE id = ? AND status = 'queued' AND epoch = 0",
        segment_id,
        claim,
        process,
        expires_us,
        tx.now_us,
        run_id,
    )
    if begun:
        tx.run(
            "INSERT INTO segments (run_id, segment_id, epoch, started_at_us) VALUES (?, ?, 1, ?)",
            run_id,
            segment_id,
            tx.now_us,
        )
        issue_claim(tx, run_id, epoch=1, segment_id=segment_id, claim=claim)
    return bool(begun)


def by_id_prefix(tx: Tx, prefix: str, *, limit: int) -> list[Run]:
    """The newest ``limit`` runs whose ID starts with ``prefix``: a range on the
    primary key (IDs are ASCII, so ``~`` sorts after every character they use)."""
    rows = tx.all(
        f"SELECT {_COLUMNS} FROM runs WHERE id >= ? AND id < ? ORDER BY id DESC LIMIT ?",
        prefix,
        prefix + "~",
        limit,
    )
    return [from_row(r) for r in rows if r["id"].startswith(prefix)]


#: The statuses of runs that wait for a person (K3), as the partial index
#: ``runs_need_people`` names them: the query repeats its condition word for word,
#: which is what lets SQLite's planner read the index.
NEED_PEOPLE = "status IN ('needs_intervention', 'paused', 'stopping')"


def needing_people(tx: Tx, *, limit: int) -> list[Run]:
    """The ``limit`` most recently changed runs that wait for a person, read
    through ``runs_need_people``: the cost follows them, not the store's runs."""
    rows = tx.all(
        f"SELECT {_COLUMNS} FROM runs{{indexed_by runs_need_people}} WHERE {NEED_PEOPLE} "
        "ORDER BY updated_at_us DESC LIMIT ?",
        limit,
    )
    return [from_row(r) for r in rows]
