"""The object store (N2): blobs addressed by their SHA-256, streamed in fixed chunks.

Storage paths come only from the hash (``objects/ab/cdef...``), never from a
name anyone gave. Every path is walked from the root's descriptor with
``O_NOFOLLOW``: a symlink planted anywhere in the store is refused, so nothing
outside the root is read or written. Blobs are read and written in chunks of
:data:`CHUNK` bytes, so a 1 GB artifact costs one chunk of memory, not 1 GB.
:class:`LocalObjects` is a directory shared by the workers of one machine (or
mounted for several); an object store can follow behind :class:`Objects`.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO, Protocol

from charter.errors import ArtifactError

CHUNK = 1 << 20
_SHA256 = re.compile(r"[0-9a-f]{64}")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class Objects(Protocol):
    """What the engine needs of an artifact store."""

    def put(self, source: BinaryIO) -> tuple[str, int]: ...
    def has(self, sha256: str) -> bool: ...
    def verify(self, sha256: str) -> bool: ...
    def chunks(self, sha256: str) -> Iterator[bytes]: ...


def check_hash(sha256: str) -> str:
    if not isinstance(sha256, str) or not _SHA256.fullmatch(sha256):
        raise ArtifactError(
            f"{sha256!r} is not a SHA-256 digest (64 lowercase hex digits)", sha256=str(sha256)
        )
    return sha256


class LocalObjects:
    """A content-addressed directory: ``ROOT/objects/ab/<the rest of the hash>``."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        self.root = os.fspath(root)

    # -- descriptors, walked from the root without following links -------------------
    @contextlib.contextmanager
    def _dir(self, *parts: str, create: bool) -> Iterator[int]:
        if create:
            Path(self.root).mkdir(parents=True, exist_ok=True)
        fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for part in parts:
                if create:
                    with contextlib.suppress(FileExistsError):
                        os.mkdir(part, 0o700, dir_fd=fd)
                try:
                    nxt = os.open(part, _DIR, dir_fd=fd)
                except OSError as exc:
                    raise _refused(self.root, part, exc) from None
                os.close(fd)
                fd = nxt
            yield fd
        finally:
            os.close(fd)

    def put(self, source: BinaryIO) -> tuple[str, int]:
        """Store what ``source`` yields, streamed; its hash and size. Written to a
        temporary file, flushed to disk, then renamed into place."""
        h, size = hashlib.sha256(), 0
        with self._dir("tmp", create=True) as tmp:
            name = f"put-{os.getpid()}-{os.urandom(8).hex()}"
            fd = os.open(
                name, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=tmp
            )
            try:
                with os.fdopen(fd, "wb", closefd=True) as out:
                    while chunk := source.read(CHUNK):
                        h.update(chunk)
                        out.write(chunk)
                        size += len(chunk)
                    out.flush()
                    os.fsync(out.fileno())
                sha = h.hexdigest()
                with self._dir("objects", sha[:2], create=True) as dest:
                    os.replace(name, sha[2:], src_dir_fd=tmp, dst_dir_fd=dest)
                    os.fsync(dest)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(name, dir_fd=tmp)
        return sha, size

    @contextlib.contextmanager
    def _open(self, sha256: str) -> Iterator[BinaryIO]:
        sha = check_hash(sha256)
        with self._dir("objects", sha[:2], create=False) as d:
            try:
                fd = os.open(sha[2:], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=d)
            except OSError as exc:
                raise _refused(self.root, sha, exc) from None
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            os.close(fd)
            raise ArtifactError(f"object {sha} in {self.root} is not a plain file", sha256=sha)
        with os.fdopen(fd, "rb") as f:
            yield f

    def chunks(self, sha256: str) -> Iterator[bytes]:
        """The object's bytes, a chunk at a time (not verified: see :meth:`verify`)."""
        with self._open(sha256) as f:
            while chunk := f.read(CHUNK):
                yield chunk

    def has(self, sha256: str) -> bool:
        try:
            with self._open(sha256):
                return True
        except ArtifactError as exc:
            if exc.details.get("missing"):
                return False
            raise

    def verify(self, sha256: str) -> bool:
        """Whether the object is present and hashes to its name (streamed)."""
        h = hashlib.sha256()
        for chunk in self.chunks(sha256):
            h.update(chunk)
        return h.hexdigest() == sha256


def _refused(root: str, part: str, exc: OSError) -> ArtifactError:
    if isinstance(exc, FileNotFoundError):
        return ArtifactError(f"{part} is missing from the artifact store {root}", missing=True)
    return ArtifactError(
        f"{part} in the artifact store {root} is not a plain directory or file "
        f"({exc.strerror}); a link planted in the store is never followed",
        path=part,
    )
