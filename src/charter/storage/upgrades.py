"""How the schema changed after its first tables: versions 3 on, oldest first.

Each change is forward-only and says why it was made; an older store is brought
up to date by applying, in order, those it has not recorded
(:func:`charter.storage.migrate`). A store records each version it applied and
never applies it again, so a released change is not edited: a correction is a
new version.
:mod:`~charter.storage.schema` puts the first tables and these together.
"""

from __future__ import annotations

#: A statement of a migration: SQL for every backend, or ``(backend, SQL)`` for the
#: one backend (a dialect's name) whose schema needs it.
Statement = str | tuple[str, str]

#: A version of the schema: its number, what it is for, and its statements.
Migration = tuple[int, str, list[Statement]]

UPGRADES: list[Migration] = []

UPGRADES.append(
    (
        3,
        "recovery cost follows what is unresolved: settled counts on runs, fewer pages per commit",
        [
            # R5 reports settled attempts as counts; keep them as counters so that
            # recover() never scans a run's history.
            "ALTER TABLE runs ADD COLUMN n_succeeded BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE runs ADD COLUMN n_failed BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE runs ADD COLUMN n_written_off BIGINT NOT NULL DEFAULT 0",
            "ALTER TABLE runs ADD COLUMN n_voided BIGINT NOT NULL DEFAULT 0",
            """UPDATE runs SET
                n_succeeded = (SELECT COUNT(*) FROM attempts a
                               WHERE a.run_id = runs.id AND a.status = 'succeeded'),
                n_failed = (SELECT COUNT(*) FROM attempts a
                            WHERE a.run_id = runs.id AND a.status = 'failed'),
                n_written_off = (SELECT COUNT(*) FROM attempts a
                                 WHERE a.run_id = runs.id AND a.status = 'written_off'),
                n_voided = (SELECT COUNT(*) FROM attempts a
                            WHERE a.run_id = runs.id AND a.status = 'voided')""",
            # Every index is a page written (and synced) per commit on the hot path.
            # Mission-wide reads of open attempts go through the run's partial index.
            "DROP INDEX attempts_mission",
            "DROP INDEX ledger_entries_attempt",
            # The audit log is read by (mission, seq) only: key the table by it.
            """CREATE TABLE audit_events_v3 (
                mission_id TEXT NOT NULL,
                seq BIGINT NOT NULL,
                at_us BIGINT NOT NULL,
                actor TEXT NOT NULL,
                segment TEXT,
                epoch BIGINT,
                kind TEXT NOT NULL,
                entity TEXT NOT NULL,
                before TEXT,
                after TEXT,
                payload TEXT NOT NULL,
                payload_hash TEXT NOT NULL,
                prev_hash TEXT NOT NULL,
                hash TEXT NOT NULL,
                PRIMARY KEY (mission_id, seq)
            ){without_rowid}""",
            "INSERT INTO audit_events_v3 SELECT * FROM audit_events",
            "DROP TABLE audit_events",
            "ALTER TABLE audit_events_v3 RENAME TO audit_events",
        ],
    )
)

UPGRADES.append(
    (
        4,
        "linked runs: a node execution may continue one of the run it follows (N4)",
        [
            "ALTER TABLE node_executions ADD COLUMN inherited_run TEXT",
            "ALTER TABLE node_executions ADD COLUMN inherited_execution INTEGER",
        ],
    )
)

UPGRADES.append(
    (
        5,
        "linked runs: find a run's follower without scanning every run",
        ["CREATE INDEX runs_linked_from ON runs (linked_from) WHERE linked_from IS NOT NULL"],
    )
)

#: A chain's head on the row that keeps it (S1): the last event's ``seq`` and hash,
#: and how many first events were hashed before this version (see charter.audit.chain).
_HEAD_COLUMNS = (
    "audit_seq BIGINT NOT NULL DEFAULT 0",
    "audit_hash TEXT",
    "audit_legacy_seq BIGINT NOT NULL DEFAULT 0",
)


def _record_heads(table: str) -> str:
    """Record on each row of ``table`` where its chain ends now, all of it hashed
    the pre-6 way."""
    chain = f"FROM audit_events e WHERE e.mission_id = {table}.id"
    last_seq = f"COALESCE((SELECT MAX(e.seq) {chain}), 0)"
    return (
        f"UPDATE {table} SET audit_seq = {last_seq}, audit_legacy_seq = {last_seq}, "
        f"audit_hash = (SELECT e.hash {chain} ORDER BY e.seq DESC LIMIT 1)"
    )


