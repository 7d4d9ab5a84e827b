"""Charter's side: the attempt loop, recover() on big runs, peak memory.

Everything here goes through Charter's public API — ``Engine.open``,
``EngineConfig``, ``testing.credential``, ``start_run``,
``Executor.perform``, ``Coordinator.recover`` — on the embedded SQLite store
(WAL, ``synchronous=FULL``). Only the bulk of the big stores is written with
direct SQL (see :mod:`storebuild`).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from contextlib import closing
from pathlib import Path
from typing import Any

import peakrss
import record_sql
import storebuild
from timing import Sample, clock, repeat

import charter
from charter.storage import recall
from charter.storage.sqlite import SQLiteDriver
from charter.testing import RecordingAdapter, credential

HERE = Path(__file__).resolve().parent

CONTRACT = {
    "objective": "benchmark",
    "principals": {"agent": {"run": ["recorder.*"]}},
    "allowance": {"calls": 10**12},
}


class Interrupted(BaseException):
    """Stands for a process dying right after the dispatch commit."""


class InterruptAfterDispatch:
    """A crash hook that, when armed, stops the attempt at ``dispatch.after``."""

    def __init__(self) -> None:
        self.armed = False

    def __call__(self, point: str) -> None:
        if self.armed and point == "dispatch.after":
            raise Interrupted


def setup(
    store: Path | str, *, crash_hook: Any = None, lease_seconds: float = 30.0
) -> tuple[charter.Engine, charter.Principal, str, dict[str, str]]:
    """A store with one mission that ``agent`` may run on the recorder adapter."""
    cred, digest = credential("agent")
    config = charter.EngineConfig(credentials={"agent": digest}, lease_seconds=lease_seconds)
    engine = charter.Engine.open(str(store), config=config, crash_hook=crash_hook)
    agent = engine.authenticate(cred)
    mission = engine.create_mission(CONTRACT, by=agent)
    return engine, agent, mission, {"credential": cred, "digest": digest}


def checkpoint(store: Path) -> None:
    """Fold the WAL into the database file, so that copying the file copies the store."""
    with closing(sqlite3.connect(str(store))) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")


def remove_store(store: Path) -> None:
    for suffix in ("", "-wal", "-shm"):
        store.with_name(store.name + suffix).unlink(missing_ok=True)


def _checks(engine: charter.Engine, mission: str) -> dict[str, Any]:
    """The store still holds its invariants: ledger (L0-L2) and audit chain (S1)."""
    return {
        "ledger_problems": engine.check_ledger(mission),
        "audit_ok": all(v.ok for v in engine.verify_audit(mission)),
    }


#: Attempts after which a fresh store's log has its full size: past its first fold
#: into the file (every 2,000 pages; about 21 an attempt makes that ~95, and 20
#: leaves a margin). On a growing log each sync also writes the file's size, so a
#: figure taken before this pays for the growth; one taken after it is steady.
STEADY_ATTEMPTS = SQLiteDriver.checkpoint_pages // 20


# -- attempt overhead ---------------------------------------------------------------------
def attempt_overhead(
    workdir: str,
    steps: int,
    warmup: int,
    reps: int,
    url: str | None = None,
    *,
    read_first: bool = False,
) -> dict[str, Any]:
    """N attempts in one run: admission + dispatch commit, no-op send, settlement.

    The timed unit is ``start_run`` + N attempts + ``finish``, divided by N
    (as the peers' workflow or graph run is); the attempt loop alone is kept too.
    ``url`` names another store (a PostgreSQL database); a store this Charter
    cannot open yet is reported as pending, with Charter's own message.
    ``read_first``: every transaction reads before it decides, as on a store
    that remembers nothing (docs/stores.md): what recalling buys, by difference.
    Set on the store driver, which is not public API.
    """
    store = url or str(Path(workdir) / "charter.db")
    try:
        engine, agent, mission, _ = setup(store)
    except charter.ConfigError as exc:
        return {"pending": exc.message}
    if read_first:
        driver: Any = engine._db.driver
        driver.recalls = False
        driver._memories.want = lambda *args: None
    loop_only = Sample("s")
    cpu = Sample("s")
    statuses: set[str] = set()

    def once(i: int) -> float:
        adapter = RecordingAdapter()
        t0 = clock()
        ex = engine.start_run(mission, by=agent, segment_id=f"seg-{i}")
        t1, c1 = clock(), time.process_time()
        for k in range(steps):
            attempt = ex.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")
            statuses.add(attempt.status.value)
        t2, c2 = clock(), time.process_time()
        ex.finish()
        t3 = clock()
        (loop_only.warmup if i < warmup else loop_only.values).append((t2 - t1) / steps)
        # The process's CPU time (all its threads: SQLite's work included).
        (cpu.warmup if i < warmup else cpu.values).append((c2 - c1) / steps)
        assert len(adapter.sent) == steps
        return (t3 - t0) / steps

    sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    shape = attempt_shape(engine, agent, mission)
    checks = _checks(engine, mission)
    captured = record_sql.capture(engine, agent, mission) if url is None else None
    engine.close()
    out: dict[str, Any] = {
        "sample": sample.to_dict(),
        "loop_only": loop_only.to_dict(),
        "cpu": cpu.to_dict(),
        "statuses": sorted(statuses),
        "shape": shape,
        "checks": checks,
        "settings": {},
    }
    if captured is not None:
        with closing(sqlite3.connect(store)) as conn:
            out["settings"] = {
                "journal_mode": conn.execute("PRAGMA journal_mode").fetchone()[0],
                "synchronous": "FULL (set by Charter on its connection)",
            }
        # Warmed until its log is steady, as Charter's own loop is by the end of
        # its repetitions.
        out["record_sql"] = record_sql.replay(
            Path(store),
            captured,
            steps,
            warmup=max(warmup, -(-STEADY_ATTEMPTS // steps)),
            reps=reps,
        )
    return out


def concurrent_attempts(
    workdir: str, *, threads: int, attempts: int, shared: bool, warmup: int, reps: int
) -> dict[str, Any]:
    """``attempts`` attempts made by ``threads`` threads through one engine, each
    thread owning a run, on a store whose log is steady (one thread and eight
    alike: a growing log would weigh on one thread's two syncs per attempt more
    than on shared commits); wall time per attempt, and physical commits per
    attempt. ``shared=False`` turns group commit off (a driver attribute, not
    public API) to show what it changes."""
    commits: list[float] = []
    cpu, switches = Sample("s"), Sample("switches")

    def once(i: int) -> float:
        store = Path(workdir) / f"concurrent-{i}.db"
        engine, agent, mission, _ = setup(store)
        steady = engine.start_run(mission, by=agent, segment_id="seg-steady")
        warming = RecordingAdapter()
        for k in range(STEADY_ATTEMPTS):
            steady.perform(warming, "write", {"k": k}, effect_key=f"s{k}")
        steady.finish()
        if not shared:
            engine._db.driver.group_limit = 1
        executors = [
            engine.start_run(mission, by=agent, segment_id=f"seg-{n}") for n in range(threads)
        ]
        adapter = RecordingAdapter()
        each = attempts // threads
        before = engine._db.commits
        usage = resource.getrusage(resource.RUSAGE_SELF)

        def work(ex: charter.Executor) -> None:
            for k in range(each):
                ex.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")

        workers = [threading.Thread(target=work, args=(ex,)) for ex in executors]
        t0 = clock()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        elapsed = clock() - t0
        after = resource.getrusage(resource.RUSAGE_SELF)
        done = each * threads
        assert len(adapter.sent) == done
        if i >= warmup:
            commits.append((engine._db.commits - before) / done)
            # CPU and context switches of the whole process (every thread's, and
            # SQLite's work in them): what threads cost besides the work itself.
            used = after.ru_utime + after.ru_stime - usage.ru_utime - usage.ru_stime
            cpu.values.append(used / done)
            moved = after.ru_nvcsw + after.ru_nivcsw - usage.ru_nvcsw - usage.ru_nivcsw
            switches.values.append(moved / done)
        assert engine.check_ledger(mission) == []
        engine.close()
        remove_store(store)
        return elapsed / done

    sample = repeat(once, warmup=warmup, reps=reps, unit="s")
    return {
        "sample": sample.to_dict(),
        "commits_per_attempt": sum(commits) / len(commits),
        "cpu": cpu.to_dict(),
        "switches": switches.to_dict(),
        "threads": threads,
        "attempts": attempts,
        "steady_attempts": STEADY_ATTEMPTS,
        "shared": shared,
    }


def attempt_shape(
    engine: charter.Engine, agent: charter.Principal, mission: str, n: int = 20
) -> dict[str, float]:
    """What one attempt sends to the store, averaged over ``n`` attempts: its
    statements, its commits and (PostgreSQL) its round trips. Read off the
    store driver, which is not public API: this explains the figures, it is
    not one of them."""
    driver: Any = engine._db.driver
    counts = {"statements": 0, "commits": 0, "round_trips": 0}
    pipelined = hasattr(driver, "_send")  # PostgreSQL: statements wait and travel together
    name = "_send" if pipelined else "execute"
    original = getattr(driver, name)

    def counting(*args: Any) -> Any:
        # As they go on the wire: consecutive guards travel as one statement.
        sent = [q for q, _, _ in recall.merged(driver._pending)] if pipelined else []
        sent += [args[0][0] if pipelined else args[0]] if args and args[0] else []
        counts["statements"] += len(sent)
        counts["commits"] += sent.count("COMMIT")
        counts["round_trips"] += 1
        return original(*args)

    ex = engine.start_run(mission, by=agent, segment_id="seg-shape")
    adapter = RecordingAdapter()
    trips: list[int] = []  # each attempt's round trips
    setattr(driver, name, counting)
    try:
        for k in range(n):
            before = counts["round_trips"]
            ex.perform(adapter, "write", {"k": k}, effect_key=f"shape{k}")
            trips.append(counts["round_trips"] - before)
    finally:
        delattr(driver, name)
    ex.finish()
    out: dict[str, Any] = {k: v / n for k, v in counts.items()}
    if pipelined:
        # A run's first attempt finds nothing of the run remembered and reads first.
        out["first_round_trips"] = trips[0]
        out["later_round_trips"] = sum(trips[1:]) / (n - 1)
    if not pipelined:
        out.pop("round_trips")  # in-process: every statement is a call, not a trip
        out["log_pages"] = log_pages(engine, agent, mission, n)
    return out


def log_pages(
    engine: charter.Engine, agent: charter.Principal, mission: str, n: int
) -> dict[str, float]:
    """The pages ``n`` attempts write to SQLite's write-ahead log, per attempt,
    by the table or index each page belongs to (``total`` for all): every page
    is written and synced at a commit, so each B-tree an attempt touches costs
    time on a disk. The log is emptied first (a checkpoint from a second
    connection), then its frames since are read and their pages looked up in
    ``dbstat``."""
    driver: Any = engine._db.driver  # the SQLite driver: the file it keeps
    store = driver.path
    ex = engine.start_run(mission, by=agent, segment_id="seg-pages")
    with closing(sqlite3.connect(str(store))) as conn:
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    adapter = RecordingAdapter()
    for k in range(n):
        ex.perform(adapter, "write", {"k": k}, effect_key=f"pages{k}")
    wal = Path(f"{store}-wal").read_bytes()
    ex.finish()  # after the read: its commit is not counted
    size, salt = int.from_bytes(wal[8:12], "big"), wal[16:24]
    pages = [
        int.from_bytes(wal[at : at + 4], "big")
        for at in range(32, len(wal) - 24 - size + 1, 24 + size)
        if wal[at + 8 : at + 16] == salt
    ]
    with closing(sqlite3.connect(str(store))) as conn:
        owner = dict(conn.execute("SELECT pageno, name FROM dbstat").fetchall())
    by_tree = Counter(owner.get(page, "free page") for page in pages)
    return {"total": len(pages) / n, **{tree: count / n for tree, count in by_tree.items()}}


def profile_attempts(workdir: str, steps: int, top: int = 25) -> str:
    """cProfile of the attempt loop, sorted by own time then by cumulative time."""
    import cProfile
    import io
    import pstats

    engine, agent, mission, _ = setup(Path(workdir) / "charter.db")
    adapter = RecordingAdapter()
    ex = engine.start_run(mission, by=agent, segment_id="seg-warm")
    for k in range(50):
        ex.perform(adapter, "write", {"k": k}, effect_key=f"w{k}")
    profiler = cProfile.Profile()
    profiler.enable()
    for k in range(steps):
        ex.perform(adapter, "write", {"k": k}, effect_key=f"e{k}")
    profiler.disable()
    engine.close()
    out = io.StringIO()
    stats = pstats.Stats(profiler, stream=out)
    stats.sort_stats("tottime").print_stats(top)
    stats.sort_stats("cumulative").print_stats(top)
    return out.getvalue()


# -- recovery ------------------------------------------------------------------------------
def build_recovery_store(store: Path, settled: int, unresolved: int) -> dict[str, Any]:
    """One run with ``settled`` SUCCEEDED attempts and ``unresolved`` in flight.

    Half of the unresolved attempts are PREPARED (admitted, not sent) and half
    DISPATCHED (committed, then the process "died" before the answer). The
    dead owner's lease is then put in the past, as if its 30 s had run out.
    """
    hook = InterruptAfterDispatch()
    # The bulk copy takes about 30 s on a slow machine: the run's lease must outlast it.
    engine, agent, mission, cred = setup(store, crash_hook=hook, lease_seconds=3600)
    ex = engine.start_run(mission, by=agent, segment_id="seg-1")
    adapter = RecordingAdapter()
    template = ex.perform(adapter, "write", {"k": 0}, effect_key=storebuild.KEY_TEMPLATE)
    assert template.status is charter.AttemptStatus.SUCCEEDED
    t0 = clock()
    storebuild.clone(
        store,
        mission_id=mission,
        run_ids=[],
        attempt_ids=[template.id],
        copies=settled - 1,
        rename=storebuild.rename_ids,
    )
    bulk_seconds = clock() - t0
    prepared = unresolved // 2
    for k in range(prepared):
        ex.admit(adapter, "write", {"k": k}, effect_key=f"open-{k}")
    hook.armed = True
    for k in range(prepared, unresolved):
        try:
            ex.perform(adapter, "write", {"k": k}, effect_key=f"open-{k}")
        except Interrupted:
            pass
        else:
            raise AssertionError("the dispatch was not interrupted")
    checks = _checks(engine, mission)
    counts: dict[str, int] = {}
    for a in engine.attempts(run_id=ex.run_id, unresolved=True):
        counts[a.status.value] = counts.get(a.status.value, 0) + 1
    engine.close()
    with closing(sqlite3.connect(str(store))) as conn, conn:
        conn.execute(
            "UPDATE runs SET lease_expires_us = ? WHERE id = ?",
            (time.time_ns() // 1000 - 1_000_000, ex.run_id),
        )
        total = conn.execute(
            "SELECT COUNT(*) FROM attempts WHERE run_id = ?", (ex.run_id,)
        ).fetchone()[0]
    checkpoint(store)
    return {
        "run_id": ex.run_id,
        "credential": cred,
        "attempts": total,
        "unresolved": counts,
        "bulk_seconds": bulk_seconds,
        "size_bytes": store.stat().st_size,
        "checks": checks,
    }


def recovery(
    workdir: str, sizes: list[int], unresolved: int, warmup: int, reps: int
) -> dict[str, Any]:
    """``recover()`` latency on a copy of each big store (a fresh copy per repetition)."""
    out: dict[str, Any] = {}
    for size in sizes:
        base = Path(workdir) / f"recover-{size}.db"
        built = build_recovery_store(base, size, unresolved)
        config = charter.EngineConfig(credentials={"agent": built["credential"]["digest"]})
        seen: dict[str, Any] = {}

        def once(
            i: int,
            base: Path = base,
            built: dict[str, Any] = built,
            config: Any = config,
            seen: dict[str, Any] = seen,
        ) -> float:
            trial = base.with_name(f"trial-{base.name}")
            shutil.copyfile(base, trial)
            # The copy's own write-back must not land inside the timed commit.
            with trial.open("rb+") as f:
                os.fsync(f.fileno())
            with charter.Engine.open(str(trial), config=config) as engine:
                t0 = clock()
                state = engine.coordinator.recover(built["run_id"], f"seg-recover-{i}")
                elapsed = clock() - t0
                seen.update(
                    status=state.run.status.value,
                    epoch=state.epoch,
                    unresolved=len(state.unresolved),
                    voided=len(state.voided),
                    settled_counts=state.settled_counts,
                )
            remove_store(trial)
            return elapsed

        sample = repeat(once, warmup=warmup, reps=reps, unit="s")
        built.pop("credential")  # a throwaway secret, still kept out of the results
        out[str(size)] = {"sample": sample.to_dict(), "store": built, "after_recover": seen}
        remove_store(base)
    return out


# -- memory --------------------------------------------------------------------------------
def build_runs_store(store: Path, runs: int) -> dict[str, Any]:
    """A store holding ``runs`` completed runs of a one-node, one-attempt plan."""
    import children.memory_child as plan_module

    engine, agent, mission, cred = setup(store)
    ex = engine.start_run(mission, by=agent, segment_id="seg-1", plan=plan_module.PLAN)
    ex.execute(plan_module.PLAN, {"k": 0})
    attempt_ids = [a.id for a in engine.attempts(run_id=ex.run_id)]
    engine.close()
    t0 = clock()
    storebuild.clone(
        store,
        mission_id=mission,
        run_ids=[ex.run_id],
        attempt_ids=attempt_ids,
        copies=runs - 1,
        rename=storebuild.rename_ids,
    )
    bulk_seconds = clock() - t0
    config = charter.EngineConfig(credentials={"agent": cred["digest"]})
    with charter.Engine.open(str(store), config=config) as engine:
        checks = _checks(engine, mission)
    with closing(sqlite3.connect(str(store))) as conn:
        completed = conn.execute("SELECT COUNT(*) FROM runs WHERE status = 'completed'").fetchone()
    checkpoint(store)
    return {
        "mission_id": mission,
        "credential": cred,
        "completed_runs": completed[0],
        "bulk_seconds": bulk_seconds,
        "size_bytes": store.stat().st_size,
        "checks": checks,
    }


def import_peak_bytes(env: dict[str, str] | None = None) -> int:
    """Peak RSS of ``python -c "import charter"``: what any use of Charter starts from."""
    done = peakrss.run_python(["-c", "import charter"], env=env)
    if done.returncode != 0:
        raise RuntimeError(f"import charter failed: {done.stderr}")
    return done.peak_bytes


def memory(workdir: str, runs: int, warmup: int, reps: int) -> dict[str, Any]:
    """Peak RSS of a fresh process that opens the store and executes one more run.

    Each process's own peak (see :mod:`peakrss`), bytecode cache on."""
    base = Path(workdir) / "runs.db"
    built = build_runs_store(base, runs)
    spec = Path(workdir) / "memory.json"
    spec.write_text(json.dumps({"mission_id": built["mission_id"], **built["credential"]}))
    child = HERE / "children" / "memory_child.py"
    env = peakrss.installed_env()

    def once(i: int) -> float:
        trial = base.with_name(f"trial-{i}.db")
        shutil.copyfile(base, trial)
        done = peakrss.run_python([str(child), str(trial), str(spec)], env=env)
        remove_store(trial)
        if done.returncode != 0:
            raise RuntimeError(f"memory child failed: {done.stderr}")
        report = json.loads(done.stdout.strip().splitlines()[-1])
        assert report["status"] == "completed", report
        return float(done.peak_bytes)

    sample = repeat(once, warmup=warmup, reps=reps, unit="bytes")
    import_only = import_peak_bytes(env)  # after the warm-up, which wrote the cache
    remove_store(base)
    built.pop("credential")
    return {
        "sample": sample.to_dict(),
        "store": built,
        "baseline_import_only_bytes": import_only,
    }


# -- start-up ------------------------------------------------------------------------------
def startup(warmup: int, reps: int) -> dict[str, Any]:
    """``import charter`` inside a fresh interpreter; ``charter --help`` as a whole process.

    Each with Python's bytecode cache on, as an installed package has it (the
    warm-up runs write it when the environment says not to, which would
    otherwise time compiling every module on each run)."""
    py = sys.executable
    env = peakrss.installed_env()
    script = Path(py).with_name("charter")
    code = "import time; t = time.perf_counter(); import charter; print(time.perf_counter() - t)"

    def import_time(_: int) -> float:
        proc = subprocess.run([py, "-c", code], check=True, capture_output=True, text=True, env=env)
        return float(proc.stdout.strip())

    def wall(cmd: list[str]) -> float:
        t0 = clock()
        subprocess.run(cmd, check=True, capture_output=True, env=env)
        return clock() - t0

    help_cmd = [str(script), "--help"] if script.exists() else [py, "-m", "charter", "--help"]
    return {
        "import": repeat(import_time, warmup=warmup, reps=reps, unit="s").to_dict(),
        "help": repeat(lambda _: wall(help_cmd), warmup=warmup, reps=reps, unit="s").to_dict(),
        "bare_python": repeat(
            lambda _: wall([py, "-c", "pass"]), warmup=warmup, reps=reps, unit="s"
        ).to_dict(),
        "help_command": " ".join(Path(c).name if i == 0 else c for i, c in enumerate(help_cmd)),
    }
