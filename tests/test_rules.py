"""Every rule id the code cites is defined in docs/rules.md, and every rule kept is proved.

The code cites rules by id (``A4``, ``(F3)``, ``R1-R9``) in comments, docstrings
and error messages, and tests are named after the rules they prove
(``test_A2_A4_F2_...``). An id that means nothing to a reader, a rule that no
test proves, or a page that lists tests which no longer exist are each a
promise quietly broken, so this file checks all three:

- every id cited in ``src/charter`` has a heading in docs/rules.md;
- every rule outside the page's "Not kept yet" section has at least one test
  whose name cites it, and no test cites a rule that is not kept or not defined;
- each rule's "Proved by" block is exactly what the test names say.

The blocks are written by this file: ``python tests/test_rules.py --write``
rewrites them in place (nothing else on the page), and the test fails while the
page and the tests disagree. ``--list`` prints every citation found in the
source, to check by eye what the scanner takes for a rule id.

A citation is looked for in comments and string literals only (code names are
not citations). It is a letter and one or two digits standing alone: a family
the page defines (``L7``), or, inside parentheses that hold nothing but ids
(``(Y3)``, ``(A4, Y3)``), any letter, so a citation of a family the page does
not have is caught too. A range (``A1-A7``, with a hyphen or a dash) cites every
id in it.
Percentiles (``P50``, ``P99``) are not rules.
"""

from __future__ import annotations

import ast
import io
import re
import sys
import tokenize
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAGE = ROOT / "docs" / "rules.md"
SOURCE = ROOT / "src" / "charter"
TESTS = ROOT / "tests"
#: Vendored files in the source tree that cite nothing of ours.
NOT_OURS = ("server/static/",)

RULE_HEADING = re.compile(r'^### <a id="(?P<id>[A-Z]\d{1,2})"></a>(?P=id)\b')
NOT_KEPT_HEADING = "## Not kept yet"
PROVED_START = ("<details><summary>Proved by", "**Proved by:**")
PROVED_END = "</details>"
NO_TEST_LINE = "**Proved by:** no test yet (tests/test_rules.py fails until one is named after it)."

_ID = r"[A-Z]\d{1,2}"
_DASH = r"(?:-|\u2013|\u2014)"  # a hyphen, an en dash or an em dash
_CITE = re.compile(
    r"(?<![\w.])(?P<letter>[A-Z])(?P<first>\d{1,2})"
    rf"(?:\s*(?:{_DASH}|\.\.)\s*(?:(?P=letter))?(?P<last>\d{{1,2}}))?(?![\w])"
)
_PARENS = re.compile(r"\(([^()]*)\)")
_ID_OR_RANGE = rf"{_ID}(?:\s*{_DASH}\s*[A-Z]?\d{{1,2}})?"
_ONLY_IDS = re.compile(rf"\s*{_ID_OR_RANGE}(?:\s*[,/;]\s*{_ID_OR_RANGE})*\s*")
_PERCENTILE = re.compile(r"^P(?:50|75|90|95|99)$")


# -- the page ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Rule:
    id: str
    line: int  # 1-based line of its heading
    kept: bool


def page_rules(text: str) -> dict[str, Rule]:
    """The rules docs/rules.md defines, by id; a rule under "Not kept yet" is not kept."""
    rules: dict[str, Rule] = {}
    kept = True
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("## "):
            kept = line.strip() != NOT_KEPT_HEADING
        found = RULE_HEADING.match(line)
        if found:
            rule_id = found["id"]
            assert rule_id not in rules, f"docs/rules.md:{n}: {rule_id} is defined twice"
            rules[rule_id] = Rule(rule_id, n, kept)
    return rules


# -- citations in the source ----------------------------------------------------------------


@dataclass(frozen=True)
class Citation:
    id: str
    path: str  # relative to the repository
    line: int
    text: str  # the comment or string it was found in, on that line

    def where(self) -> str:
        return f"{self.path}:{self.line}"


def _expand(match: re.Match[str]) -> list[str]:
    letter, first, last = match["letter"], int(match["first"]), match["last"]
    if last is None or int(last) <= first:
        return [f"{letter}{first}"]
    return [f"{letter}{n}" for n in range(first, int(last) + 1)]


