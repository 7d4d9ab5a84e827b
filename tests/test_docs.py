"""The examples in README.md and docs/ run, and every CLI command is documented."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from charter.cli.app import COMMANDS, _parser

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def _python_blocks(page: Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", page.read_text(), flags=re.DOTALL)


@pytest.mark.parametrize("page", [p for p in PAGES if _python_blocks(p)], ids=lambda p: p.name)
def test_documented_examples_run(page: Path, tmp_path: Path) -> None:
    for block in _python_blocks(page):
        exec(compile(block, str(page), "exec"), {"tmp": tmp_path, "__name__": "docs"})


def test_every_cli_command_has_help_and_documentation(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each command's ``--help``, as ``python -m charter`` prints it (its ``main``,
    run in this process; the module itself is run once, for the command list)."""
    from charter.cli.app import main

    page = (ROOT / "docs" / "cli.md").read_text()
    sub = next(a for a in _parser()._actions if a.dest == "command")
    choices = sub.choices  # type: ignore[attr-defined]
    assert set(choices) == set(COMMANDS)
    listed = subprocess.run(
        [sys.executable, "-m", "charter", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for name, parser in choices.items():
        assert parser.description, name
        assert f"`charter {name}" in page, f"{name} is not documented in docs/cli.md"
        assert name in listed, f"{name} is not in charter --help"
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        help_text = capsys.readouterr().out
        assert done.value.code == 0, name
        assert COMMANDS[name] in help_text.replace("\n", " ") or name in help_text


_FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})(.*)$")


def unclosed_fences(text: str) -> list[str]:
    """Where a page's code fences go wrong: a fence still open at the end, or a
    fence-like line inside an open one that cannot close it (text after the
    backticks, as in a paragraph glued to its closing fence). Either way
    everything after it renders as code, and examples run from the wrong text."""
    problems: list[str] = []
    opened: tuple[int, str] | None = None
    for number, line in enumerate(text.splitlines(), 1):
        found = _FENCE.match(line)
        if found is None:
            continue
        marks, rest = found.groups()
        if opened is None:
            opened = (number, marks)
        elif marks[0] != opened[1][0] or len(marks) < len(opened[1]):
            continue  # a shorter or other fence is the code's own text
        elif rest.strip():
            problems.append(f"line {number}: {line.strip()!r} inside the fence of line {opened[0]}")
        else:
            opened = None
    if opened is not None:
        problems.append(f"the fence of line {opened[0]} is never closed")
    return problems


def test_fences_check_finds_a_fence_that_never_closes() -> None:
    assert unclosed_fences("```python\nx = 1\n```\n\ntext\n") == []
    assert unclosed_fences("```python\nx = 1\n``` And then text.\n") == [
        "line 3: '``` And then text.' inside the fence of line 1",
        "the fence of line 1 is never closed",
    ]
    assert unclosed_fences("````md\n```sh\nls\n```\n````\n") == []


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_code_fence_closes(page: Path) -> None:
    """Broken: a page's code fence never closes, so the rest of the page is code."""
    assert unclosed_fences(page.read_text()) == []
