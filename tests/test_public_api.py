"""The public names are a decision: renaming or dropping one must show up here."""

from __future__ import annotations

import charter

PUBLIC = [
    "Adapter",
    "AdapterError",
    "AdmissionRefused",
    "AllowanceExceeded",
    "AmountOverflow",
    "AnswerNotRecorded",
    "ApprovalRequired",
    "ArtifactError",
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
    "MissingExtra",
    "MissionSealed",
    "NeedsIntervention",
    "Node",
    "NodeExecution",
    "NodeFailed",
    "NonDeterminismError",
    "NotApplied",
    "NotAuthorized",
    "NotFound",
    "ObservedAttempt",
    "ObservedNode",
    "ObservedRun",
    "Observer",
    "Operation",
    "Outcome",
    "OutcomeUnknown",
    "Plan",
    "PlanError",
    "Principal",
    "RecordedAttempt",
    "Right",
    "Run",
    "RunStatus",
    "RunTerminal",
    "SchemaError",
    "Secret",
    "SecretUnavailable",
    "SegmentReused",
    "SettlementUnrecorded",
    "SignIn",
    "SignatureInvalid",
    "SnapshotMalformed",
    "SnapshotRefused",
    "SnapshotTampered",
    "StateError",
    "Step",
    "StoreBusy",
    "StoreError",
    "StoreNotFound",
    "SystemClock",
    "TextRefused",
    "UsageError",
    "WaitError",
    "WaitPending",
    "__version__",
    "handoff_markdown",
    "hash_secret",
    "new_credential",
    "new_signing_key",
    "node",
]


def test_public_names_are_pinned_and_sorted() -> None:
    assert charter.__all__ == PUBLIC
    assert sorted(charter.__all__, key=str.lower) == sorted(PUBLIC, key=str.lower)
    for name in PUBLIC:
        assert hasattr(charter, name), name


def test_every_error_has_one_root_and_a_stable_code() -> None:
    errors = [getattr(charter, n) for n in PUBLIC if n.endswith(("Error", "Refused"))]
    errors += [charter.NotFound, charter.NotAuthorized, charter.AttemptAlreadySettled]
    codes = set()
    for error in errors:
        assert issubclass(error, charter.CharterError), error
        codes.add(error.code)
    assert len(codes) == len(set(errors))
    # Signals user code must not swallow are not Exceptions.
    assert not issubclass(charter.Fenced, Exception)
    assert not issubclass(charter.Blocked, Exception)
