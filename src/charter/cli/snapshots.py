"""The ``charter`` commands for snapshots and handover (S2-S5): export, import,
handoff, adopt, and ``audit identity``.

Files are read with a bound (a snapshot larger than the format allows is
refused before it is read whole) and written only where ``-o`` says, never
over an existing file.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from charter.errors import UsageError

if TYPE_CHECKING:
    from charter import Engine

#: The largest snapshot file read (the importer refuses anything larger anyway).
MAX_FILE_BYTES = 64 << 20


def read_file(path: str) -> bytes:
    """At most one byte past the bound, so an oversized file is refused, not loaded."""
    try:
        with Path(path).open("rb") as f:
            return f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read {path}: {exc.strerror}") from None


def _write_new(path: str, data: bytes) -> None:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except OSError as exc:
        raise UsageError(f"cannot write {path}: {exc.strerror}; name a new file") from None
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def export(engine: Engine, args: argparse.Namespace, principal: Any) -> Any:
    data = engine.export_snapshot(args.mission, handover_to=args.handover, by=principal)
    _write_new(args.output, data)
    out = {"mission_id": args.mission, "file": args.output, "bytes": len(data)}
    if args.handover:
        out["handover_to"] = args.handover
        return out, (
            f"{args.mission} handed over to store {args.handover}: fenced here; "
            f"snapshot in {args.output}"
        )
    return out, f"snapshot of {args.mission} in {args.output} ({len(data)} bytes, signed)"


def import_(engine: Engine, args: argparse.Namespace) -> Any:
    mission = engine.import_snapshot(read_file(args.file))
    return {"mission_id": mission, "imported": True}, (
        f"imported {mission}: verified and filed read-only "
        "(`charter adopt` continues a handover made to this store)"
    )


def handoff(engine: Engine, args: argparse.Namespace) -> Any:
    from charter import handoff_markdown  # noqa: PLC0415 - loaded when run

    source = args.source
    if Path(source).is_file():
        report = engine.handoff(snapshot=read_file(source))
    else:
        report = engine.handoff(mission_id=source)
    return report, handoff_markdown(report)


def adopt(engine: Engine, args: argparse.Namespace, principal: Any) -> Any:
    executors = engine.adopt(args.mission, by=principal, segment_id=args.segment)
    runs = [ex.run_id for ex in executors]
    return {"mission_id": args.mission, "runs": runs}, (
        f"adopted {args.mission}; linked run(s): {', '.join(runs) or '(none)'}; "
        "reconcile what is unresolved, then `charter resume RUN --segment "
        f"{args.segment}`"
    )


def identity(engine: Engine) -> Any:
    data = {"store_id": engine.store_id(), "signing_key": engine.signing_public_key()}
    return data, json.dumps(data, indent=2)
