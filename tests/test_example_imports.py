"""Every example runs on what its documented extras install.

Each example in ``examples/`` names the extras it needs in its docstring
(``pip install 'charter[pydantic-ai,openai,http]'``). Every package the example
imports, and every package the Charter modules it loads import (at once, or
later when an adapter is built), must be the standard library, Charter, a
helper beside the example, or a distribution those extras install: one they
name in ``pyproject.toml`` or one those declare as their own requirements. A
package that is merely installed here (by the test extra) does not count.
"""

from __future__ import annotations

import ast
import importlib.metadata
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "examples"
SOURCE = ROOT / "src"
#: Examples whose framework the main environment cannot hold: checked in their
#: own (tests/test_crewai_kills.py, in .venv-crewai).
ELSEWHERE = {"crewai_agent"}
EXAMPLE_FILES = sorted(
    p for p in EXAMPLES.glob("*.py") if not p.name.startswith("_") and p.stem not in ELSEWHERE
)


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def extras() -> dict[str, list[str]]:
    """Each extra of ``pyproject.toml`` and the requirements it names."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    return dict(project["optional-dependencies"])


def installs(requirements: Iterable[str]) -> set[str]:
    """The distributions ``requirements`` install: each, and what each declares
    it requires (for the extras asked of it), as far down as it goes."""
    found: set[tuple[str, frozenset[str]]] = set()
    todo = [Requirement(r) for r in requirements]
    while todo:
        req = todo.pop()
        key = (_normal(req.name), frozenset(req.extras))
        if key in found:
            continue
        found.add(key)
        try:
            declared = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in declared:
            nested = Requirement(text)
            asked = ["", *sorted(req.extras)]
            if nested.marker is None or any(nested.marker.evaluate({"extra": e}) for e in asked):
                todo.append(nested)
    return {name for name, _ in found}


def documented(example: Path) -> set[str]:
    """The extras an example's docstring says to install."""
    text = ast.get_docstring(ast.parse(example.read_text())) or ""
    said = re.findall(r"pip install '?charter\[([a-z0-9,-]+)\]", text)
    return {e.strip() for group in said for e in group.split(",")}


def _imports(tree: ast.AST, package: str, *, nested: bool) -> Iterator[tuple[str, bool]]:
    """(module, imported as the module loads) for each import in ``tree``;
    ``nested``: also those inside functions (made when the code runs). Imports
    under ``if TYPE_CHECKING`` are for the type checker only."""
    todo: list[tuple[ast.AST, bool]] = [(tree, True)]
    while todo:
        node, at_load = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                todo.append((ast.Module(body=child.orelse, type_ignores=[]), at_load))
                continue
            if isinstance(child, ast.Import):
                yield from ((a.name, at_load) for a in child.names)
            elif isinstance(child, ast.ImportFrom):
                if child.level:  # relative: resolved in the importing package
                    base = package.rsplit(".", child.level - 1)[0]
                    yield (f"{base}.{child.module}" if child.module else base), at_load
                elif child.module is not None:
                    yield child.module, at_load
                    yield from ((f"{child.module}.{a.name}", at_load) for a in child.names)
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                if nested:
                    todo.append((child, False))
            else:
                todo.append((child, at_load))


def _charter_source(module: str) -> Path | None:
    path = SOURCE.joinpath(*module.split("."))
    if (path / "__init__.py").exists():
        return path / "__init__.py"
    return path.with_suffix(".py") if path.with_suffix(".py").exists() else None


def outside_imports(example: Path, here: Path = EXAMPLES) -> set[str]:
    """The top-level names of the packages outside Charter and the standard
    library that running ``example`` imports: itself, the helpers beside it,
    and the Charter modules it loads (what they import as they load or later)."""
    local = {p.stem for p in here.glob("*.py")}
    seen: set[str] = set()
    outside: set[str] = set()
    todo = [(example, "")]
    while todo:
        path, package = todo.pop()
        in_charter = path.is_relative_to(SOURCE)
        for name, at_load in _imports(ast.parse(path.read_text()), package, nested=True):
            top = name.split(".")[0]
            if top in sys.stdlib_module_names or top == "__future__":
                continue
            if top in local:
                if top not in seen:
                    seen.add(top)
                    todo.append((here / f"{top}.py", ""))
            elif top != "charter":
                outside.add(top)
            elif at_load or not in_charter:  # a Charter module loads its packages first
                parts = name.split(".")
                for n in range(1, len(parts) + 1):
                    module = ".".join(parts[:n])
                    source = _charter_source(module)
                    if module not in seen and source is not None:
                        seen.add(module)
                        pkg = module if source.name == "__init__.py" else module.rpartition(".")[0]
                        todo.append((source, pkg))
    return outside


def test_every_example_documents_the_extras_it_needs() -> None:
    known = extras()
    for example in EXAMPLE_FILES:
        asked = documented(example)
        assert asked, f"{example.name} does not say which extras to install"
        assert asked <= set(known), f"{example.name} names unknown extras {asked - set(known)}"


@pytest.mark.parametrize("example", EXAMPLE_FILES, ids=lambda p: p.stem)
def test_an_examples_imports_come_from_its_documented_extras(example: Path) -> None:
    known = extras()
    allowed = installs(r for e in documented(example) for r in known.get(e, []))
    providers = importlib.metadata.packages_distributions()
    missing = {}
    for top in sorted(outside_imports(example)):
        dists = {_normal(d) for d in providers.get(top, [])}
        assert dists, f"{example.name} imports {top}, which no installed distribution provides"
        if not dists & allowed:
            missing[top] = sorted(dists)
    assert missing == {}, (
        f"{example.name} imports packages its extras {sorted(documented(example))} "
        f"do not install: {missing}"
    )


def test_the_check_follows_charter_into_what_it_imports_when_used(tmp_path: Path) -> None:
    """The sandbox's client is an HTTP adapter, which loads httpx, and httpcore
    for its transport, when it is built: an example that imports only the
    client still needs both. What the ``http`` extra installs covers them; the
    ``mcp`` extra's does not."""
    example = tmp_path / "probe.py"
    example.write_text('"""probe"""\nfrom charter.sandbox import client\n')
    assert outside_imports(example, tmp_path) == {"httpx", "httpcore"}
    assert {"httpx", "httpcore"} <= installs(extras()["http"])
    assert "httpx" not in installs(extras()["mcp"])
