"""Charter: a durable, governed execution engine for AI-agent missions.

Every effect goes through an *attempt*: admitted against the mission's
allowance, written down before it is sent, settled after. At most one dispatch
per attempt; a settled effect is never performed again; exactly-once only
toward targets that deduplicate by idempotency key; everything uncertain goes
to evidence or a person.

Errors live in :mod:`charter.errors`. The face lists the few that user code
meets in its own code (a node, an adapter); every other one is reachable here
too, for code written before, but imported from :mod:`charter.errors` (its
docstring draws the tree and says why).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from charter import errors
from charter.adapters import (
    Adapter,
    Dispatch,
    EffectClass,
    Estimate,
    Evidence,
    Operation,
    Outcome,
    RecordedAttempt,
)
from charter.clock import Clock, ManualClock, SystemClock
from charter.errors import (
    AnswerNotRecorded,
    ApprovalRequired,
    AttemptFailed,
    Blocked,
    CharterError,
    Fenced,
    NodeFailed,
    NotApplied,
    OutcomeUnknown,
)
from charter.secret import Secret
from charter.telemetry import ObservedAttempt, ObservedNode, ObservedRun, Observer

if TYPE_CHECKING:
    from charter.attempts.handed import RemoteAdmission, RemoteReport
    from charter.attempts.model import Attempt, AttemptStatus
    from charter.audit.chain import Verification
    from charter.audit.handoff import handoff_markdown
    from charter.audit.signing import new_signing_key
    from charter.config import EngineConfig, Webhook
    from charter.contracts.contract import (
        ApprovalPolicy,
        Contract,
        StopConditions,
        Unit,
        show_amounts,
    )
    from charter.contracts.model import Mission, SignIn
    from charter.contracts.principals import Principal, Right, hash_secret, new_credential
    from charter.engine.coordinator import Coordinator
    from charter.engine.engine import Engine
    from charter.engine.executor import Executor
    from charter.engine.overview import Figures
    from charter.ledger.accounts import Balance
    from charter.plans.graph import Step
    from charter.plans.journal import JournalEntry, NodeExecution
    from charter.plans.nodes import Context, Node, Plan, node
    from charter.recovery.state import NextAction, RecoveryState
    from charter.runs.run import Run, RunStatus
    from charter.waits.model import Approval, ApprovalStatus, Wait, WaitKind, WaitStatus
    from charter.workers.worker import Teller, Worker

#: Names whose modules load the store, imported on first use: ``import
#: charter.adapters`` (an adapter, ``charter.testing``) never loads the engine.
_LAZY = {
    "Approval": "charter.waits.model",
    "ApprovalPolicy": "charter.contracts.contract",
    "ApprovalStatus": "charter.waits.model",
    "Attempt": "charter.attempts.model",
    "AttemptStatus": "charter.attempts.model",
    "Balance": "charter.ledger.accounts",
    "EngineConfig": "charter.config",
    "Webhook": "charter.config",
    "Contract": "charter.contracts.contract",
    "Coordinator": "charter.engine.coordinator",
    "Engine": "charter.engine.engine",
    "Executor": "charter.engine.executor",
    "Figures": "charter.engine.overview",
    "JournalEntry": "charter.plans.journal",
    "NodeExecution": "charter.plans.journal",
    "Context": "charter.plans.nodes",
    "Node": "charter.plans.nodes",
    "Plan": "charter.plans.nodes",
    "node": "charter.plans.nodes",
    "Principal": "charter.contracts.principals",
    "Right": "charter.contracts.principals",
    "hash_secret": "charter.contracts.principals",
    "new_credential": "charter.contracts.principals",
    "Mission": "charter.contracts.model",
    "NextAction": "charter.recovery.state",
    "RecoveryState": "charter.recovery.state",
    "RemoteAdmission": "charter.attempts.handed",
    "RemoteReport": "charter.attempts.handed",
    "SignIn": "charter.contracts.model",
    "StopConditions": "charter.contracts.contract",
    "Unit": "charter.contracts.contract",
    "show_amounts": "charter.contracts.contract",
    "Verification": "charter.audit.chain",
    "Wait": "charter.waits.model",
    "WaitKind": "charter.waits.model",
    "WaitStatus": "charter.waits.model",
    "new_signing_key": "charter.audit.signing",
    "handoff_markdown": "charter.audit.handoff",
    "Run": "charter.runs.run",
    "Step": "charter.plans.graph",
    "RunStatus": "charter.runs.run",
    "Teller": "charter.workers.worker",
    "Worker": "charter.workers.worker",
}


def __getattr__(name: str) -> Any:
    if name in errors.__all__:  # every error, for code written before charter.errors
        return getattr(errors, name)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'charter' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


__version__ = "0.1.0"

__all__ = [
    "Adapter",
    "AnswerNotRecorded",
    "Approval",
    "ApprovalPolicy",
    "ApprovalRequired",
    "ApprovalStatus",
    "Attempt",
    "AttemptFailed",
    "AttemptStatus",
    "Balance",
    "Blocked",
    "CharterError",
    "Clock",
    "Context",
    "Contract",
    "Coordinator",
    "Dispatch",
    "EffectClass",
    "Engine",
    "EngineConfig",
    "Estimate",
    "Evidence",
    "Executor",
    "Fenced",
    "Figures",
    "JournalEntry",
    "ManualClock",
    "Mission",
    "NextAction",
    "Node",
    "NodeExecution",
    "NodeFailed",
    "NotApplied",
    "ObservedAttempt",
    "ObservedNode",
    "ObservedRun",
    "Observer",
    "Operation",
    "Outcome",
    "OutcomeUnknown",
    "Plan",
    "Principal",
    "RecordedAttempt",
    "RecoveryState",
    "RemoteAdmission",
    "RemoteReport",
    "Right",
    "Run",
    "RunStatus",
    "Secret",
    "SignIn",
    "Step",
    "StopConditions",
    "SystemClock",
    "Teller",
    "Unit",
    "Verification",
    "Wait",
    "WaitKind",
    "WaitStatus",
    "Webhook",
    "Worker",
    "__version__",
    "errors",
    "handoff_markdown",
    "hash_secret",
    "new_credential",
    "new_signing_key",
    "node",
    "show_amounts",
]
