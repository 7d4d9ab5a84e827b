"""Reading for people watching: several reads as one moment of the store
(:meth:`charter.Engine.reading`), the server's one reading thread
(:class:`charter.server.reader.Reader`), and the console's rows escaped in one
pass (:func:`charter.server.pages.escaped`).
"""

from __future__ import annotations

import asyncio
import gc
import threading
from collections.abc import Callable
from typing import Any

import pytest

import charter
from _raw import RawStore
from charter.server import pages
from charter.server.reader import Reader
from conftest import Principals

# -- one moment of the store -------------------------------------------------------------


def test_reads_in_a_reading_see_one_moment_while_another_process_commits(
    engine: charter.Engine,
    make_engine: Callable[..., charter.Engine],
    mission: str,
    creds: tuple[dict[str, str], dict[str, str]],
) -> None:
    """Broken: each read of a page is its own transaction, so a page shows the
    limit before a change in one place and after it in another."""
    other = make_engine()  # its own connection, as another process's
    theirs = Principals(creds[0], creds[1], other)
    before = engine.balances(mission)["usd"].limit
    with engine.reading():
        assert engine.balances(mission)["usd"].limit == before
        other.raise_limit(mission, "usd", before + 5, by=theirs.alice)
        assert engine.balances(mission)["usd"].limit == before
        assert engine.mission(mission).id == mission
    assert engine.balances(mission)["usd"].limit == before + 5


