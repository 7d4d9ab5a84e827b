"""The public names are a decision: renaming or dropping one must show up here."""

from __future__ import annotations

import importlib
import inspect
import re
import typing
from collections.abc import Callable, Iterator

import charter
from charter.runs.ownership import Segment
from charter.storage import Tx

PUBLIC = [
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


def test_public_names_are_pinned_and_sorted() -> None:
    assert charter.__all__ == PUBLIC
    assert sorted(charter.__all__, key=str.lower) == sorted(PUBLIC, key=str.lower)
    for name in PUBLIC:
        assert hasattr(charter, name), name


def test_every_error_has_one_root_and_a_stable_code() -> None:
    errors = [getattr(charter.errors, n) for n in charter.errors.__all__]
    callers = [e for e in errors if issubclass(e, Exception) and e.__module__ == "charter.errors"]
    callers = [e for e in callers if e not in (charter.NotApplied, charter.OutcomeUnknown)]
    codes = set()
    for error in callers:
        assert issubclass(error, charter.CharterError), error
        codes.add(error.code)
    assert len(codes) == len(callers)
    # Signals user code must not swallow are not Exceptions.
    assert not issubclass(charter.Fenced, Exception)
    assert not issubclass(charter.Blocked, Exception)


#: The errors the face lists: what user code meets in its own code (a node, an
#: adapter). The rest are imported from charter.errors.
FACE_ERRORS = [
    "AnswerNotRecorded",
    "ApprovalRequired",
    "AttemptFailed",
    "Blocked",
    "CharterError",
    "Fenced",
    "NodeFailed",
    "NotApplied",
    "OutcomeUnknown",
]


def test_errors_have_their_own_namespace_and_the_face_keeps_them_reachable() -> None:
    """``charter.errors`` lists every error; the face lists only the few user code
    meets, and still answers every other one by name (code written before keeps
    working, as httpx and Temporal re-export theirs) without listing it."""
    defined = sorted(
        name
        for name, value in vars(charter.errors).items()
        if inspect.isclass(value)
        and issubclass(value, BaseException)
        and value.__module__ == "charter.errors"
    )
    assert sorted(charter.errors.__all__) == defined
    assert "errors" in charter.__all__ and charter.errors.__name__ == "charter.errors"
    listed = [n for n in charter.__all__ if n in charter.errors.__all__]
    assert listed == FACE_ERRORS
    for name in charter.errors.__all__:
        assert getattr(charter, name) is getattr(charter.errors, name), name
    unlisted = set(charter.errors.__all__) - set(FACE_ERRORS)
    assert not unlisted & set(dir(charter))
    from charter import ExportRefused  # the spelling code written before uses

    assert ExportRefused is charter.errors.ExportRefused


_TREE_LINE = re.compile(r"^    ((?:│   |    )*)([├└]── )?([A-Z][A-Za-z]+)(?:\s|$)")


def test_the_errors_docstring_draws_the_whole_tree() -> None:
    """Each error appears once in the tree the module's docstring draws, under its
    own base class: an error added without its place in the picture fails here."""
    drawn: dict[str, str | None] = {}
    stack: list[tuple[int, str]] = []
    for line in (charter.errors.__doc__ or "").splitlines():
        match = _TREE_LINE.match(line)
        if match is None:
            continue
        depth = len(match.group(1)) // 4 + (match.group(2) is not None)
        name = match.group(3)
        while stack and stack[-1][0] >= depth:
            stack.pop()
        assert name not in drawn, f"{name} is drawn twice"
        drawn[name] = stack[-1][1] if stack else None
        stack.append((depth, name))
    roots = {name for name, parent in drawn.items() if parent is None}
    assert roots == {"CharterError", "BaseException", "Exception"}
    assert set(drawn) - roots == set(charter.errors.__all__) - {"CharterError"}
    for name, parent in drawn.items():
        if parent is not None:
            bases = getattr(charter.errors, name).__bases__
            assert parent in [base.__name__ for base in bases], (name, parent)


# -- what the face's classes take and return ------------------------------------------

#: Classes the engine builds and hands out: their constructors take the engine's
#: insides (a store, a runtime, a segment) and are not part of the face. Users
#: get an ``Engine`` from ``Engine.open``, an ``Executor`` from ``start_run`` or
#: ``resume``, the ``Coordinator`` as ``engine.coordinator`` and a ``Context``
#: as a node's first argument.
MADE_BY_THE_ENGINE = frozenset({"Engine", "Executor", "Coordinator", "Context"})


#: Where else a type of the face may be imported from: the modules users import
#: by name, each a face of its own (the errors; what an adapter is made of; the
#: HTTP adapter kit that ``EngineConfig.adapters`` takes, docs/adapters.md).
KITS = ("charter.errors", "charter.adapters", "charter.adapters.http")


def _public_classes() -> list[type]:
    return [c for c in (getattr(charter, n) for n in charter.__all__) if inspect.isclass(c)]


def _methods(cls: type) -> Iterator[tuple[str, Callable[..., object]]]:
    """Every public method, property and constructor of ``cls`` that Charter
    defines (what it inherits from the standard library is not Charter's face)."""
    for name in dir(cls):
        if name.startswith("_") and name not in ("__init__", "__call__"):
            continue
        if name == "__init__" and cls.__name__ in MADE_BY_THE_ENGINE:
            continue
        static = inspect.getattr_static(cls, name)
        if isinstance(static, property):
            member = static.fget
        elif isinstance(static, staticmethod | classmethod):
            member = static.__func__
        else:
            member = static
        if callable(member) and (getattr(member, "__module__", None) or "").startswith("charter"):
            yield f"{cls.__name__}.{name}", member


def _hints(member: Callable[..., object]) -> dict[str, object]:
    """The member's annotations, resolved (names imported only for type checking
    resolve through the face)."""
    face = {name: getattr(charter, name) for name in charter.__all__}
    return typing.get_type_hints(member, localns=face)


def _types(hint: object) -> Iterator[type]:
    """The classes an annotation names, through unions, generics and callables."""
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return
    if origin is not None:
        yield from _types(origin)
        for arg in typing.get_args(hint):
            yield from _types(arg)
    elif isinstance(hint, list):  # Callable[[...], R]
        for arg in hint:
            yield from _types(arg)
    elif isinstance(hint, type):
        yield hint


def test_no_public_method_works_inside_a_store_transaction() -> None:
    """A ``Tx`` is the engine's: no method of the face takes one (nor hands one
    back), so user code cannot write past the fencing and audit the engine
    puts around every transaction. The executor *has* a segment, whose
    methods take a transaction, and is not one."""
    offences = [
        f"{qualname}: {param}"
        for cls in _public_classes()
        for qualname, member in _methods(cls)
        for param, hint in _hints(member).items()
        if Tx in set(_types(hint))
    ]
    assert offences == []
    assert not issubclass(charter.Executor, Segment)


def _importable(cls: type) -> bool:
    """``cls`` is Python's or a library's, or importable by name from the face or a kit."""
    if not cls.__module__.startswith("charter"):
        return True
    homes = [charter, *(importlib.import_module(kit) for kit in KITS)]
    return any(getattr(home, cls.__name__, None) is cls for home in homes)


def test_every_type_the_face_takes_or_returns_is_importable() -> None:
    """A caller can name, in its own annotations, whatever a public method hands it
    or asks of it: ``engine.mission(id)`` returns a ``charter.Mission``,
    ``engine.coordinator`` is a ``charter.Coordinator``, ``engine.balances`` maps
    to ``charter.Balance``. Walked from every class the face exports, through
    the types its methods, properties and constructors name (records' fields
    are their constructors' parameters), to every class reached that way."""
    seen: set[type] = set()
    todo = _public_classes()
    missing: dict[str, set[str]] = {}
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        for qualname, member in _methods(cls):
            for hint in _hints(member).values():
                for found in _types(hint):
                    if not _importable(found):
                        missing.setdefault(f"{found.__module__}.{found.__qualname__}", set()).add(
                            qualname
                        )
                    elif found.__module__.startswith("charter"):
                        todo.append(found)
    assert {name: sorted(users) for name, users in missing.items()} == {}


def test_recovery_is_the_coordinators_as_documented() -> None:
    """``coordinator.recover(run_id, segment_id)`` and ``coordinator.reconcile(attempt_id,
    adapter)``, the original design's names, on the class the face exports."""
    assert isinstance(charter.Engine.coordinator, property)
    hints = typing.get_type_hints(charter.Engine.coordinator.fget)
    assert hints["return"] is charter.Coordinator
    recover = inspect.signature(charter.Coordinator.recover).parameters
    assert list(recover)[1:3] == ["run_id", "segment_id"]
    reconcile = inspect.signature(charter.Coordinator.reconcile).parameters
    assert list(reconcile)[1:3] == ["attempt_id", "adapter"]


#: Names more than one of the engine's handles offers, each with the one meaning
#: they share.
SHARED = {"epoch": "the run's epoch the holder writes at (R2)"}


def test_a_name_means_one_thing_on_the_engines_handles() -> None:
    """``attempt`` is what a node does (``ctx.attempt``, the seed's name: perform an
    effect, return its result); the executor *performs* an effect and returns its
    record; the engine *gets* a recorded attempt. A name on two of the handles a
    user holds means the same on both."""
    handles = (charter.Engine, charter.Executor, charter.Coordinator, charter.Context)
    offered: dict[str, list[str]] = {}
    for cls in handles:
        for name in dir(cls):
            if not name.startswith("_"):
                offered.setdefault(name, []).append(cls.__name__)
    assert {n for n, where in offered.items() if len(where) > 1} == set(SHARED)
    assert offered["attempt"] == ["Context"]
    assert offered["perform"] == ["Executor"]
    assert offered["get_attempt"] == ["Engine"]
