"""A run's artifacts as its nodes see them (N2): saved, checked, put back.

A node saves a workspace file (or a stream) as an artifact: its bytes go to
the object store, streamed, and the run records its name, hash and size in
the node execution's name. Before a consumer starts, the artifacts of the
nodes it comes after are checked for presence and hash, and the workspace
files it declares (``uses``) are re-materialised from the store when they
are missing or differ. A missing object stops the consumer and the run needs
intervention; an object that fails its hash is an incident, and the consumer
does not start. Nothing is rebuilt by running a producer again.
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any, BinaryIO

from charter.artifacts import store as artifacts_store
from charter.artifacts.objects import LocalObjects
from charter.artifacts.workspace import check_name, materialise, open_file
from charter.errors import ArtifactError, Blocked, NonDeterminismError
from charter.ledger.incidents import open_incident
from charter.runs.ownership import Segment
from charter.runs.run import RunStatus


def objects(ex: Segment) -> LocalObjects:
    return LocalObjects(ex.runtime.config.artifacts)


def workspace(ex: Segment) -> str:
    return str(Path(ex.runtime.config.workspace) / ex.run_id)


def save(
    ex: Segment, node_id: str, execution: int, name: str, source: bytes | BinaryIO | None
) -> dict[str, Any]:
    """Store an artifact and record it for the run; ``{"artifact", "sha256", "size"}``.

    Without ``source`` the workspace file ``name`` is read (never through a
    link). A replay of the same execution that saves other bytes under the
    same name is a non-determinism error; another node's name is refused.
    """
    check_name(name)
    if source is None:
        with open_file(workspace(ex), name) as f:
            sha, size = objects(ex).put(f)
    else:
        sha, size = objects(ex).put(io.BytesIO(source) if isinstance(source, bytes) else source)
    with ex.runtime.db.transaction() as tx:
        ex.own(tx)
        prior = artifacts_store.artifact(tx, ex.run_id, name)
        if prior is not None and prior["node_id"] != node_id:
            raise ArtifactError(
                f"artifact {name!r} of run {ex.run_id} was saved by node {prior['node_id']}; "
                "each name belongs to one node",
                name=name,
            )
        same = prior is not None and prior["execution"] == execution
        if prior is not None and same and prior["sha256"] != sha:
            raise NonDeterminismError(
                f"node {node_id} execution {execution} saved {name!r} again with other bytes "
                f"({sha}, recorded {prior['sha256']}); the run needs intervention",
                name=name,
            )
        if not same:
            artifacts_store.record(
                tx,
                run_id=ex.run_id,
                name=name,
                mission_id=ex.mission_id,
                node_id=node_id,
                execution=execution,
                sha256=sha,
                size=size,
            )
            tx.audit(
                ex.mission_id,
                "artifact.saved",
                f"{ex.run_id}/{name}",
                actor=ex.principal,
                segment=ex.segment_id,
                epoch=ex.epoch,
                payload={"node_id": node_id, "execution": execution, "sha256": sha, "size": size},
            )
    return {"artifact": name, "sha256": sha, "size": size}


def prepare(ex: Segment, node_id: str, after: tuple[str, ...], uses: tuple[str, ...]) -> None:
    """Check what a consumer will read before it starts (N2); raise :class:`Blocked`
    (the run needs intervention, and an incident when a hash fails) if it may not."""
    store = objects(ex)
    with ex.runtime.db.read() as tx:
        produced = artifacts_store.of_run(tx, ex.run_id, after)
        declared = {n: artifacts_store.artifact(tx, ex.run_id, n) for n in uses}
    try:
        for name, row in declared.items():
            if row is None:
                raise ArtifactError(
                    f"node {node_id} uses {name!r}, which no node of run {ex.run_id} saved",
                    name=name,
                    missing=True,
                )
            materialise(store, workspace(ex), name, row["sha256"])
        for row in produced:
            if row["name"] not in declared and not store.verify(row["sha256"]):
                raise ArtifactError(
                    f"artifact {row['name']!r} ({row['sha256']}) fails its hash",
                    name=row["name"],
                    sha256=row["sha256"],
                    mismatch=True,
                )
    except ArtifactError as exc:
        _stop(ex, node_id, exc)


def _stop(ex: Segment, node_id: str, exc: ArtifactError) -> None:
    """The consumer does not start: a person for a missing object, and an incident
    besides for a wrong hash or a store that is not what it should be (N2)."""
    with ex.runtime.db.transaction(gate=ex.mission_id) as tx:
        if not exc.details.get("missing"):
            open_incident(
                tx,
                ex.mission_id,
                "hash_mismatch" if exc.details.get("mismatch") else "artifact_refused",
                {
                    "node_id": node_id,
                    "artifact": exc.details.get("name"),
                    "sha256": exc.details.get("sha256"),
                },
                actor=ex.principal,
                run_id=ex.run_id,
                epoch=ex.epoch,
            )
        ex.mark_in(tx, RunStatus.NEEDS_INTERVENTION, f"node {node_id} not started: {exc.message}")
    raise Blocked(f"node {node_id} not started: {exc.message}", run_id=ex.run_id)
