"""Artifacts (N2): content-addressed, checked before a consumer starts, put back
when missing, hostile names and planted links refused, big ones streamed."""

from __future__ import annotations

import hashlib
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import charter
from charter import RunStatus
from charter.artifacts.objects import CHUNK, LocalObjects
from charter.artifacts.workspace import check_name
from conftest import Principals

REPORT = b"region,total\nnorth,12\nsouth,30\n"


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    d = {k: tmp_path / k for k in ("store", "work", "outside")}
    d["outside"].mkdir()
    (d["outside"] / "secret.txt").write_bytes(b"not for the store")
    return d


@pytest.fixture
def engine(make_engine: Callable[..., charter.Engine], dirs: dict[str, Path]) -> charter.Engine:
    return make_engine(artifacts=str(dirs["store"]), workspace=str(dirs["work"]))


def obj(dirs: dict[str, Path], sha: str) -> Path:
    return dirs["store"] / "objects" / sha[:2] / sha[2:]


def outside(dirs: dict[str, Path]) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in dirs["outside"].iterdir()}


def _plan(between: Callable[[charter.Context], None], started: list[str]) -> charter.Plan:
    @charter.node
    def produce(ctx: charter.Context, value: Any) -> dict[str, Any]:
        (ctx.workspace / "out").mkdir(parents=True, exist_ok=True)
        (ctx.workspace / "out" / "report.csv").write_bytes(REPORT)
        return ctx.save("out/report.csv")

    @charter.node
    def meddle(ctx: charter.Context, ref: dict[str, Any]) -> dict[str, Any]:
        between(ctx)
        return ref

    @charter.node(uses=("out/report.csv",))
    def consume(ctx: charter.Context, ref: dict[str, Any]) -> str:
        started.append("consume")
        return (ctx.workspace / "out" / "report.csv").read_text()

    return charter.Plan("report", (produce, meddle, consume))


def test_N2_a_missing_workspace_file_is_re_materialised_before_its_consumer_starts(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path]
) -> None:
    started: list[str] = []
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    wipe = lambda ctx: (ctx.workspace / "out" / "report.csv").unlink()  # noqa: E731

    assert ex.execute(_plan(wipe, started)) == REPORT.decode()

    sha = hashlib.sha256(REPORT).hexdigest()
    assert obj(dirs, sha).read_bytes() == REPORT
    (a,) = engine.artifacts(ex.run_id)
    assert (a["name"], a["sha256"], a["size"], a["node_id"]) == (
        "out/report.csv",
        sha,
        len(REPORT),
        "produce",
    )
    assert [v["ok"] for v in engine.verify_artifacts(ex.run_id)] == [True]
    assert "artifact.saved" in [e["kind"] for e in engine.audit_events(mission)]


def test_N2_missing_everywhere_is_not_re_materialisable_and_the_run_needs_intervention(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path]
) -> None:
    started: list[str] = []

    def lose(ctx: charter.Context) -> None:
        (ctx.workspace / "out" / "report.csv").unlink()
        obj(dirs, hashlib.sha256(REPORT).hexdigest()).unlink()

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked, match="cannot be re-materialised"):
        ex.execute(_plan(lose, started))
    assert started == []
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION
    assert "consume" not in {n.node_id for n in engine.node_executions(ex.run_id)}
    assert engine.incidents(mission) == []


def test_N2_a_hash_mismatch_is_an_incident_and_the_consumer_does_not_start(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path]
) -> None:
    started: list[str] = []
    sha = hashlib.sha256(REPORT).hexdigest()

    def corrupt(ctx: charter.Context) -> None:
        (ctx.workspace / "out" / "report.csv").unlink()
        obj(dirs, sha).write_bytes(b"region,total\nnorth,99\n")

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    with pytest.raises(charter.Blocked, match="does not match its hash"):
        ex.execute(_plan(corrupt, started))
    assert started == []
    (incident,) = engine.incidents(mission)
    assert incident["kind"] == "hash_mismatch"
    assert engine.run(ex.run_id).status is RunStatus.NEEDS_INTERVENTION
    assert not (dirs["work"] / ex.run_id / "out" / "report.csv").exists()
    assert [v["ok"] for v in engine.verify_artifacts(ex.run_id)] == [False]


