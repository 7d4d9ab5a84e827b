"""The engine's snapshot and handover methods (S2-S5), mixed into :class:`Engine`.

Export reads a mission's records from each room's store in one consistent
read, checks its chain, and signs (:mod:`charter.audit.snapshot`). Import
verifies the whole file before its one write transaction, and files the
mission *sealed*: a sealed chain takes no event, and every change appends one
(S1), so nothing can happen to an imported mission here — no dispatch, no
resume, no decision. A handover fences the source (each live run: a new
epoch, status ``handed_off``; the mission sealed) before the snapshot is
made, names the one store that may adopt it, and the adoption on that store
opens the chain again and follows each handed-off run with a linked run (N4),
so settled effects replay from their records and unresolved ones stay so.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from charter.artifacts import store as artifacts_store
from charter.artifacts.objects import LocalObjects
from charter.attempts import settlement
from charter.attempts import store as attempts_store
from charter.attempts.model import AttemptStatus
from charter.audit import chain as audit
from charter.audit import handoff, signing
from charter.audit import store as audit_store
from charter.audit.signing import Signer
from charter.audit.snapshot import Snapshot, load, pack
from charter.contracts import missions
from charter.contracts import store as contracts_store
from charter.contracts.principals import Principal, Right
from charter.engine.executor import Executor
from charter.engine.runs import follow
from charter.errors import (
    ArtifactError,
    AuditError,
    ConfigError,
    ExportRefused,
    NotAuthorized,
    SignatureInvalid,
    SnapshotRefused,
    StateError,
)
from charter.hashing import ENGINE_CHAIN, checkpoint_statement
from charter.ledger import store as ledger_store
from charter.ledger.escrow import slices as escrow
from charter.ledger.escrow import store as escrow_store
from charter.plans import store as plans_store
from charter.plans.nodes import Plan
from charter.runs import store as run_store
from charter.runs.run import RunStatus
from charter.storage import lanes
from charter.waits import store as waits_store

if TYPE_CHECKING:
    from charter.config import EngineConfig
    from charter.contracts.authority import Authority
    from charter.runtime import Runtime
    from charter.storage import Database, Tx

#: Why an imported chain takes no events: a copy to read, or a handover to accept.
SEAL_IMPORTED = "imported from a snapshot: a read-only copy"
SEAL_HANDED_IN = "handed over to this store: a principal with 'adopt' accepts it"
#: The attempts of a run that the fence changes: voided, or made uncertain.
_IN_FLIGHT = ("prepared", "dispatched")


def _state(tx: Tx, mission_id: str) -> dict[str, list[dict[str, Any]]]:
    """Every record of the mission, each room's from its own store."""
    return {
        **contracts_store.snapshot(tx, mission_id),
        **ledger_store.snapshot(tx, mission_id),
        **run_store.snapshot(tx, mission_id),
        **attempts_store.snapshot(tx, mission_id),
        **waits_store.snapshot(tx, mission_id),
        **plans_store.snapshot(tx, mission_id),
        **escrow_store.snapshot(tx, mission_id),
        # Each slice's own chain (L10): its events are checked against its row.
        "escrow_events": [
            event
            for lent in escrow_store.slices(tx, mission_id)
            for event in audit_store.all_events(tx, lent["id"])
        ],
    }