UPGRADES.append(
    (
        6,
        "audit chains end at a head kept on their mission's row; existing events keep their hashes",
        [
            *(f"ALTER TABLE missions ADD COLUMN {c}" for c in _HEAD_COLUMNS),
            # The engine chain concerns no mission: its head has a row of its own.
            f"CREATE TABLE audit_chains (id TEXT PRIMARY KEY, {', '.join(_HEAD_COLUMNS)})",
            "INSERT INTO audit_chains (id) VALUES ('engine')",
            # An audit log is never rehashed: what exists now stays as it was hashed,
            # and the head records where it ends today.
            _record_heads("missions"),
            _record_heads("audit_chains"),
        ],
    )
)

UPGRADES.append(
    (
        7,
        "node retries replay what was settled; one live executor per run (A4, F1)",
        [
            # Whether the send's own answer settled the attempt, so the node that
            # sent it saw the outcome. An attempt settled later (evidence, a
            # person) was never seen by its node: after a proven non-application
            # the node retries it instead of failing on news it never had (A4).
            "ALTER TABLE attempts ADD COLUMN answered INTEGER NOT NULL DEFAULT 0",
            # Existing settlements keep the behaviour they were made under.
            "UPDATE attempts SET answered = 1 WHERE status IN ('succeeded', 'failed')",
            # The executor that holds the run, within its owner's epoch: a token
            # set by start and by each resume, cleared when that executor stops
            # (blocked) and by recover. Naming the owner's segment never makes a
            # second live executor: the older one is fenced at its next write.
            "ALTER TABLE runs ADD COLUMN owner_claim TEXT",
        ],
    )
)

UPGRADES.append(
    (
        8,
        "the process holding a run, so that its death on the same host is provable (R1)",
        [
            # Beside owner_claim: the OS process of the executor holding the run
            # (host, pid, start time as JSON), set and cleared with the claim.
            "ALTER TABLE runs ADD COLUMN owner_process TEXT",
        ],
    )
)

UPGRADES.append(
    (
        9,
        "graphs: durable waits beside approvals, artifacts, plan versions (W1, N2, N3)",
        [
            # Human input, timers and named events, keyed by an ID the node gives (W1).
            """CREATE TABLE waits (
                id TEXT PRIMARY KEY,
                mission_id TEXT NOT NULL REFERENCES missions(id),
                run_id TEXT NOT NULL REFERENCES runs(id),
                node_id TEXT NOT NULL,
                wait_key TEXT NOT NULL,
                kind TEXT NOT NULL,
                status TEXT NOT NULL,
                prompt TEXT,
                answer_type TEXT,
                due_at_us BIGINT,
                value TEXT,
                created_at_us BIGINT NOT NULL,
                satisfied_at_us BIGINT,
                satisfied_by TEXT,
                UNIQUE (run_id, wait_key)
            )""",
            "CREATE INDEX waits_open ON waits (status, kind)",
            # Content-addressed blobs a node saved under a name in its run (N2); the
            # bytes live in the artifact store, at a path derived from sha256 only.
            """CREATE TABLE artifacts (
                run_id TEXT NOT NULL REFERENCES runs(id),
                name TEXT NOT NULL,
                mission_id TEXT NOT NULL REFERENCES missions(id),
                node_id TEXT NOT NULL,
                execution INTEGER NOT NULL,
                sha256 TEXT NOT NULL,
                size BIGINT NOT NULL,
                created_at_us BIGINT NOT NULL,
                PRIMARY KEY (run_id, name)
            )""",
            "CREATE INDEX artifacts_mission ON artifacts (mission_id, sha256)",
            # A run's plan as changed by its nodes (N3): each version the steps it
            # added, and the journal position of the node execution that made it.
            """CREATE TABLE plan_versions (
                run_id TEXT NOT NULL REFERENCES runs(id),
                version INTEGER NOT NULL,
                steps TEXT NOT NULL,
                digest TEXT NOT NULL,
                node_id TEXT,
                execution INTEGER,
                seq INTEGER,
                created_by TEXT NOT NULL,
                created_at_us BIGINT NOT NULL,
                PRIMARY KEY (run_id, version)
            )""",
        ],
    )
)

UPGRADES.append(
    (
        10,
        "the operator's desk: runs listed and a run's approvals read by index",
        [
            "CREATE INDEX approvals_run ON approvals (run_id)",
            # Listings page runs by (created_at_us, id): read in that order, not sorted.
            "CREATE INDEX runs_created ON runs (created_at_us, id)",
        ],
    )
)

