"""Versioned, forward-only, transactional migrations, recorded in a table.

Each migration is a list of statements applied in one transaction together with
its row in ``schema_migrations``. A store whose recorded version is newer than
this code knows is refused (:class:`~charter.errors.SchemaError`) rather than
guessed at.

Here are the first tables (versions 1 and 2: the core, then the nodes'), and
:data:`MIGRATIONS`, every version in order; how the schema changed after them
is in :mod:`~charter.storage.upgrades`.
"""

from __future__ import annotations

from charter.storage.record_upgrades import RECORD_UPGRADES
from charter.storage.upgrades import UPGRADES, Migration, Statement

__all__ = ["LATEST", "MIGRATIONS", "Migration", "Statement"]

MIGRATIONS: list[Migration] = [
    (
        1,
        "core: missions, contracts, allowances, ledger, runs, attempts, audit",
        [
            """CREATE TABLE missions (
                id TEXT PRIMARY KEY,
                name TEXT NOT NULL,
                created_by TEXT NOT NULL,
                created_at_us BIGINT NOT NULL,
                contract_version INTEGER NOT NULL,
                attempts_admitted BIGINT NOT NULL DEFAULT 0,
                attempts_failed BIGINT NOT NULL DEFAULT 0
            )""",
            """CREATE TABLE contract_versions (
                mission_id TEXT NOT NULL REFERENCES missions(id),
                version INTEGER NOT NULL,
                body TEXT NOT NULL,
                digest TEXT NOT NULL,
                reason TEXT NOT NULL,
                created_by TEXT NOT NULL,
                created_at_us BIGINT NOT NULL,
                PRIMARY KEY (mission_id, version)
            )""",
            """CREATE TABLE allowances (
                mission_id TEXT NOT NULL REFERENCES missions(id),
                unit TEXT NOT NULL,
                limit_amount BIGINT NOT NULL,
                available BIGINT NOT NULL,
                held BIGINT NOT NULL,
                spent BIGINT NOT NULL,
                overrun BIGINT NOT NULL,
                PRIMARY KEY (mission_id, unit)
            )""",
            """CREATE TABLE ledger_entries (
                id {serial_pk},
                mission_id TEXT NOT NULL,
                unit TEXT NOT NULL,
                attempt_id TEXT,
                kind TEXT NOT NULL,
                source TEXT NOT NULL,
                target TEXT NOT NULL,
                amount BIGINT NOT NULL CHECK (amount > 0),
                price_source TEXT,
                at_us BIGINT NOT NULL
            )""",
            "CREATE INDEX ledger_entries_mission ON ledger_entries (mission_id, unit)",
            "CREATE INDEX ledger_entries_attempt ON ledger_entries (attempt_id)",
            """CREATE TABLE runs (
                id TEXT PRIMARY KEY,
                mission_id TEXT NOT NULL REFERENCES missions(id),
                principal TEXT NOT NULL,
                status TEXT NOT NULL,
                status_reason TEXT,
                epoch BIGINT NOT NULL,
                owner_segment TEXT NOT NULL,
                lease_expires_us BIGINT NOT NULL,
                recoveries INTEGER NOT NULL DEFAULT 0,
                linked_from TEXT,
                created_at_us BIGINT NOT NULL,
                updated_at_us BIGINT NOT NULL
            )""",
            "CREATE INDEX runs_mission ON runs (mission_id)",
            """CREATE TABLE segments (
                run_id TEXT NOT NULL REFERENCES runs(id),
                segment_id TEXT NOT NULL,
                epoch BIGINT NOT NULL,
                started_at_us BIGINT NOT NULL,
                forced INTEGER NOT NULL DEFAULT 0,
                PRIMARY KEY (run_id, segment_id)
            )""",
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
                idempotency_key TEXT NOT NULL UNIQUE,
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
                UNIQUE (run_id, node_id, execution, effect_key, generation)
            )""",
            # Recovery cost follows what is unresolved, not history.
            """CREATE INDEX attempts_unresolved ON attempts (run_id)
                WHERE status IN ('prepared', 'dispatched', 'unknown')""",
            "CREATE INDEX attempts_mission ON attempts (mission_id, status)",
            """CREATE TABLE evidence (
                id TEXT PRIMARY KEY,
                attempt_id TEXT NOT NULL REFERENCES attempts(id),
                mission_id TEXT NOT NULL,
                source TEXT NOT NULL,
                verdict TEXT NOT NULL,
                outcome TEXT,
                detail TEXT,
                epoch BIGINT,
                actor TEXT NOT NULL,
                recorded_at_us BIGINT NOT NULL,
                settled INTEGER NOT NULL DEFAULT 0
            )""",
            "CREATE INDEX evidence_attempt ON evidence (attempt_id)",
            """CREATE TABLE incidents (
                id TEXT PRIMARY KEY,
                mission_id TEXT NOT NULL,
                run_id TEXT,
                attempt_id TEXT,
                kind TEXT NOT NULL,
                detail TEXT NOT NULL,
                status TEXT NOT NULL,
                opened_at_us BIGINT NOT NULL,
                closed_at_us BIGINT,
                closed_by TEXT,
                close_note TEXT
            )""",
            "CREATE INDEX incidents_open ON incidents (mission_id) WHERE status = 'open'",
            """CREATE TABLE approvals (
                id TEXT PRIMARY KEY,
                mission_id TEXT NOT NULL,
                run_id TEXT NOT NULL,
                effect_id TEXT NOT NULL,
                scope TEXT NOT NULL,
                request_hash TEXT NOT NULL,
                status TEXT NOT NULL,
                requested_at_us BIGINT NOT NULL,
                decided_by TEXT,
                decided_at_us BIGINT,
                expires_at_us BIGINT
            )""",
            "CREATE INDEX approvals_effect ON approvals (effect_id, request_hash)",
            """CREATE TABLE audit_events (
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
            )""",
        ],
    ),
    (
        2,
        "nodes: node executions, the journal of nondeterministic values, run plans",
        [
            "ALTER TABLE runs ADD COLUMN plan TEXT",
            "ALTER TABLE runs ADD COLUMN input TEXT",
            """CREATE TABLE node_executions (
                run_id TEXT NOT NULL REFERENCES runs(id),
                node_id TEXT NOT NULL,
                execution INTEGER NOT NULL,
                status TEXT NOT NULL,
                crashes INTEGER NOT NULL DEFAULT 0,
                result TEXT,
                result_hash TEXT,
                error TEXT,
                started_epoch BIGINT NOT NULL,
                started_at_us BIGINT NOT NULL,
                completed_at_us BIGINT,
                PRIMARY KEY (run_id, node_id, execution)
            )""",
            """CREATE TABLE journal (
                run_id TEXT NOT NULL,
                node_id TEXT NOT NULL,
                execution INTEGER NOT NULL,
                seq INTEGER NOT NULL,
                kind TEXT NOT NULL,
                value TEXT NOT NULL,
                PRIMARY KEY (run_id, node_id, execution, seq)
            )""",
        ],
    ),
]

MIGRATIONS.extend(UPGRADES)
MIGRATIONS.extend(RECORD_UPGRADES)

LATEST = MIGRATIONS[-1][0]
