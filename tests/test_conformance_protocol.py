"""X2: the language-neutral conformance suite of the remote attempt protocol
(``sdks/conformance/cases.json``), run by its Python driver against a real
server on each backend. The TypeScript and Rust drivers run the same file.

Run as a script, it serves the suite's fixture for another language's driver::

    python tests/test_conformance_protocol.py serve DIR

prints one JSON line ``{"url", "credentials": {name: "NAME:SECRET"},
"missions": {case name: mission id}}`` and serves until SIGTERM (docs/protocol.md).
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest

import charter
from charter.server.api import PREFIX

SUITE = Path(__file__).resolve().parent.parent / "sdks" / "conformance" / "cases.json"
CASES: dict[str, Any] = json.loads(SUITE.read_text())
_VAR = re.compile(r"\{(\w+)\}")


def fill(value: Any, saved: Mapping[str, Any]) -> Any:
    """``value`` with each ``{name}`` replaced by a saved variable; a string that
    is exactly ``"{name}"`` becomes the variable itself (keeping its JSON type)."""
    if isinstance(value, str):
        whole = _VAR.fullmatch(value)
        if whole and whole.group(1) in saved:
            return saved[whole.group(1)]
        return _VAR.sub(lambda m: str(saved.get(m.group(1), m.group(0))), value)
    if isinstance(value, list):
        return [fill(v, saved) for v in value]
    if isinstance(value, dict):
        return {k: fill(v, saved) for k, v in value.items()}
    return value


def contains(answer: Any, expected: Any, where: str = "$") -> list[str]:
    """Where ``answer`` does not hold ``expected`` (objects key by key, recursively;
    lists and scalars exactly; ``"$any"`` matches anything present)."""
    if expected == "$any":
        return []
    if isinstance(expected, dict):
        if not isinstance(answer, dict):
            return [f"{where}: expected an object, got {answer!r}"]
        wrong: list[str] = []
        for key, value in expected.items():
            if key not in answer:
                wrong.append(f"{where}.{key}: missing")
            else:
                wrong += contains(answer[key], value, f"{where}.{key}")
        return wrong
    return [] if answer == expected else [f"{where}: expected {expected!r}, got {answer!r}"]


def dotted(answer: Any, path: str) -> Any:
    for key in path.split("."):
        answer = answer[key]
    return answer


def run_case(base: str, credentials: Mapping[str, str], mission: str, case: Any) -> None:
    """Run one case's steps in order; fail at the first step that does not hold."""
    saved: dict[str, Any] = {"mission": mission}
    for n, step in enumerate(case["steps"]):
        headers = {"Authorization": f"Bearer {credentials[step['as']]}"}
        url = base + PREFIX + fill(step["path"], saved)
        with httpx.Client(headers=headers, timeout=30) as http:
            if step["method"] == "GET":
                answer = http.get(url)
            else:
                answer = http.request(step["method"], url, json=fill(step.get("body", {}), saved))
        said = answer.json()
        expect = step["expect"]
        at = f"{case['name']} step {n} ({step['method']} {step['path']})"
        assert answer.status_code == expect["status"], (at, answer.text)
        if "error" in expect:
            assert said["error"]["code"] == expect["error"], (at, answer.text)
        wrong = contains(said, fill(expect.get("body", {}), saved))
        assert not wrong, (at, wrong, answer.text)
        for name, key in step.get("save", {}).items():
            saved[name] = dotted(said, key)


def missions(engine: charter.Engine, credentials: Mapping[str, str]) -> dict[str, str]:
    """A fresh mission under the suite's contract for each case."""
    ops = engine.authenticate(credentials["ops"])
    contract = CASES["fixture"]["contract"]
    return {c["name"]: engine.create_mission(contract, by=ops) for c in CASES["cases"]}


def principals() -> tuple[dict[str, str], dict[str, str]]:
    """Credentials for the suite's principals, and their digests to configure."""
    pairs = {n: charter.new_credential(n) for n in CASES["fixture"]["principals"]}
    return {n: c for n, (c, _) in pairs.items()}, {n: d for n, (_, d) in pairs.items()}


@pytest.fixture
def served(
    store_address: str, clock: charter.ManualClock
) -> Iterator[tuple[str, dict[str, str], dict[str, str]]]:
    """The suite's fixture served over a fresh store of each backend."""
    import _desk  # the server's dependencies, only for the tests that serve

    credentials, digests = principals()
    config = charter.EngineConfig(credentials=digests)
    engine = charter.Engine.open(store_address, config=config, clock=clock, store_clock=clock)
    with engine, _desk.serving(engine) as base:
        yield base, credentials, missions(engine, credentials)


@pytest.mark.parametrize("case", CASES["cases"], ids=lambda c: c["name"])
def test_X2_the_conformance_suite_holds_against_the_server(
    served: tuple[str, dict[str, str], dict[str, str]], case: Any
) -> None:
    """Broken X1/X2: the server answers a step of the protocol otherwise than the
    suite every SDK is checked against says."""
    base, credentials, by_case = served
    run_case(base, credentials, by_case[case["name"]], case)


def test_X2_the_suite_names_its_cases_after_rules_and_uses_only_known_principals() -> None:
    names = [c["name"] for c in CASES["cases"]]
    assert len(names) == len(set(names)) and all(re.match(r"X\d_", n) for n in names)
    known = set(CASES["fixture"]["principals"])
    assert {s["as"] for c in CASES["cases"] for s in c["steps"]} <= known


def serve(home: Path) -> None:
    """Serve the suite's fixture over a fresh store in ``home`` until SIGTERM."""
    import signal
    import threading

    from charter.server import serving

    home.mkdir(parents=True, exist_ok=True)
    credentials, digests = principals()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    with charter.Engine.open(
        str(home / "charter.db"), config=charter.EngineConfig(credentials=digests)
    ) as engine:
        found = missions(engine, credentials)
        with serving(engine) as url:
            print(
                json.dumps({"url": url, "credentials": credentials, "missions": found}), flush=True
            )
            stop.wait()


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] != "serve":
        raise SystemExit("usage: test_conformance_protocol.py serve DIR")
    serve(Path(sys.argv[2]))
