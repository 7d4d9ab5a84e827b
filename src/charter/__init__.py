"""Charter: a durable, governed execution engine for AI-agent missions.

Every effect goes through an *attempt*: admitted against the mission's
allowance, written down before it is sent, settled after. At most one dispatch
per attempt; a settled effect is never performed again; exactly-once only
toward targets that deduplicate by idempotency key; everything uncertain goes
to evidence or a person.
"""

from __future__ import annotations

from charter.adapters import (
    Adapter,
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
)
from charter.attempts import Attempt, AttemptStatus
from charter.clock import Clock, ManualClock, SystemClock
from charter.config import EngineConfig
from charter.contracts import Contract
from charter.engine import Engine
from charter.errors import (
    AdapterError,
    AdmissionRefused,
    AllowanceExceeded,
    AmountOverflow,
    ApprovalRequired,
    AttemptAlreadySettled,
    AttemptFailed,
    AuditError,
    AuthenticationError,
    Blocked,
    CharterError,
    ConfigError,
    ContractError,
    Fenced,
    LeaseHeld,
    NeedsIntervention,
    NonDeterminismError,
    NotApplied,
    NotAuthorized,
    NotFound,
    RunTerminal,
    SchemaError,
    SecretUnavailable,
    SegmentReused,
    SettlementUnrecorded,
    StateError,
    StoreBusy,
    StoreError,
)
from charter.executor import Executor
from charter.node_reads import JournalEntry, NodeExecution
from charter.nodes import Context, Node, Plan, node
from charter.principals import Principal, Right, hash_secret, new_credential
from charter.runs import Run, RunStatus
from charter.secret import Secret

__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "AdapterError",
    "AdmissionRefused",
    "AllowanceExceeded",
    "AmountOverflow",
    "ApprovalRequired",
    "Attempt",
    "AttemptAlreadySettled",
    "AttemptFailed",
    "AttemptStatus",
    "AuditError",
    "AuthenticationError",
    "Blocked",
    "CharterError",
    "Clock",
    "ConfigError",
    "Context",
    "Contract",
    "ContractError",
    "Dispatch",
    "EffectClass",
    "Engine",
    "EngineConfig",
    "Estimate",
    "Evidence",
    "Executor",
    "Fenced",
    "JournalEntry",
    "LeaseHeld",
    "ManualClock",
    "NeedsIntervention",
    "Node",
    "NodeExecution",
    "NonDeterminismError",
    "NotApplied",
    "NotAuthorized",
    "NotFound",
    "Operation",
    "Outcome",
    "Plan",
    "Principal",
    "Right",
    "Run",
    "RunStatus",
    "RunTerminal",
    "SchemaError",
    "Secret",
    "SecretUnavailable",
    "SegmentReused",
    "SettlementUnrecorded",
    "StateError",
    "StoreBusy",
    "StoreError",
    "SystemClock",
    "__version__",
    "hash_secret",
    "new_credential",
    "node",
]