def test_a_reading_is_one_transaction_and_nests(
    engine: charter.Engine, mission: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Broken: every read inside a reading begins a transaction of its own, or a
    nested reading ends the enclosing one."""
    driver = engine._db.driver
    begun: list[bool] = []
    real = driver.begin

    def counted(write: bool, *args: Any) -> None:
        begun.append(write)
        real(write, *args)

    monkeypatch.setattr(driver, "begin", counted)
    with engine.reading():
        engine.mission(mission)
        with engine.reading():
            engine.balances(mission)
        engine.runs(mission)
    assert begun == [False]
    engine.mission(mission)
    assert begun == [False, False]


def test_a_decision_inside_a_reading_is_refused_and_changes_nothing(
    engine: charter.Engine, mission: str, who: Principals, raw: RawStore
) -> None:
    """Broken: a write inside a reading acts on a moment that has passed (or the
    refused write leaves the reading, or the engine, unusable)."""
    before = raw.dump()
    with engine.reading():
        with pytest.raises(charter.UsageError, match="reading only reads"):
            engine.raise_limit(mission, "usd", 2_000_000, by=who.alice)
        assert engine.balances(mission)["usd"].limit == 1_000_000
    assert raw.dump() == before
    engine.raise_limit(mission, "usd", 2_000_000, by=who.alice)
    assert engine.balances(mission)["usd"].limit == 2_000_000


def test_closing_the_engine_inside_a_reading_is_refused_not_a_deadlock(
    engine: charter.Engine, mission: str
) -> None:
    """Broken: closing inside a reading waits for the connection this thread holds."""
    with engine.reading():
        with pytest.raises(charter.UsageError, match="after its reading"):
            engine.close()
        assert engine.mission(mission).id == mission
    engine.close()


def test_a_failure_inside_a_reading_ends_it_and_other_threads_go_on(
    engine: charter.Engine, mission: str, who: Principals
) -> None:
    """Broken: an error in a reading leaves its transaction open (the next reading
    or another thread's write waits forever)."""
    with pytest.raises(charter.NotFound), engine.reading():
        engine.balances(mission)
        engine.mission("msn_nobody")
    done: list[int] = []  # the contract version the raise made
    writer = threading.Thread(
        target=lambda: done.append(engine.raise_limit(mission, "usd", 3_000_000, by=who.alice))
    )
    with engine.reading():
        writer.start()
        writer.join(0.2)
        assert writer.is_alive() and not done  # waits for the reading to end
        assert engine.balances(mission)["usd"].limit == 1_000_000
    writer.join(10)
    assert len(done) == 1 and engine.balances(mission)["usd"].limit == 3_000_000


# -- the reading thread ---------------------------------------------------------------------


def test_the_reader_runs_calls_in_order_on_one_thread_and_hands_back_errors() -> None:
    """Broken: reads run on the event loop's thread (blocking every connection),
    on several threads, out of order, or an error is lost."""
    reader = Reader()
    seen: list[tuple[int, int]] = []

    def call(n: int) -> int:
        seen.append((n, threading.get_ident()))
        return n * 10

    def boom() -> None:
        raise charter.NotFound("no such run")

    async def main() -> list[Any]:
        calls = [reader(lambda n=n: call(n)) for n in range(20)]
        answers = await asyncio.gather(*calls, reader(boom), return_exceptions=True)
        return [threading.get_ident(), *answers]

    loop_thread, *answers = asyncio.run(main())
    assert answers[:20] == [n * 10 for n in range(20)]
    assert isinstance(answers[20], charter.NotFound)
    assert [n for n, _ in seen] == list(range(20))
    assert len({t for _, t in seen}) == 1 and seen[0][1] != loop_thread


def test_the_reading_thread_ends_with_its_reader() -> None:
    """Broken: every application built (a test, a reload) leaves a thread behind."""
    reader = Reader()
    thread = asyncio.run(reader(threading.current_thread))
    assert thread.name == "charter-reader" and thread.is_alive()
    del reader
    gc.collect()
    thread.join(5)
    assert not thread.is_alive()


def test_a_cancelled_request_does_not_break_the_reader() -> None:
    """Broken: a request that went away before its read ended makes the reader
    raise (InvalidStateError) or stop serving the others."""
    reader = Reader()
    release = threading.Event()

    async def main() -> int:
        slow = asyncio.ensure_future(reader(lambda: release.wait(5)))
        await asyncio.sleep(0.05)
        slow.cancel()
        release.set()
        return await reader(lambda: 42)

    assert asyncio.run(main()) == 42


# -- escaping in one pass -------------------------------------------------------------------


@pytest.mark.parametrize(
    "values",
    [
        ["run_1", "<script>alert(1)</script>", "a&b", "'\"", ""],
        ["split\x1fhere", "<b>", "x"],  # holds the separator itself
        [],
    ],
)
def test_values_escaped_together_are_each_escaped_alone(values: list[str]) -> None:
    """Broken: escaping values in one pass misaligns them, or lets markup through."""
    import html

    assert pages.escaped(values) == [html.escape(v) for v in values]


def test_the_run_rows_and_the_timeline_escape_what_people_and_agents_wrote() -> None:
    """Broken: a value written by an agent or a person (a stop reason, a request)
    reaches the page as markup."""
    evil = '<img src=x onerror="alert(1)">'
    rows = pages.run_rows(
        [
            {
                "id": "run_1",
                "mission_id": evil,
                "status": "stopped",
                "owner_segment": evil,
                "principal": evil,
                "epoch": 2,
                "created_at_us": 0,
            }
        ]
    )
    timeline = pages.timeline_rows(
        [
            {
                "seq": 3,
                "at_us": 0,
                "actor": evil,
                "kind": "run.stopped",
                "entity": "run_1",
                "before": "active",
                "after": evil,
                "payload": '{"reason": "' + evil + '"}',
            },
            {
                "seq": 4,
                "at_us": 0,
                "actor": "bob",
                "kind": "approval.refused",
                "entity": "apr_1",
                "before": None,
                "after": None,
                "payload": "{}",
            },
        ]
    )
    for markup in (rows, timeline):
        assert "<img" not in markup and "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;" in markup
    assert '<tr class="" data-seq="3">' in timeline
    assert '<tr class="refusal" data-seq="4">' in timeline
    assert "<td>active → &lt;img" in timeline