class Snapshots:
    """Export, import, handoff reports, handover and signed checkpoints."""

    _db: Database
    _authority: Authority
    _runtime: Runtime
    config: EngineConfig
    _signing: Signer | None = None

    def _signer(self) -> Signer:
        if self._signing is None:
            if self.config.signing_key is None:
                raise ConfigError(
                    "this needs a signing key: set signing_key in the configuration to an "
                    "Ed25519 key (PEM), e.g. one made by `openssl genpkey -algorithm ed25519`"
                )
            self._signing = signing.load_signer(self.config.signing_key)
        return self._signing

    def _sign_heads(self) -> None:
        """With a signing key, every chain head is signed as it moves (checkpoints)."""
        if self.config.signing_key is None:
            return
        signer = self._signer()

        def sign(data: bytes) -> tuple[str, str]:
            return signer.key_id, base64.b64encode(signer.sign(data)).decode()

        self._db.sign = sign

    def _trusted(self) -> list[str]:
        own = [self._signer().public_key] if self.config.signing_key else []
        return [*own, *self.config.trusted_keys]

    def signing_public_key(self) -> str | None:
        """The public key of this engine's signing key, for other stores' ``trusted_keys``."""
        return self._signer().public_key if self.config.signing_key else None

    def store_id(self) -> str:
        """This store's identity: what a handover to it names (``charter audit identity``)."""
        with self._db.transaction() as tx:
            return audit_store.store_id(tx)

    # -- export (S2, S5) ------------------------------------------------------------
    def export_snapshot(
        self, mission_id: str, *, handover_to: str | None = None, by: Principal | None = None
    ) -> bytes:
        """The mission's signed snapshot. With ``handover_to`` (the target store's
        id), the source is fenced first and the snapshot says which store may adopt
        it; that needs ``by`` with the ``stop`` right.

        A snapshot that an import would refuse is not made: :class:`ExportRefused`
        (or :class:`AuditError` for a broken chain). A handover finds that out
        before it fences anything, from the file as it would be, with room for
        what the fence adds to it, so a refused handover leaves the mission here
        as it was (S5).
        """
        signer = self._signer()
        with self._db.transaction() as tx:
            store_id = audit_store.store_id(tx)
        self._return_slices(mission_id, by)
        if handover_to is None:
            return self._pack(mission_id, signer, store_id, None)
        if by is None:
            raise NotAuthorized("a handover needs a principal with 'stop' (by=...)")
        if handover_to == store_id:
            raise StateError("a handover goes to another store, not to this one")
        with self._db.transaction() as tx:  # who asks is checked (and a refusal audited) first
            self._authority.authorize(tx, by, mission_id, Right.STOP, entity=mission_id)
        self._pack(mission_id, signer, store_id, handover_to, fence_by=by.name)
        self._fence(mission_id, handover_to, by)
        return self._pack(mission_id, signer, store_id, handover_to)

    def _return_slices(self, mission_id: str, by: Principal | None) -> None:
        """L10: the mission's open escrow slices come back before it is packed,
        so the snapshot's books hold no grant and every slice's chain ends where
        the mission's chain says. Their holders go on through the mission's gate."""
        with lanes.bypassed(mission_id), self._db.transaction(gate=mission_id) as tx:
            if escrow_store.open_slices(tx, mission_id):
                escrow.revoke(tx, mission_id, "exported", actor=by.name if by else "engine")

    def _pack(
        self,
        mission_id: str,
        signer: Signer,
        store_id: str,
        handover_to: str | None,
        *,
        fence_by: str | None = None,
    ) -> bytes:
        """The snapshot, checked as the target's import will check it. Before a
        fence by ``fence_by``, the runs it will hand off are named already and
        every bound keeps room for what the fence adds (:func:`_growth`)."""
        with self._db.read() as tx:
            missions.load(tx, mission_id)
            checked = audit.verify(tx, mission_id)
            if not checked.ok:
                raise AuditError(
                    f"mission {mission_id}'s audit chain is broken at event "
                    f"{checked.broken_at} ({checked.problem}): it is not signed into a snapshot",
                    mission_id=mission_id,
                )
            head = audit_store.head(tx, mission_id)
            assert head is not None
            state = _state(tx, mission_id)
            events = audit_store.all_events(tx, mission_id)
            artifacts = _manifest(tx, mission_id)
            now_us = tx.now_us
        runs = [r for r in state["runs"] if r["status"] == RunStatus.HANDED_OFF]
        live = [r for r in state["runs"] if fence_by and not RunStatus(r["status"]).terminal]
        handover = (
            None
            if handover_to is None
            else {"to_store": handover_to, "runs": [r["id"] for r in runs + live]}
        )
        try:
            data = pack(
                mission_id=mission_id,
                head=head,
                events=events,
                state=state,
                artifacts=artifacts,
                signer=signer,
                exported_at_us=now_us,
                store_id=store_id,
                handover=handover,
                headroom=0 if fence_by is None else _growth(state, live, handover_to, fence_by),
            )
            load(data, [signer.public_key])
        except SnapshotRefused as exc:
            raise _refused(mission_id, exc, handover_to, fenced=fence_by is None) from None
        return data

    def _fence(self, mission_id: str, to_store: str, by: Principal) -> None:
        """Fence every live run and seal the mission, in one transaction (S5)."""
        with self._db.transaction() as tx:
            self._authority.authorize(tx, by, mission_id, Right.STOP, entity=mission_id)
            fenced = []
            for run in run_store.list_runs(tx, mission_id):
                if run.status.terminal:
                    continue
                epoch = run_store.hand_off(tx, run.id, f"handed over to store {to_store}")
                settlement.void_prepared(
                    tx, run.id, "handed over", actor=by.name, segment=None, epoch=epoch
                )
                # A send under way has lost its owner, as at a takeover (R4): what
                # it reports is kept as late evidence here (charter.attempts.late.keep_sealed).
                for a in attempts_store.list_attempts(tx, run_id=run.id, unresolved=True):
                    if a.status is AttemptStatus.DISPATCHED:
                        lost = f"owner lost: handed over to store {to_store}"
                        settlement.mark_unknown(
                            tx, a, lost, actor=by.name, segment=None, epoch=epoch
                        )
                tx.audit(
                    mission_id,
                    "run.handed_off",
                    run.id,
                    actor=by.name,
                    epoch=epoch,
                    before=run.status.value,
                    after=RunStatus.HANDED_OFF.value,
                    payload={"to_store": to_store},
                )
                fenced.append(run.id)
            tx.audit(
                mission_id,
                "mission.handed_over",
                mission_id,
                actor=by.name,
                payload={"to_store": to_store, "runs": fenced},
            )
            tx.seal(mission_id, f"handed over to store {to_store}")

    # -- import (S2) ------------------------------------------------------------------
    def import_snapshot(self, data: bytes) -> str:
        """Verify a snapshot completely, then file its mission sealed in one
        transaction; returns its id. Never dispatches, never resumes."""
        snapshot = load(data, self._trusted())
        with self._db.transaction() as tx:
            mine = audit_store.store_id(tx)
            handover = snapshot.handover
            seal = (
                SEAL_HANDED_IN
                if handover is not None and handover["to_store"] == mine
                else SEAL_IMPORTED
            )
            if audit_store.head(tx, snapshot.mission_id) is not None:
                raise SnapshotRefused(
                    f"mission {snapshot.mission_id} is already in this store; nothing was imported",
                    problem="exists",
                    mission_id=snapshot.mission_id,
                )
            contracts_store.restore(tx, snapshot.state, sealed=seal)
            ledger_store.restore(tx, snapshot.state)
            run_store.restore(tx, snapshot.state)
            attempts_store.restore(tx, snapshot.state)
            waits_store.restore(tx, snapshot.state)
            plans_store.restore(tx, snapshot.state)
            escrow_store.restore(tx, snapshot.state)
            audit_store.restore(tx, snapshot.events)
            audit_store.restore(tx, snapshot.state["escrow_events"])
            tx.audit(
                ENGINE_CHAIN,
                "snapshot.imported",
                snapshot.mission_id,
                actor="engine",
                after=seal,
                payload={
                    k: snapshot.header[k]
                    for k in ("head", "key_id", "store_id", "exported_at_us", "handover")
                },
            )
        return snapshot.mission_id

    # -- adoption (S5) ----------------------------------------------------------------
    def adopt(
        self,
        mission_id: str,
        *,
        by: Principal,
        segment_id: str,
        plan: Plan | None = None,
    ) -> list[Executor]:
        """Accept a mission handed over to this store: ``by`` needs ``adopt``. Each
        handed-off run is followed by a linked run (one executor each, in order)."""
        with self._db.transaction() as tx:
            self._authority.vouch(tx, by)
            if audit_store.sealed(tx, mission_id) != SEAL_HANDED_IN:
                missions.load(tx, mission_id)
                raise StateError(
                    f"mission {mission_id} was not handed over to this store (or was adopted "
                    "already): only a handover snapshot naming this store is adopted",
                    mission_id=mission_id,
                )
            if not self._authority.current(tx, mission_id).allows(by.name, Right.ADOPT):
                # The mission's chain takes no event until adopted: the refusal goes
                # on the engine's.
                raise tx.refused(
                    NotAuthorized(
                        f"principal {by.name!r} has no 'adopt' right in mission {mission_id}",
                        principal=by.name,
                        right="adopt",
                    ),
                    mission_id=ENGINE_CHAIN,
                    kind="authorization.refused",
                    entity=mission_id,
                    actor=by.name,
                    payload={"right": "adopt", "reason": "not_authorized"},
                )
            tx.lock_mission(mission_id)
            tx.seal(mission_id, None)
            tx.audit(mission_id, "mission.adopted", mission_id, actor=by.name)
            handed = [
                r
                for r in run_store.list_runs(tx, mission_id)
                if r.status is RunStatus.HANDED_OFF and run_store.follower(tx, r.id) is None
            ]
            return [
                follow(
                    self._runtime,
                    tx,
                    run,
                    actor=by.name,
                    segment_id=segment_id,
                    plan=plan,
                    input_json=None,
                )
                for run in handed
            ]

    # -- the handoff report (S4) ------------------------------------------------------
    def handoff(
        self, *, mission_id: str | None = None, snapshot: bytes | None = None
    ) -> dict[str, Any]:
        """The handoff report of a snapshot file's bytes (verified first) or of a
        mission in this store. A view: see :mod:`charter.audit.handoff`."""
        if snapshot is not None:
            snap: Snapshot = load(snapshot, self._trusted())
            head = dict(snap.header["head"])
            source: dict[str, Any] = {"kind": "snapshot", "store_id": snap.header["store_id"]}
            return handoff.build(
                source={**source, "head": head, "key_id": snap.header["key_id"]},
                state=snap.state,
                artifacts=snap.artifacts,
                available=lambda _: False,  # the bytes stay with the source store
                now_us=int(snap.header["exported_at_us"]),
            )
        if mission_id is None:
            raise ConfigError("handoff needs a mission id or a snapshot")
        with self._db.read() as tx:
            missions.load(tx, mission_id)
            return handoff.build(
                source={"kind": "store", "sealed": audit_store.sealed(tx, mission_id)},
                state=_state(tx, mission_id),
                artifacts=_manifest(tx, mission_id),
                available=_checker(LocalObjects(self._runtime.config.artifacts)),
                now_us=tx.now_us,
            )

    # -- checkpoints (S2) --------------------------------------------------------------
    def verify_checkpoints(self, mission_id: str | None = None) -> list[dict[str, Any]]:
        """Check each chain's latest signed checkpoint against its events: a store
        rewritten consistently (every hash recomputed) fails here, since the
        rewriter cannot sign. A chain with events and no checkpoint is reported."""
        trusted = self._trusted()
        out = []
        with self._db.read() as tx:
            chains = [mission_id] if mission_id is not None else audit.chains(tx)
            for chain in chains:
                out.append(_checkpoint(tx, chain, trusted))
        return out


