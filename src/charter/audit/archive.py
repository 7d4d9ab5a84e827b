"""Reading and writing a snapshot's archive safely: a gzip-compressed POSIX tar.

Why tar and gzip: ``tar xzf`` and every language's standard library read them,
so a snapshot is inspectable without Charter. Why this module reads it itself
instead of extracting: a snapshot comes from elsewhere and may be hostile. It
is never extracted to disk; each entry is read into memory under bounds that
are checked *while* decompressing (a small file that inflates without end is
refused when the bound is passed, not after), only regular files with the
exact names of the format are accepted (no links, no directories, no
``../`` or absolute names), and nothing in it is ever deserialised as code:
the entries are JSON and raw bytes.
"""

from __future__ import annotations

import gzip
import io
import re
import tarfile
import zlib
from collections.abc import Mapping
from typing import Any

from charter.errors import SnapshotMalformed

# The bounds of a snapshot, one set for both sides: :func:`read` refuses a file
# past any of them, and :func:`write` refuses to make one, so an export never
# hands over a file that an import refuses (S5).

#: The largest snapshot file, compressed.
MAX_FILE_BYTES = 64 << 20
#: The most bytes all entries may inflate to together, and one entry alone.
MAX_INFLATED_BYTES = 256 << 20
MAX_ENTRY_BYTES = 64 << 20
#: The most entries an archive may hold (the fixed ones and artifacts).
MAX_ENTRIES = 10_000

#: The names an entry may have: the fixed entries and ``artifacts/<sha256>``.
FIXED = ("snapshot.json", "snapshot.sig", "audit.jsonl", "state.json", "artifacts.json")
ARTIFACT = re.compile(r"artifacts/[0-9a-f]{64}")


def _refuse(problem: str, message: str, **details: Any) -> SnapshotMalformed:
    return SnapshotMalformed(message, problem=problem, **details)


class _Bounded(io.RawIOBase):
    """A stream that refuses to yield more than ``limit`` bytes in total."""

    def __init__(self, inner: Any, limit: int) -> None:
        self._inner = inner
        self._left = limit

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer)
        data = self._inner.read(min(len(view), self._left + 1))
        if len(data) > self._left:
            raise _refuse(
                "too_large",
                f"the archive inflates past {MAX_INFLATED_BYTES} bytes: refused as a "
                "decompression bomb (a snapshot of that size is not one this engine made)",
            )
        self._left -= len(data)
        view[: len(data)] = data
        return len(data)


def _entry_problem(name: str, size: int, seen: Mapping[str, bytes]) -> str | None:
    """What is wrong with an entry of ``size`` bytes named ``name``, on either side."""
    if name not in FIXED and not ARTIFACT.fullmatch(name):
        return "unknown_entry"
    if name in seen:
        return "duplicate_entry"
    if size > MAX_ENTRY_BYTES:
        return "too_large"
    return None


def _name_problem(member: tarfile.TarInfo, seen: Mapping[str, bytes]) -> str | None:
    name = member.name
    if name.startswith("/") or "\\" in name or ".." in name.split("/"):
        return "unsafe_path"
    if not member.isreg():
        return "not_a_file"
    return _entry_problem(name, member.size, seen)


def _entry_refused(name: str, problem: str) -> SnapshotMalformed:
    return _refuse(
        problem,
        f"archive entry {name[:200]!r} refused ({problem}): a snapshot holds only regular "
        f"files named {', '.join(FIXED)} or artifacts/<sha256>, each at most "
        f"{MAX_ENTRY_BYTES} bytes",
        entry=name[:200],
    )


def read(data: bytes) -> dict[str, bytes]:
    """The entries of a snapshot archive by name, each checked as above."""
    if len(data) > MAX_FILE_BYTES:
        raise _refuse("too_large", f"the file is over {MAX_FILE_BYTES} bytes")
    entries: dict[str, bytes] = {}
    try:
        stream = io.BufferedReader(
            _Bounded(gzip.GzipFile(fileobj=io.BytesIO(data)), MAX_INFLATED_BYTES)
        )
        with tarfile.open(fileobj=stream, mode="r|") as tar:
            for member in tar:
                problem = _name_problem(member, entries)
                if problem is not None:
                    raise _entry_refused(member.name, problem)
                if len(entries) >= MAX_ENTRIES:
                    raise _refuse("too_many_entries", f"more than {MAX_ENTRIES} entries")
                extracted = tar.extractfile(member)
                assert extracted is not None  # a regular file
                entries[member.name] = extracted.read()
    except (tarfile.TarError, gzip.BadGzipFile, zlib.error, EOFError, OSError) as exc:
        raise _refuse(
            "not_an_archive",
            f"not a snapshot: the file is not a complete gzip-compressed tar archive ({exc})",
        ) from None
    return entries


def write(entries: Mapping[str, bytes], *, mtime: int, headroom: int = 0) -> bytes:
    """A deterministic archive of ``entries`` in the order given.

    Refused, as :func:`read` would refuse it, if it passes a bound; each bound
    counts ``headroom`` bytes more, for a caller that must know the archive
    would still fit after its entries grow by that much (a handover checks the
    file before the fence that adds to it, S5).
    """
    if len(entries) > MAX_ENTRIES:
        raise _refuse("too_many_entries", f"more than {MAX_ENTRIES} entries")
    seen: dict[str, bytes] = {}
    for name, content in entries.items():
        problem = _entry_problem(name, len(content) + headroom, seen)
        if problem is not None:
            raise _entry_refused(name, problem)
        seen[name] = content
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, content in entries.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            info.mtime = mtime
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(content))
    if raw.tell() + headroom > MAX_INFLATED_BYTES:
        raise _refuse("too_large", f"the archive would inflate past {MAX_INFLATED_BYTES} bytes")
    data = gzip.compress(raw.getvalue(), mtime=0)
    if len(data) + headroom > MAX_FILE_BYTES:
        raise _refuse("too_large", f"the file would be over {MAX_FILE_BYTES} bytes")
    return data