def cited_ids(text: str, families: set[str]) -> list[str]:
    """The rule ids one comment or string cites, ranges expanded, in order."""
    found: list[str] = []
    for match in _CITE.finditer(text):
        if match["letter"] in families:
            found.extend(_expand(match))
    for group in _PARENS.finditer(text):
        if _ONLY_IDS.fullmatch(group[1]):
            found.extend(i for m in _CITE.finditer(group[1]) for i in _expand(m))
    seen: dict[str, None] = {}
    for rule_id in found:
        if not _PERCENTILE.match(rule_id):
            seen.setdefault(rule_id)
    return list(seen)


def _prose(path: Path) -> Iterator[tuple[int, str]]:
    """Comments and string literals of a Python file, line by line, with their line."""
    source = path.read_text()
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(source).readline))
    except (tokenize.TokenError, SyntaxError):  # a file being edited: read all of it
        yield from enumerate(source.splitlines(), 1)
        return
    for token in tokens:
        if token.type in (tokenize.COMMENT, tokenize.STRING):
            for offset, line in enumerate(token.string.splitlines()):
                yield token.start[0] + offset, line


def source_citations(families: set[str]) -> list[Citation]:
    """Every rule id cited in src/charter (Python, and the console's templates)."""
    out: list[Citation] = []
    files = sorted([*SOURCE.rglob("*.py"), *SOURCE.rglob("*.html")])
    for path in files:
        rel = path.relative_to(SOURCE).as_posix()
        if rel.startswith(NOT_OURS) or "__pycache__" in rel:
            continue
        if path.suffix == ".py":
            lines: Iterator[tuple[int, str]] = _prose(path)
        else:
            lines = enumerate(path.read_text().splitlines(), 1)
        for n, line in lines:
            for rule_id in cited_ids(line, families):
                out.append(Citation(rule_id, path.relative_to(ROOT).as_posix(), n, line.strip()))
    return out


# -- tests named after rules ----------------------------------------------------------------


def _test_names(path: Path) -> list[str]:
    """The test functions pytest collects from a file: module level, or in a Test class."""
    source = path.read_text()
    try:
        tree = ast.parse(source)
    except SyntaxError:  # a file being edited: its top-level definitions, by pattern
        return re.findall(r"^(?:async\s+)?def\s+(test_\w+)", source, flags=re.MULTILINE)
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name.startswith(
            "test"
        ):
            names.append(node.name)
        elif isinstance(node, ast.ClassDef) and node.name.startswith("Test"):
            names.extend(
                f"{node.name}::{f.name}"
                for f in node.body
                if isinstance(f, ast.FunctionDef | ast.AsyncFunctionDef)
                and f.name.startswith("test")
            )
    return names


def rule_tests() -> dict[str, list[str]]:
    """Rule id -> the tests whose names cite it, as pytest node ids, sorted."""
    proofs: dict[str, list[str]] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        rel = path.relative_to(ROOT).as_posix()
        for name in _test_names(path):
            function = name.rsplit("::", 1)[-1]
            for part in function.split("_"):
                if re.fullmatch(_ID, part):
                    proofs.setdefault(part, []).append(f"{rel}::{name}")
    return {rule_id: sorted(set(ids)) for rule_id, ids in proofs.items()}


# -- the "Proved by" blocks -----------------------------------------------------------------


def _block(tests: list[str]) -> list[str]:
    if not tests:
        return [NO_TEST_LINE]
    plural = "test" if len(tests) == 1 else "tests"
    return [
        f"<details><summary>Proved by {len(tests)} {plural}</summary>",
        "",
        *(f"- `{t}`" for t in tests),
        "",
        PROVED_END,
    ]


def written(text: str, proofs: dict[str, list[str]]) -> str:
    """The page with every kept rule's "Proved by" block as the tests say, and nothing else changed.

    A kept rule's block is the last thing in its section; a rule not kept has none.
    """
    lines = text.splitlines()
    out: list[str] = []
    section: str | None = None  # the kept rule whose section we are in
    i = 0

    def close() -> None:
        if section is None:
            return
        while out and not out[-1].strip():
            out.pop()
        out.extend(["", *_block(proofs.get(section, [])), ""])

    kept = True
    while i < len(lines):
        line = lines[i]
        if line.startswith(PROVED_START):  # an old block: dropped, written again at the end
            if line.startswith(PROVED_START[0]):
                while i < len(lines) and lines[i].strip() != PROVED_END:
                    i += 1
            i += 1
            while i < len(lines) and not lines[i].strip() and (not out or not out[-1].strip()):
                i += 1  # and the blank line after it, so no gap is left
            continue
        if line.startswith(("## ", "### ")):
            close()
            section = None
            if line.startswith("## "):
                kept = line.strip() != NOT_KEPT_HEADING
            heading = RULE_HEADING.match(line)
            if heading and kept:
                section = heading["id"]
        out.append(line)
        i += 1
    close()
    while out and not out[-1].strip():
        out.pop()
    return "\n".join(out) + "\n"


