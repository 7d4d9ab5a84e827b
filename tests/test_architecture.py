"""The layout of src/charter keeps its shape: floors, no cycles, SQL in its rooms, small parts.

These are the checks docs/architecture.md promises, kept as tests so the layout
cannot rot. They read the source with :mod:`ast` (see ``_architecture.py``), so
they see every import: at module level, under ``TYPE_CHECKING`` and inside
functions, relative ones resolved. When the layout changes on purpose, change
the data below and docs/architecture.md together.

The private-reach check is best-effort, by name and not by type. It flags
``x._name`` (and ``getattr(x, "_name")``, and ``from charter.m import _name``)
where ``x`` is not ``self``, ``cls``, ``super()`` or ``type(self)`` and no
function, class, variable or ``self._name`` attribute of that name is defined
in the same module. So it misses a reach into another module's object when the
reaching module happens to define a private of the same name, and it cannot
tell ``other._x`` on an object of a class defined in the same module (allowed)
from one on a foreign object with the same attribute name. A few underscore
names that are public standard-library API (``namedtuple._replace``,
``os._exit``) are not reaches.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from _architecture import (
    cycles,
    floor_of,
    function_lengths,
    graph,
    imports,
    knots,
    may_hold_sql,
    modules,
    private_reaches,
    sql_literals,
    up_arrows,
)

# -- the layout, as data -----------------------------------------------------------------

#: Module-name prefix -> floor, bottom (0) to top, from docs/architecture.md. A key
#: names that module and every module under it; the longest key wins. A module
#: imports only from its own floor or below.
FLOORS: dict[str, int] = {
    # basics: nothing of charter above them
    "charter.errors": 0,
    "charter.clock": 0,
    "charter.ids": 0,
    "charter.secret": 0,
    "charter.hashing": 0,
    "charter.telemetry": 0,
    "charter.amounts": 0,
    "charter.crashpoints": 0,
    # the transaction layer, and what an adapter needs (the protocol and the adapters)
    "charter.storage": 1,
    "charter.adapters": 1,
    # a payments service to run against (loopback HTTP, its own SQLite file); the
    # service imports nothing of charter, its client is an HTTP adapter declaration
    "charter.sandbox": 1,
    # the ledger room: accounts (pure arithmetic), incidents, its store
    "charter.ledger": 2,
    "charter.artifacts": 2,
    # the contracts room (contract, principals, missions, authority) and the audit room
    "charter.contracts": 3,
    "charter.audit": 3,
    # the waits room (a package: model, approvals, store)
    "charter.waits": 4,
    # Configuration names what the rooms below define (resume modes, adapters)
    # and is handed down inside the runtime, so it sits just under the runtime.
    "charter.config": 5,
    "charter.runtime": 6,
    # the runs room: run records and ownership (fencing)
    "charter.runs": 7,
    # the queue of runs workers carry (K1): written by the decisions that wake runs
    "charter.queue": 7,
    # the calls the MCP gateway carries (G3): a client's call identity and its run
    "charter.calls": 7,
    # the attempts room: calls, admission, the one send path, evidence, settlement
    "charter.attempts": 8,
    # what an answer proves (A3): the attempts room's rule, on the adapters' floor
    # so that every adapter reads answers by it without loading the store
    "charter.attempts.classify": 1,
    # the plans room (nodes, their context, the runner, the journal) and the
    # recovery room (the state, the takeover)
    "charter.plans": 9,
    "charter.recovery": 9,
    # orchestration: the executor runs a segment, the coordinator recovers and
    # resumes (it hands runs to an executor), the engine is the facade over both.
    # The facade's concerns (reads, decisions, runs, graphs, overview, signins,
    # snapshots) are classes mixed into the engine: they need neither the
    # coordinator nor the engine, so they sit on the engine room's floor.
    "charter.engine": 10,
    "charter.engine.executor": 10,
    "charter.engine.coordinator": 11,
    "charter.engine.engine": 12,
    # workers: processes beside the engine on its store, and their notices (K3)
    "charter.workers": 13,
    # the face: charter/__init__.py only
    "charter": 14,
    # Clients of the face. charter.testing is one too: users' test suites import
    # it, nothing inside the engine may, and it helps only with what the face offers.
    "charter.cli": 15,
    "charter.__main__": 15,
    "charter.server": 15,
    "charter.integrations": 15,
    "charter.testing": 15,
    # the conformance kit for adapters (check_adapter and scripted targets): a
    # client of the face, as charter.testing is
    "charter.conformance": 15,
    # the MCP gateway (G1-G4): an MCP server in front of MCP servers, on the face
    "charter.gateway": 15,
}

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80

#: ``module:Qualified.name`` -> why splitting it would hurt reading. Each entry
#: must still exist and still be over the limit, so the list cannot rot.
LONG_FUNCTIONS: dict[str, str] = {}

#: Modules that must load without the store: an adapter is handed a Dispatch
#: and answers an Outcome or Evidence (never 3). charter.testing holds an
#: adapter (RecordingAdapter) that users' adapter tests import on its own.
STORELESS_IMPORTS = ("charter.adapters", "charter.attempts.classify", "charter.testing")

#: Enough to show any tangle; listing every cycle of a dense one takes exponential time.
CYCLES_LISTED = 10_000

FACE = "charter"
OUTER_ROOMS = ("charter.cli", "charter.server", "charter.integrations", "charter.gateway")
#: Modules users import by name besides the face, documented as public: the
#: errors (the face lists only the few user code meets), what an adapter is
#: built from (the protocol, the HTTP adapter) and the sandbox.
PUBLIC_MODULES = (
    "charter.errors",
    "charter.adapters",
    "charter.attempts.classify",
    "charter.sandbox",
)


def _fail_on(offences: list[str], what: str, count: int | None = None) -> None:
    """Fail listing every offence, so one run shows the whole job."""
    if offences:
        head = f"{len(offences) if count is None else count} {what}:\n  "
        pytest.fail(head + "\n  ".join(offences), pytrace=False)


def _in(module: str, room: str) -> bool:
    return module == room or module.startswith(room + ".")


# -- imports -----------------------------------------------------------------------------


def test_every_module_sits_on_a_floor() -> None:
    """Every module of src/charter is placed by FLOORS, so no arrow goes unchecked."""
    mods = modules()
    unplaced = [
        f"{name} ({module.where})"
        for name, module in mods.items()
        if floor_of(name, FLOORS) is None
    ]
    _fail_on(unplaced, "modules on no floor (move them into a room or add them to FLOORS)")


def test_no_import_cycles() -> None:
    """No module imports itself through others, not even under TYPE_CHECKING or in a function."""
    mods = modules()
    edges = graph(imports(mods))
    offences = []
    for knot in knots(edges):
        offences.append(f"knot of {len(knot)} modules: {', '.join(knot)}; its arrows:")
        offences.extend(
            "  " + arrow.describe(mods)
            for source in knot
            for target in sorted(edges[source])
            if target in knot
            for arrow in edges[source][target]
        )
    found = cycles(edges, limit=CYCLES_LISTED)
    more = " (the listing stops there)" if len(found) == CYCLES_LISTED else ""
    offences.append(f"the {len(found)} cycles through them{more}:")
    offences.extend("  " + " -> ".join(cycle) for cycle in found)
    _fail_on(offences if found else [], f"import cycles in {len(knots(edges))} knots", len(found))


def test_no_import_runs_up_a_floor() -> None:
    """A module imports only from its own floor or below (never 5)."""
    mods = modules()
    offences = [
        f"{arrow.describe(mods)}: floor {source} imports floor {target}"
        for arrow, source, target in up_arrows(imports(mods), FLOORS)
    ]
    _fail_on(offences, "imports up a floor")


def test_adapters_and_records_import_no_store_or_engine() -> None:
    """Adapters, integrations and records never import storage, a store.py or the engine.

    Never 3 and never 7: an adapter is handed a Dispatch and answers an Outcome
    or Evidence; records (``*/model.py``, ``adapters/protocol.py``) are plain data.
    """
    mods = modules()
    forbidden = ("charter.storage", "charter.engine")
    offences = [
        arrow.describe(mods)
        for arrow in imports(mods)
        if (
            any(_in(arrow.source, room) for room in ("charter.adapters", "charter.integrations"))
            or arrow.source.endswith(".model")
        )
        and (any(_in(arrow.target, room) for room in forbidden) or arrow.target.endswith(".store"))
    ]
    _fail_on(offences, "imports of storage, a store.py or the engine from adapters or records")


def test_outer_rooms_use_only_the_face() -> None:
    """cli/, server/ and integrations/ import the face, the public modules and each
    other, nothing inside (never 4)."""
    mods = modules()
    offences = [
        arrow.describe(mods)
        for arrow in imports(mods)
        if any(_in(arrow.source, room) for room in OUTER_ROOMS)
        and arrow.target != FACE
        and not any(_in(arrow.target, public) for public in PUBLIC_MODULES)
        and (floor_of(arrow.target, FLOORS) or 0) <= FLOORS[FACE]
    ]
    _fail_on(offences, "imports from cli, server or integrations past the public face")


@pytest.mark.parametrize("name", STORELESS_IMPORTS)
def test_importing_loads_no_store(name: str) -> None:
    """``import charter.adapters`` loads neither storage nor a store.py (never 3).

    Checked in a fresh interpreter, so whatever the package's ``__init__``
    loads counts too: the face must not pull the engine in eagerly.
    """
    code = (
        f"import sys, {name}\n"
        "for m in sorted(sys.modules):\n"
        "    if m == 'charter.storage' or m.startswith('charter.storage.')"
        " or (m.startswith('charter.') and m.endswith('.store')):\n"
        "        print(m)\n"
    )
    loaded = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout.split()
    _fail_on(loaded, f"store modules loaded by `import {name}`")


#: What ``import charter``, ``charter --help`` and a synchronous program leave
#: unloaded: an event loop (asyncio with the ssl and logging it loads, half of
#: the import's time) is loaded when something is awaited, not before.
STARTUP = {
    "import charter": "import charter",
    "charter --help": (
        "import contextlib, io\n"
        "from charter.cli.app import main\n"
        "with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):\n"
        "    main(['--help'])"
    ),
    "a plan of synchronous nodes": (
        "import sys, charter\n"
        "from charter.testing import RecordingAdapter, credential\n"
        "cred, digest = credential('agent')\n"
        "config = charter.EngineConfig(credentials={'agent': digest})\n"
        "with charter.Engine.open(sys.argv[1] + '/s.db', config=config) as engine:\n"
        "    agent = engine.authenticate(cred)\n"
        "    mission = engine.create_mission({'objective': 'o', 'principals': "
        "{'agent': {'run': ['recorder.*']}}, 'allowance': {'calls': 9}}, by=agent)\n"
        "    adapter = RecordingAdapter()\n"
        "    @charter.node\n"
        "    def read(ctx, week):\n"
        "        return ctx.attempt(adapter, 'read', {'week': week})['ok']\n"
        "    plan = charter.Plan('p', (read,))\n"
        "    run = engine.start_run(mission, by=agent, segment_id='s', plan=plan, input='w')\n"
        "    assert run.execute(plan) is True"
    ),
}


@pytest.mark.parametrize("what", list(STARTUP))
def test_starting_loads_no_event_loop(what: str, tmp_path: Path) -> None:
    """The bench's startup targets (import, ``--help``) and a synchronous
    program's start hold by what is loaded: no event loop."""
    code = STARTUP[what] + "\nimport sys\nprint(*sorted({'asyncio', 'ssl'} & set(sys.modules)))"
    loaded = subprocess.run(
        [sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True
    ).stdout.split()
    _fail_on(loaded, f"modules loaded by `{what}`")


# -- SQL ---------------------------------------------------------------------------------


def test_no_sql_outside_storage_and_store_modules() -> None:
    """SQL lives in storage/ and each room's store.py (never 2)."""
    offences = [
        f"{module.where}:{line}: {text}"
        for module in modules().values()
        if not may_hold_sql(module)
        for line, text in sql_literals(module)
    ]
    _fail_on(offences, "SQL literals outside storage/ and store.py")


#: Table -> the one module that writes it (never 2: each table has one owner).
#: Any store may read it, joined with its own; a table not listed is not checked
#: yet. storage/ is not a writer here: its migrations backfill columns and its
#: transactions keep the audit chain's head on the mission row.
TABLE_OWNERS: dict[str, str] = {
    "approvals": "charter.waits.store",
    "waits": "charter.waits.store",
    "artifacts": "charter.artifacts.store",
    "plan_versions": "charter.plans.store",
    "attempts": "charter.attempts.store",
    "contract_versions": "charter.contracts.store",
    "evidence": "charter.attempts.store",
    "incidents": "charter.ledger.store",
    "ledger_entries": "charter.ledger.store",
    "missions": "charter.contracts.store",
    "runs": "charter.runs.store",
    "segments": "charter.runs.store",
    "run_queue": "charter.queue.store",
    "effect_takeovers": "charter.recovery.store",
    "node_executions": "charter.plans.store",
    "journal": "charter.plans.store",
    "notices": "charter.workers.store",
    "notice_deliveries": "charter.workers.store",
    "audit_events": "charter.audit.store",
    "audit_checkpoints": "charter.audit.store",
    "store_identity": "charter.audit.store",
}

_WRITE = re.compile(r"^(?:INSERT INTO|UPDATE|DELETE FROM) (\w+)")


def test_each_table_is_written_by_its_owner_only() -> None:
    """Only a table's owner module inserts, updates or deletes its rows (never 2)."""
    offences = [
        f"{module.where}:{line}: {text} (the owner of {table} is {TABLE_OWNERS[table]})"
        for module in modules().values()
        if not _in(module.name, "charter.storage")
        for line, text in sql_literals(module)
        for table in _WRITE.findall(text)
        if table in TABLE_OWNERS and module.name != TABLE_OWNERS[table]
    ]
    _fail_on(offences, "writes to a table outside its owner module")


# -- sizes -------------------------------------------------------------------------------


def test_no_module_over_600_lines() -> None:
    """Split a module before about 600 lines (never 8)."""
    offences = [
        f"{module.where}: {module.lines} lines"
        for module in modules().values()
        if module.lines > MAX_MODULE_LINES
    ]
    _fail_on(offences, f"modules over {MAX_MODULE_LINES} lines")


def test_no_function_over_80_lines() -> None:
    """Split a function before about 80 lines, unless LONG_FUNCTIONS says why not (never 8)."""
    offences = [
        f"{where}: {name}, {lines} lines"
        for name, (lines, where) in sorted(function_lengths(modules()).items())
        if lines > MAX_FUNCTION_LINES and name not in LONG_FUNCTIONS
    ]
    _fail_on(offences, f"functions over {MAX_FUNCTION_LINES} lines")


def test_long_function_allow_list_is_current() -> None:
    """Each LONG_FUNCTIONS entry names a function that exists and is still over the limit."""
    lengths = function_lengths(modules())
    offences = [
        f"{name}: "
        + ("no such function" if name not in lengths else f"only {lengths[name][0]} lines now")
        for name in sorted(LONG_FUNCTIONS)
        if name not in lengths or lengths[name][0] <= MAX_FUNCTION_LINES
    ]
    _fail_on(offences, "stale LONG_FUNCTIONS entries (remove them)")


# -- private members ---------------------------------------------------------------------


def test_no_reach_into_private_members_of_other_modules() -> None:
    """Nothing touches another object's ``_private`` members (never 5); see the module docstring."""
    mods = modules()
    offences = [
        f"{module.where}:{line}: {text}"
        for module in mods.values()
        for line, text in private_reaches(module, mods)
    ]
    _fail_on(offences, "reaches into private members defined in another module")


THING = """
\"\"\"SELECT in a docstring is prose.\"\"\"

from .. import low
from charter.room.store import _rows


class Thing:
    _count = 0

    def bump(self, other):
        self._count += 1
        return other._count + super()._total + type(self)._count, low._private
"""

LOW = """
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from charter.room import thing


def helper(obj):
    from . import room

    obj._hidden = 1
    return getattr(obj, "_secret"), f"UPDATE {obj} SET x = 1"
"""

SAMPLE = {
    "__init__.py": "from charter.low import helper\n",
    "low.py": LOW,
    "room/__init__.py": "from .thing import Thing, _helper\n",
    "room/thing.py": THING,
    "room/store.py": "QUERY = (\n    'SELECT a '\n    'FROM t'\n)\n",
}


def test_the_checks_see_every_import_sql_string_and_private_reach(tmp_path: Path) -> None:
    """The walk itself: imports of every kind, packages as their __init__, SQL, reaches."""
    package = tmp_path / "src" / "charter"
    for name, text in SAMPLE.items():
        (package / name).parent.mkdir(parents=True, exist_ok=True)
        (package / name).write_text(text)
    mods = modules(package)
    arrows = {(a.source, a.target, a.kind) for a in imports(mods)}
    assert arrows == {
        ("charter", "charter.low", "module level"),
        ("charter.low", "charter.room.thing", "TYPE_CHECKING"),
        ("charter.low", "charter.room", "in function"),
        ("charter.room", "charter.room.thing", "module level"),
        ("charter.room.thing", "charter.low", "module level"),
        ("charter.room.thing", "charter.room.store", "module level"),
    }
    edges = graph(imports(mods))
    assert knots(edges) == [["charter.low", "charter.room", "charter.room.thing"]]
    assert cycles(edges, limit=10) == [
        ["charter.low", "charter.room.thing", "charter.low"],
        ["charter.low", "charter.room", "charter.room.thing", "charter.low"],
    ]
    floors = {"charter.low": 0, "charter.room": 1, "charter": 2}
    assert floor_of("charter.room.store", floors) == 1
    assert floor_of("charter.other", floors) is None
    assert {(a.source, a.target) for a, _, _ in up_arrows(imports(mods), floors)} == {
        ("charter.low", "charter.room"),
        ("charter.low", "charter.room.thing"),
    }
    assert sql_literals(mods["charter.low"]) == [(12, "UPDATE _ SET x = 1")]
    assert sql_literals(mods["charter.room.thing"]) == []
    assert sql_literals(mods["charter.room.store"]) == [(2, "SELECT a FROM t")]
    assert may_hold_sql(mods["charter.room.store"])
    assert not may_hold_sql(mods["charter.low"])
    assert private_reaches(mods["charter.low"], mods) == [
        (11, "obj._hidden"),
        (12, "getattr(obj, '_secret')"),
    ]
    assert private_reaches(mods["charter.room"], mods) == [
        (1, "from charter.room.thing import _helper")
    ]
    assert private_reaches(mods["charter.room.thing"], mods) == [
        (5, "from charter.room.store import _rows"),
        (13, "low._private"),
    ]
    assert function_lengths(mods)["charter.room.thing:Thing.bump"] == (
        3,
        "src/charter/room/thing.py:11",
    )
