"""What the layout checks in test_architecture.py read from the source.

Everything here parses ``src/charter`` with :mod:`ast` and never imports it, so
a broken or half-moved module still gets checked. The layout itself (floors,
limits, the allow-list) is data at the top of ``test_architecture.py``; this
module only measures.

Run ``python tests/_architecture.py`` for the figures a restructure reports:
module sizes, the longest functions, SQL-owning modules, import cycles, arrows
up a floor and private reaches.
"""

from __future__ import annotations

import ast
import functools
import re
import statistics
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "src" / "charter"


@dataclass(frozen=True)
class Module:
    """One source file of the package, parsed."""

    name: str  # dotted, a package by its own name: ``charter.storage`` is its __init__
    where: str  # the file, from the repository root
    tree: ast.Module
    lines: int
    is_package: bool


@functools.cache
def modules(package: Path = PACKAGE) -> dict[str, Module]:
    """Every module under ``package`` (``<root>/src/<name>``), by dotted name."""
    root = package.parent.parent
    found: dict[str, Module] = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        is_package = parts[-1] == "__init__"
        if is_package:
            parts.pop()
        text = path.read_text()
        tree = _parsed(text, str(path))
        name = ".".join(parts)
        where = str(path.relative_to(root))
        found[name] = Module(name, where, tree, len(text.splitlines()), is_package)
    return found


def _parsed(text: str, path: str) -> ast.Module:
    """``ast.parse``, once more if CPython 3.11's AST builder miscounts its own
    recursion depth (python/cpython#106905: a ``SystemError`` about a depth
    mismatch, seen in a test process whose other threads were busy); the
    source is the same, so the second parse is the answer."""
    try:
        return ast.parse(text, path)
    except SystemError:
        return ast.parse(text, path)


# -- imports ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Import:
    """One arrow: ``source`` imports ``target`` at ``source``'s line ``line``."""

    source: str
    target: str
    line: int
    kind: str  # "module level", "TYPE_CHECKING" or "in function"

    def describe(self, mods: Mapping[str, Module]) -> str:
        return (
            f"{self.source} -> {self.target} ({mods[self.source].where}:{self.line}, {self.kind})"
        )


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _owning(name: str, mods: Mapping[str, Module]) -> str | None:
    """The module a dotted name lives in: the longest known prefix, if any."""
    while name:
        if name in mods:
            return name
        name = name.rpartition(".")[0]
    return None


def _from(module: Module, node: ast.ImportFrom) -> str:
    """The dotted name ``from ... import`` reads from, relative levels resolved."""
    if not node.level:
        return node.module or ""
    package = module.name.split(".")
    if not module.is_package:
        package.pop()
    package = package[: len(package) - (node.level - 1)]
    return ".".join([*package, *([node.module] if node.module else [])])


class _ImportVisitor(ast.NodeVisitor):
    """Collects every import of one module, with where it sits."""

    def __init__(self, module: Module, mods: Mapping[str, Module]) -> None:
        self.module = module
        self.mods = mods
        self.kinds = ["module level"]
        self.found: list[Import] = []

    def _add(self, dotted: str, line: int) -> None:
        target = _owning(dotted, self.mods)
        if target is not None and target != self.module.name:
            self.found.append(Import(self.module.name, target, line, self.kinds[-1]))

    def _nested(self, node: ast.AST, kind: str) -> None:
        self.kinds.append(kind)
        self.generic_visit(node)
        self.kinds.pop()

    def visit_FunctionDef(self, node: ast.FunctionDef) -> None:
        self._nested(node, "in function")

    def visit_AsyncFunctionDef(self, node: ast.AsyncFunctionDef) -> None:
        self._nested(node, "in function")

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test) or self.kinds[-1] == "in function":
            self.generic_visit(node)
            return
        self.kinds.append("TYPE_CHECKING")
        for stmt in node.body:
            self.visit(stmt)
        self.kinds.pop()
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(alias.name, node.lineno)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _from(self.module, node)
        targets = {f"{base}.{alias.name}" for alias in node.names}
        for target in sorted({name if name in self.mods else base for name in targets}):
            self._add(target, node.lineno)

    def visit_Call(self, node: ast.Call) -> None:
        """``importlib.import_module("charter.x")`` and ``__import__`` with a literal name."""
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        first = node.args[0] if node.args else None
        literal = first.value if isinstance(first, ast.Constant) else None
        if name in {"import_module", "__import__"} and isinstance(literal, str):
            self._add(literal, node.lineno)
        self.generic_visit(node)