UPGRADES.append(
    (
        11,
        "snapshots and handover: sealed chains, signed checkpoints, the store's identity (S2, S5)",
        [
            # Why a chain takes no more events here (an imported copy, a mission
            # handed over to another store); NULL while it is live.
            "ALTER TABLE missions ADD COLUMN audit_sealed TEXT",
            "ALTER TABLE audit_chains ADD COLUMN audit_sealed TEXT",
            # The latest signed head of each chain, moved with the head when the
            # engine has a signing key: a consistent rewrite cannot re-sign it.
            """CREATE TABLE audit_checkpoints (
                mission_id TEXT PRIMARY KEY,
                seq BIGINT NOT NULL,
                hash TEXT NOT NULL,
                key_id TEXT NOT NULL,
                signature TEXT NOT NULL,
                at_us BIGINT NOT NULL
            )""",
            # One row: the id a handover names its target store by.
            "CREATE TABLE store_identity (id TEXT PRIMARY KEY, created_at_us BIGINT NOT NULL)",
        ],
    )
)

UPGRADES.append(
    (
        12,
        "the operator's desk: a run's audit timeline read by its entities, not the mission's chain",
        [
            # A run page pages the events about the run, its nodes, attempts,
            # approvals and waits: by entity, newest first, whatever the chain holds.
            "CREATE INDEX audit_events_entity ON audit_events (mission_id, entity, seq)",
        ],
    )
)

UPGRADES.append(
    (
        13,
        "sign-ins: a credential checked once and held as a session, known to every server (P1)",
        [
            # The session's ID only by digest (S3); the principal by name, so a
            # credential taken out of the configuration ends its sign-ins.
            """CREATE TABLE sign_ins (
                id_digest TEXT PRIMARY KEY,
                principal TEXT NOT NULL,
                csrf TEXT NOT NULL,
                created_at_us BIGINT NOT NULL,
                expires_us BIGINT NOT NULL
            )""",
            "CREATE INDEX sign_ins_expires ON sign_ins (expires_us)",
        ],
    )
)

#: The attempts table as migration 14 leaves it: no index of its own for the
#: idempotency key, which is derived from the attempt's id (A5), so the id's
#: uniqueness is the key's. Columns in their order since migration 7.
_ATTEMPT_COLUMNS = (
    "id, mission_id, run_id, node_id, execution, effect_key, generation, adapter, operation, "
    "effect_class, status, principal, admitted_epoch, dispatched_epoch, idempotency_key, "
    "request_hash, request, estimate, actual, result, receipt, price_source, retry_of, reason, "
    "send_deadline_us, prepared_at_us, dispatched_at_us, settled_at_us, answered"
)

UPGRADES.append(
    (
        14,
        "one page less per attempt: the idempotency key, derived from the id, has no index (A5)",
        [
            (
                "postgresql",
                "ALTER TABLE attempts DROP CONSTRAINT IF EXISTS attempts_idempotency_key_key",
            ),
            # SQLite drops a constraint's index only with its table: the attempts are
            # copied aside and back into the table made again. Evidence refers to
            # attempts; its references are checked at commit, when every attempt is
            # back under its id (a reference still dangling then fails the migration).
            ("sqlite", "PRAGMA defer_foreign_keys = ON"),
            ("sqlite", "CREATE TABLE attempts_v13 AS SELECT * FROM attempts"),
            ("sqlite", "DROP TABLE attempts"),
            (
                "sqlite",
                """CREATE TABLE attempts (
                id TEXT PRIMARY KEY,
                mission_id TEXT NOT NULL,
                run_id TEXT NOT NULL REFERENCES runs(id),
                node_id TEXT NOT NULL,
                execution INTEGER NOT NULL,
                effect_key TEXT NOT NULL,
                generation INTEGER NOT NULL,
                adapter TEXT NOT NULL,
                operation TEXT NOT NULL,
                effect_class TEXT NOT NULL,
                status TEXT NOT NULL,
                principal TEXT NOT NULL,
                admitted_epoch BIGINT NOT NULL,
                dispatched_epoch BIGINT,
                idempotency_key TEXT NOT NULL,
                request_hash TEXT NOT NULL,
                request TEXT NOT NULL,
                estimate TEXT NOT NULL,
                actual TEXT,
                result TEXT,
                receipt TEXT,
                price_source TEXT,
                retry_of TEXT,
                reason TEXT,
                send_deadline_us BIGINT,
                prepared_at_us BIGINT NOT NULL,
                dispatched_at_us BIGINT,
                settled_at_us BIGINT,
                answered INTEGER NOT NULL DEFAULT 0,
                UNIQUE (run_id, node_id, execution, effect_key, generation)
            )""",
            ),
            (
                "sqlite",
                f"INSERT INTO attempts ({_ATTEMPT_COLUMNS}) "
                f"SELECT {_ATTEMPT_COLUMNS} FROM attempts_v13 ORDER BY id",
            ),
            ("sqlite", "DROP TABLE attempts_v13"),
            (
                "sqlite",
                """CREATE INDEX attempts_unresolved ON attempts (run_id)
                WHERE status IN ('prepared', 'dispatched', 'unknown')""",
            ),
        ],
    )
)