@pytest.mark.parametrize(
    "name", ["../escape.txt", "/tmp/abs.txt", "a\x00b", "a/../../b", "", "a//b"]
)
def test_N2_hostile_artifact_names_are_refused_and_nothing_outside_is_touched(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path], name: str
) -> None:
    refused: list[str] = []

    @charter.node
    def hostile(ctx: charter.Context, value: Any) -> list[str]:
        try:
            ctx.save(name, b"payload")
        except charter.ArtifactError as exc:
            refused.append(exc.message)
        return refused

    before = outside(dirs)
    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.execute(charter.Plan("hostile", (hostile,)))
    assert len(refused) == 1 and "refused" in refused[0]
    assert engine.artifacts(ex.run_id) == []
    assert outside(dirs) == before
    assert not (dirs["work"].parent / "escape.txt").exists()
    with pytest.raises(charter.ArtifactError):
        check_name(name)
    with pytest.raises(charter.ArtifactError):
        charter.node(uses=(name,))(lambda ctx, v: v)


def test_N2_a_symlink_planted_in_the_store_is_never_followed(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path]
) -> None:
    store = LocalObjects(dirs["store"])
    sha = hashlib.sha256(REPORT).hexdigest()
    # A link where the object would be, pointing outside: refused, never read.
    obj(dirs, sha).parent.mkdir(parents=True)
    obj(dirs, sha).symlink_to(dirs["outside"] / "secret.txt")
    with pytest.raises(charter.ArtifactError, match="never followed"):
        store.verify(sha)
    # A fan-out directory replaced by a link to outside: nothing is written through it.
    other = hashlib.sha256(b"other").hexdigest()
    (dirs["store"] / "objects" / other[:2]).symlink_to(dirs["outside"], target_is_directory=True)
    before = outside(dirs)
    with pytest.raises(charter.ArtifactError, match="never followed"):
        store.put(_Stream(b"other", 5))
    assert outside(dirs) == before
    assert list((dirs["store"] / "tmp").iterdir()) == []
    with pytest.raises(charter.ArtifactError, match="SHA-256"):
        store.verify("../../outside/secret.txt")


class _Stream:
    """``size`` bytes of a repeated pattern, produced as read: nothing held whole."""

    def __init__(self, pattern: bytes, size: int) -> None:
        self.block = (pattern * (CHUNK // len(pattern) + 1))[:CHUNK]
        self.left = size

    def read(self, n: int = -1) -> bytes:
        n = self.left if n < 0 else min(n, self.left)
        self.left -= n
        return self.block[:n] if n <= len(self.block) else self.block * (n // len(self.block))


def test_N2_a_1_gb_artifact_is_stored_and_verified_within_a_fixed_memory_budget(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path]
) -> None:
    size = 1 << 30
    expected = hashlib.sha256()
    probe = _Stream(b"charter-", size)
    while chunk := probe.read(CHUNK):
        expected.update(chunk)

    @charter.node
    def big(ctx: charter.Context, value: Any) -> dict[str, Any]:
        return ctx.save("big.bin", _Stream(b"charter-", size))  # type: ignore[arg-type]

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    tracemalloc.start()
    try:
        ref = ex.execute(charter.Plan("big", (big,)))
        (checked,) = engine.verify_artifacts(ex.run_id)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert ref == {"artifact": "big.bin", "sha256": expected.hexdigest(), "size": size}
    assert checked["ok"] is True
    assert obj(dirs, ref["sha256"]).stat().st_size == size
    assert peak < 8 * CHUNK, f"peak {peak} bytes for a {size}-byte artifact"
    obj(dirs, ref["sha256"]).unlink()


def test_N2_fetching_an_artifact_needs_the_consume_right(
    engine: charter.Engine, mission: str, who: Principals, dirs: dict[str, Path], tmp_path: Path
) -> None:
    @charter.node
    def produce(ctx: charter.Context, value: Any) -> dict[str, Any]:
        return ctx.save("note.txt", b"hello")

    ex = engine.start_run(mission, by=who.agent, segment_id="seg-1")
    ex.execute(charter.Plan("note", (produce,)))
    with pytest.raises(charter.NotAuthorized):
        engine.fetch_artifact(ex.run_id, "note.txt", tmp_path / "a.txt", by=who.mallory)
    assert not (tmp_path / "a.txt").exists()
    engine.fetch_artifact(ex.run_id, "note.txt", tmp_path / "b.txt", by=who.alice)
    assert (tmp_path / "b.txt").read_bytes() == b"hello"