def imports(mods: Mapping[str, Module]) -> list[Import]:
    """Every import between modules of the package, wherever it is written."""
    found: list[Import] = []
    for module in mods.values():
        visitor = _ImportVisitor(module, mods)
        visitor.visit(module.tree)
        found.extend(visitor.found)
    return found


def graph(arrows: list[Import]) -> dict[str, dict[str, list[Import]]]:
    """source -> target -> the import statements that make the arrow."""
    edges: dict[str, dict[str, list[Import]]] = {}
    for arrow in arrows:
        edges.setdefault(arrow.source, {}).setdefault(arrow.target, []).append(arrow)
    return edges


def knots(edges: Mapping[str, Mapping[str, object]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(edges.get(node, {})):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return sorted(found)


def cycles(edges: Mapping[str, Mapping[str, object]], limit: int) -> list[list[str]]:
    """Elementary cycles, each once, starting from its smallest module; at most ``limit``."""
    found: list[list[str]] = []

    def walk(path: list[str], members: set[str]) -> None:
        for succ in sorted(edges.get(path[-1], {})):
            if len(found) >= limit:
                return
            if succ == path[0]:
                found.append([*path, succ])
            elif succ in members and succ > path[0] and succ not in path:
                walk([*path, succ], members)

    for knot in knots(edges):
        for start in knot:
            walk([start], set(knot))
    return sorted(found, key=lambda cycle: (len(cycle), cycle))


def floor_of(module: str, floors: Mapping[str, int]) -> int | None:
    """The floor of the longest key naming ``module`` or a package above it.

    The face, ``charter``, names only ``charter/__init__.py``: as a prefix it
    would place every module and hide the unplaced ones.
    """
    best: tuple[int, int] | None = None
    for key, floor in floors.items():
        matches = module == key or (key != "charter" and module.startswith(key + "."))
        if matches and (best is None or len(key) > best[0]):
            best = (len(key), floor)
    return None if best is None else best[1]


def up_arrows(arrows: list[Import], floors: Mapping[str, int]) -> list[tuple[Import, int, int]]:
    """Imports whose target sits on a higher floor than their source."""
    found = []
    for arrow in arrows:
        source, target = floor_of(arrow.source, floors), floor_of(arrow.target, floors)
        if source is not None and target is not None and target > source:
            found.append((arrow, source, target))
    return found


# -- SQL -------------------------------------------------------------------------------

SQL = re.compile(
    r"\b(SELECT|INSERT\s+INTO|UPDATE\s+\w+\s+SET|DELETE\s+FROM|CREATE\s+(UNIQUE\s+)?INDEX"
    r"|CREATE\s+TABLE|ALTER\s+TABLE|DROP\s+(TABLE|INDEX)|PRAGMA|SAVEPOINT)\b"
)


def _strings(tree: ast.Module) -> Iterator[tuple[int, str]]:
    """String literals that are values, with their line.

    Implicitly concatenated literals arrive as one constant; an f-string is read
    as its literal parts joined by ``_`` where a value goes, so ``f"UPDATE
    {table} SET"`` still reads as SQL. Strings standing alone as a statement
    (docstrings) are prose, not queries, and are skipped.
    """
    skip: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant):
            skip.add(id(node.value))
        elif isinstance(node, ast.JoinedStr):
            skip.update(id(part) for part in ast.walk(node) if part is not node)
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value
        elif isinstance(node, ast.JoinedStr):
            text = "".join(
                str(part.value) if isinstance(part, ast.Constant) else "_" for part in node.values
            )
            yield node.lineno, text


def may_hold_sql(module: Module) -> bool:
    """``storage/`` and each room's ``store.py`` own the SQL."""
    name = module.name
    return (
        name == "charter.storage" or name.startswith("charter.storage.") or name.endswith(".store")
    )


def sql_literals(module: Module) -> list[tuple[int, str]]:
    """Line and first words of every literal in ``module`` that holds SQL, in line order."""
    found = []
    for line, text in _strings(module.tree):
        match = SQL.search(text)
        if match:
            found.append((line, " ".join(text[match.start() :].split())[:60]))
    return sorted(found)


# -- sizes -----------------------------------------------------------------------------


def functions(module: Module) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method, nested ones too, as ``module:Qualified.name``."""

    def walk(
        node: ast.AST, prefix: str
    ) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                yield f"{module.name}:{prefix}{child.name}", child
                yield from walk(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                yield from walk(child, f"{prefix}{child.name}.")
            else:
                yield from walk(child, prefix)

    yield from walk(module.tree, "")


def length(node: ast.stmt) -> int:
    """Lines from the ``def`` line to the last line of the body."""
    return (node.end_lineno or node.lineno) - node.lineno + 1


def function_lengths(mods: Mapping[str, Module]) -> dict[str, tuple[int, str]]:
    """``module:function`` -> (lines, file:line)."""
    return {
        name: (length(node), f"{module.where}:{node.lineno}")
        for module in mods.values()
        for name, node in functions(module)
    }


# -- private reaches -------------------------------------------------------------------

#: Underscore names that are public API of the standard library.
STDLIB_PUBLIC = frozenset({"_asdict", "_replace", "_fields", "_make", "_field_defaults", "_exit"})


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _own(node: ast.expr) -> bool:
    """``self``, ``cls``, ``super()`` and ``type(self)``: the object's own members."""
    if isinstance(node, ast.Name):
        return node.id in {"self", "cls"}
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and (
            node.func.id == "super"
            or (node.func.id == "type" and len(node.args) == 1 and _own(node.args[0]))
        )
    )