def _checkpoint(tx: Tx, chain: str, trusted: list[str]) -> dict[str, Any]:
    head = audit_store.head(tx, chain)
    point = audit_store.checkpoint(tx, chain)
    result: dict[str, Any] = {"mission_id": chain, "ok": True, "signed_seq": None, "problem": None}
    if point is None:
        if head is not None and head.seq > 0:
            result.update(ok=False, problem="no signed checkpoint of this chain")
        return result
    result["signed_seq"] = point["seq"]
    try:
        signing.verify(
            trusted,
            point["key_id"],
            checkpoint_statement(chain, point["seq"], point["hash"]),
            base64.b64decode(point["signature"]),
        )
    except SignatureInvalid as exc:
        result.update(ok=False, problem=f"checkpoint signature: {exc.message}")
        return result
    event = audit_store.event_at(tx, chain, point["seq"])
    if event is None or event["hash"] != point["hash"]:
        result.update(
            ok=False,
            problem=f"event {point['seq']} is not the one signed: the chain was rewritten",
        )
    return result


#: What the fence adds to a snapshot's entries, at most: per event (a run handed
#: off, an attempt voided or made uncertain, the mission handed over), and per
#: byte of an estimate the ledger moves of a voided attempt repeat (S5).
_EVENT_BYTES = 4096
_PER_ESTIMATE_BYTE = 8