# From 15 on, a ledger entry is carried by the audit event of its transition
# (its payload's ``ledger``, hashed into the chain) instead of a row of its own:
# ``ledger_entries`` keeps the entries written before and takes no more. No
# table changes; the version tells an older Charter, which would look for every
# entry in that table, that it cannot read this store.
UPGRADES.append((15, "ledger entries carried by their transitions' audit events (S1, L2)", []))

# From 16 on, runs may be submitted to be run by whichever worker is free (K1).
# The queue is the store's own: a run's place in it, which plan and queue it
# belongs to and when a worker should next look at it, is operational state, not
# part of the mission's record, so a snapshot leaves it behind. Takeovers are
# counted per effect left unresolved (K1), so a healthy run woken and carried on
# by many workers is never stopped for having been taken over often.
UPGRADES.append(
    (
        16,
        "runs run by workers: the queue of due runs, takeovers counted per unresolved effect",
        [
            """CREATE TABLE run_queue (
                run_id TEXT PRIMARY KEY REFERENCES runs(id),
                queue TEXT NOT NULL,
                plan TEXT NOT NULL,
                due_at_us BIGINT,
                taken_by TEXT,
                woken INTEGER NOT NULL DEFAULT 0,
                takes INTEGER NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX run_queue_due ON run_queue (queue, due_at_us)",
            """CREATE TABLE effect_takeovers (
                attempt_id TEXT PRIMARY KEY REFERENCES attempts(id),
                run_id TEXT NOT NULL,
                takeovers INTEGER NOT NULL
            )""",
            "CREATE INDEX effect_takeovers_run ON effect_takeovers (run_id)",
        ],
    )
)

# From 17 on, a run that needs a person is told to webhooks (K3) through an
# outbox: a notice is written once per run and reason, and each webhook that
# takes its kind has a delivery row that deliverers claim, retry with backoff
# and mark done only after a 2xx. Operational state: a snapshot leaves it behind.
UPGRADES.append(
    (
        17,
        "notices that a run needs a person, and their webhook deliveries (K3)",
        [
            """CREATE TABLE notices (
                id TEXT PRIMARY KEY,
                run_id TEXT NOT NULL REFERENCES runs(id),
                mission_id TEXT NOT NULL,
                kind TEXT NOT NULL,
                reason TEXT NOT NULL,
                needs TEXT NOT NULL,
                attempts TEXT NOT NULL,
                created_at_us BIGINT NOT NULL,
                UNIQUE (run_id, reason)
            )""",
            """CREATE TABLE notice_deliveries (
                notice_id TEXT NOT NULL REFERENCES notices(id),
                webhook TEXT NOT NULL,
                status TEXT NOT NULL,
                tries INTEGER NOT NULL,
                due_at_us BIGINT NOT NULL,
                claimed_by TEXT,
                claimed_until_us BIGINT,
                last_error TEXT,
                delivered_at_us BIGINT,
                PRIMARY KEY (notice_id, webhook)
            )""",
            """CREATE INDEX notice_deliveries_due ON notice_deliveries (due_at_us)
            WHERE status = 'pending'""",
        ],
    )
)

# From 18 on, a worker may lease a slice of a mission's allowance (L10): the slice
# keeps its own accounts and its own audit chain (its head on its row, as a
# mission's is on the mission's), so workers admitting against their slices share
# no row; ``escrow_holds`` says which slice an attempt's hold was taken from.
UPGRADES.append(
    (
        18,
        "escrow: slices of a mission's allowance leased by workers, each with its own chain (L10)",
        [
            """CREATE TABLE escrow_slices (
                id TEXT PRIMARY KEY,
                mission_id TEXT NOT NULL REFERENCES missions(id),
                holder TEXT NOT NULL,
                status TEXT NOT NULL,
                lease_expires_us BIGINT NOT NULL,
                leased_at_us BIGINT NOT NULL,
                returned_at_us BIGINT,
                returned_why TEXT,
                attempts_admitted BIGINT NOT NULL DEFAULT 0,
                attempts_failed BIGINT NOT NULL DEFAULT 0,
                audit_seq BIGINT NOT NULL DEFAULT 0,
                audit_hash TEXT,
                audit_sealed TEXT,
                audit_legacy_seq BIGINT NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX escrow_slices_open ON escrow_slices (mission_id, status)",
            """CREATE TABLE escrow_accounts (
                slice_id TEXT NOT NULL REFERENCES escrow_slices(id),
                unit TEXT NOT NULL,
                limit_amount BIGINT NOT NULL,
                available BIGINT NOT NULL,
                held BIGINT NOT NULL,
                spent BIGINT NOT NULL,
                overrun BIGINT NOT NULL,
                PRIMARY KEY (slice_id, unit)
            )""",
            """CREATE TABLE escrow_holds (
                attempt_id TEXT PRIMARY KEY,
                slice_id TEXT NOT NULL REFERENCES escrow_slices(id)
            )""",
            "CREATE INDEX escrow_holds_slice ON escrow_holds (slice_id)",
        ],
    )
)

UPGRADES.append(
    (
        19,
        "the runs that wait for a person, read by a partial index (K3)",
        [
            # The inbox lists them on every visit; without it each status was a
            # scan of every run the store ever held. Partial: a run is written to
            # it only while it waits for a person, so the hot path pays nothing.
            """CREATE INDEX runs_need_people ON runs (updated_at_us)
                WHERE status IN ('needs_intervention', 'paused', 'stopping')""",
        ],
    )
)

# From 20 on, the human resume policy (R9) tells a run that was interrupted from
# one that let go of itself: a row in ``runs_let_go`` is written when its
# executor lets go (a wait, a pause, a stopping worker) and removed when an
# executor claims the run or a takeover finds its owner still holding it. Only
# an interrupted run needs a person's word, which a person gives a run that
# workers carry as a go-ahead: the next worker to take the run continues it on
# that word, instead of the person running the plan in their own process. Both
# are operational state, like the queue: a snapshot leaves them behind.
UPGRADES.append(
    (
        20,
        "runs that let go of themselves, and a person's go-ahead for a worker (R9, K1)",
        [
            "CREATE TABLE runs_let_go (run_id TEXT PRIMARY KEY REFERENCES runs(id))",
            "ALTER TABLE run_queue ADD COLUMN go_ahead_by TEXT",
        ],
    )
)

# From 21 on, a claim proves a segment (X3): every claim the store hands an
# executor is kept as a digest with its run, epoch and segment, so a call that
# speaks for a segment (a remote client's report, renewal, release, node calls)
# is checked against the claim that segment was given, not only against the
# run's current owner's. A taken-over segment's late report is then proven, and
# a stranger's refused, before anything is written. Operational state, like the
# queue: a snapshot leaves it behind (a handed-off run has no segment to prove).
UPGRADES.append(
    (
        21,
        "the claims the store issued, as digests per run, epoch and segment (X3)",
        [
            """CREATE TABLE run_claims (
                run_id TEXT NOT NULL REFERENCES runs(id),
                epoch BIGINT NOT NULL,
                segment_id TEXT NOT NULL,
                digest TEXT NOT NULL,
                issued_at_us BIGINT NOT NULL,
                PRIMARY KEY (run_id, epoch, digest)
            )""",
        ],
    )
)

# From 22 on, the MCP gateway (G3) finds a client's call again: each call it
# admits is a run of its own, and this index maps the call's identity (the
# client's key, or the arguments within the tool's window) to that run, so a
# retry, after a crash or on another gateway, answers from the run's record
# instead of calling the upstream again. Written before the call's attempt is
# admitted; a conflict means another request already owns the call.
UPGRADES.append(
    (
        22,
        "the MCP gateway's calls: a client's call identity mapped to its run (G3)",
        [
            """CREATE TABLE gateway_calls (
                mission_id TEXT NOT NULL,
                principal TEXT NOT NULL,
                call_key TEXT NOT NULL,
                run_id TEXT NOT NULL REFERENCES runs(id),
                tool TEXT NOT NULL,
                created_at_us BIGINT NOT NULL,
                PRIMARY KEY (mission_id, principal, call_key)
            )""",
            "CREATE INDEX gateway_calls_run ON gateway_calls (run_id)",
        ],
    )
)