def _defined(tree: ast.Module) -> set[str]:
    """Private names this module defines: functions, classes, names, own attributes."""
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store):
            if _own(node.value):
                names.add(node.attr)
        elif isinstance(node, ast.alias):
            names.add(node.asname or node.name.rpartition(".")[2])
    return {name for name in names if _private(name)}


def private_reaches(module: Module, mods: Mapping[str, Module]) -> list[tuple[int, str]]:
    """Line and text of each reach into a private member defined elsewhere."""
    defined = _defined(module.tree)
    found: list[tuple[int, str]] = []
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Attribute) and _private(node.attr):
            if not _own(node.value) and node.attr not in defined | STDLIB_PUBLIC:
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            args = node.args
            if node.func.id in {"getattr", "setattr", "hasattr", "delattr"} and len(args) >= 2:
                name = args[1].value if isinstance(args[1], ast.Constant) else None
                reach = isinstance(name, str) and _private(name) and name not in defined
                if reach and not _own(args[0]):
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom) and _owning(_from(module, node), mods):
            found.extend(
                (node.lineno, f"from {_from(module, node)} import {alias.name}")
                for alias in node.names
                if _private(alias.name)
            )
    return sorted(found)


# -- figures ---------------------------------------------------------------------------


def figures(floors: Mapping[str, int], max_module: int, max_function: int) -> str:
    """The numbers a restructure reports, before and after."""
    mods = modules()
    sizes = sorted(module.lines for module in mods.values())
    lengths = function_lengths(mods)
    longest = sorted(lengths.items(), key=lambda item: -item[1][0])[:5]
    arrows = imports(mods)
    edges = graph(arrows)
    sql = {name: len(sql_literals(m)) for name, m in mods.items() if sql_literals(m)}
    reaches = {name: len(private_reaches(m, mods)) for name, m in mods.items()}
    unplaced = [name for name in mods if floor_of(name, floors) is None]
    rows = [
        f"modules: {len(mods)}, lines median {statistics.median(sizes):g}, max {sizes[-1]}",
        f"modules over {max_module} lines: {sum(size > max_module for size in sizes)}",
        "longest functions:",
        *(f"  {lines} lines: {name} ({where})" for name, (lines, where) in longest),
        f"functions over {max_function} lines: "
        f"{sum(lines > max_function for lines, _ in lengths.values())}",
        f"SQL-owning modules: {len(sql)}, SQL literals {sum(sql.values())}:",
        *(f"  {count} in {name}" for name, count in sorted(sql.items())),
        f"SQL-owning modules outside storage/ and store.py: "
        f"{sum(not may_hold_sql(mods[name]) for name in sql)}",
        f"import arrows: {sum(len(targets) for targets in edges.values())}"
        f" (import statements {len(arrows)})",
        f"cycles: {len(cycles(edges, 10_000))} in {len(knots(edges))} knot(s): "
        + "; ".join(", ".join(knot) for knot in knots(edges)),
        f"arrows up a floor: {len({(a.source, a.target) for a, _, _ in up_arrows(arrows, floors)})}"
        f" (import statements {len(up_arrows(arrows, floors))}), among placed modules",
        f"modules on no floor: {len(unplaced)}: {', '.join(unplaced)}",
        f"private reaches: {sum(reaches.values())} in "
        f"{sum(count > 0 for count in reaches.values())} modules",
    ]
    return "\n".join(rows)


if __name__ == "__main__":
    from test_architecture import FLOORS, MAX_FUNCTION_LINES, MAX_MODULE_LINES

    print(figures(FLOORS, MAX_MODULE_LINES, MAX_FUNCTION_LINES))