def _growth(
    state: Mapping[str, Any], live: Sequence[Mapping[str, Any]], to_store: str | None, actor: str
) -> int:
    """How many bytes a fence of the ``live`` runs by ``actor`` can add to the
    snapshot, at most: its events in ``audit.jsonl`` (each naming the target
    store and its actor), and in ``state.json`` the runs' and attempts' changed
    statuses, epochs and reasons. Generous by design: the check it feeds must
    never pass a file that the fence then makes too large."""
    runs = {r["id"] for r in live}
    touched = [a for a in state["attempts"] if a["run_id"] in runs and a["status"] in _IN_FLIGHT]
    per_event = _EVENT_BYTES + 4 * len(to_store or "") + 2 * len(actor)
    return (
        per_event * (1 + len(live) + len(touched))
        + sum(_PER_ESTIMATE_BYTE * len(a["estimate"]) for a in touched)
        + sum(4 * len(r) for r in runs)
    )


def _refused(
    mission_id: str, exc: SnapshotRefused, handover_to: str | None, *, fenced: bool
) -> ExportRefused:
    """The export's refusal, saying what the import would have refused and what
    it left here (nothing fenced, unless the fence itself made the file bad)."""
    if handover_to is None:
        after = "nothing was exported"
    elif not fenced:
        after = "nothing was fenced: the mission stays here and may go on here"
    else:
        after = (
            "the mission was fenced here before this was found, which the check made "
            "before the fence should have prevented: keep the store as it is and report it"
        )
    return ExportRefused(
        f"mission {mission_id}'s snapshot would be refused by an import ({exc.message}); {after}",
        problem=exc.details.get("problem"),
        entry=exc.details.get("entry"),
        mission_id=mission_id,
        handover_to=handover_to,
        fenced=fenced and handover_to is not None,
    )


def _manifest(tx: Tx, mission_id: str) -> list[dict[str, Any]]:
    """The mission's artifacts as a snapshot lists them (S2, N2): each one's SHA-256,
    size and where it was saved (``RUN_ID/NAME``); the bytes stay in the store."""
    return [
        {"sha256": r["sha256"], "size": r["size"], "location": f"{run.id}/{r['name']}"}
        for run in run_store.list_runs(tx, mission_id)
        for r in artifacts_store.of_run(tx, run.id)
    ]


def _checker(objects: LocalObjects) -> Callable[[str], bool]:
    """Whether an artifact is in the store with a matching hash, checked (S4):
    missing, altered or unreadable is not available."""

    def available(sha256: str) -> bool:
        try:
            return objects.has(sha256) and objects.verify(sha256)
        except ArtifactError:
            return False

    return available
