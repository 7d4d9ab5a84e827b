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


def test_every_cli_command_has_help_and_documentation() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    sub = next(a for a in _parser()._actions if a.dest == "command")
    choices = sub.choices  # type: ignore[attr-defined]
    assert set(choices) == set(COMMANDS)
    for name, parser in choices.items():
        assert parser.description, name
        assert f"`charter {name}" in page, f"{name} is not documented in docs/cli.md"
        help_text = subprocess.run(
            [sys.executable, "-m", "charter", name, "--help"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
        assert COMMANDS[name] in help_text.replace("\n", " ") or name in help_text