# -- the checks -----------------------------------------------------------------------------


def _rules() -> dict[str, Rule]:
    return page_rules(PAGE.read_text())


def test_every_rule_cited_in_the_source_is_defined_in_docs_rules_md() -> None:
    rules = _rules()
    families = {rule_id[0] for rule_id in rules}
    undefined = [c for c in source_citations(families) if c.id not in rules]
    assert not undefined, (
        "rule ids cited in the source but not defined in docs/rules.md:\n"
        + "\n".join(f"  {c.where()}: {c.id} in {c.text!r}" for c in undefined)
    )


def test_every_rule_kept_is_proved_by_a_test_named_after_it() -> None:
    rules, proofs = _rules(), rule_tests()
    unproved = sorted(r.id for r in rules.values() if r.kept and not proofs.get(r.id))
    assert not unproved, (
        "rules kept (docs/rules.md) that no test is named after (test_<RULE>_...): "
        + ", ".join(f"{r} (docs/rules.md:{rules[r].line})" for r in unproved)
    )


def test_no_test_cites_a_rule_that_is_not_kept_or_not_defined() -> None:
    rules, proofs = _rules(), rule_tests()
    wrong = [
        f"  {t}: {rule_id} is "
        + (
            "under 'Not kept yet' in docs/rules.md: move it out"
            if rule_id in rules
            else "not in docs/rules.md"
        )
        for rule_id, tests in sorted(proofs.items())
        if rule_id not in rules or not rules[rule_id].kept
        for t in tests
    ]
    assert not wrong, "tests named after rules the page does not keep:\n" + "\n".join(wrong)


def test_the_proved_by_lists_are_the_tests_named_after_each_rule() -> None:
    text = PAGE.read_text()
    fresh = written(text, rule_tests())
    if fresh != text:
        kept = [r.id for r in page_rules(text).values() if r.kept]
        stale = [r for r in kept if _section(text, r) != _section(fresh, r)]
        raise AssertionError(
            "docs/rules.md's 'Proved by' lists are not the tests named after each rule"
            f" ({', '.join(stale) or 'layout'}): run `python tests/test_rules.py --write`"
        )


def _section(text: str, rule_id: str) -> str:
    start = text.find(f'<a id="{rule_id}"></a>')
    end = text.find("\n##", start)
    return text[start : end if end >= 0 else len(text)]


def test_the_scanner_reads_citations_and_skips_what_is_not_one() -> None:
    """The citation forms the code uses are read, and look-alikes are not."""
    families = {"A", "F", "L", "P", "R", "S"}
    assert cited_ids("(A1-A7, F3, R7)", families) == [f"A{n}" for n in range(1, 8)] + ["F3", "R7"]
    assert cited_ids("ledger (L0\u2013L9): integers", families) == [f"L{n}" for n in range(10)]
    assert cited_ids("(S2\u2014S5)", families) == ["S2", "S3", "S4", "S5"]
    assert cited_ids("L3/L7: the allowance cannot cover it", families) == ["L3", "L7"]
    assert cited_ids("f'L0 {unit}: available + held + spent != limit'", families) == ["L0"]
    assert cited_ids("an unknown family (Y3)", families) == ["Y3"]
    assert cited_ids("latency P99 and P50; digest 0xA1F3; a1b2; SHA256; S3x; v1.A2", families) == []
    assert cited_ids("Y3 outside parentheses is not a family we have", families) == []


if __name__ == "__main__":
    if "--write" in sys.argv[1:]:
        PAGE.write_text(written(PAGE.read_text(), rule_tests()))
        print(f"wrote the 'Proved by' lists of {PAGE.relative_to(ROOT)}")
    elif "--list" in sys.argv[1:]:
        rules = _rules()
        for c in source_citations({rule_id[0] for rule_id in rules}):
            print(f"{c.where()}: {c.id}{'' if c.id in rules else ' (UNDEFINED)'}  {c.text}")
    else:
        print("usage: python tests/test_rules.py --write | --list", file=sys.stderr)
        sys.exit(2)
