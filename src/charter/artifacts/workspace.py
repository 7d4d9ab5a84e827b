"""Artifact names and the workspace files a node declares (N2).

A name is a relative path inside a run's workspace (``data/report.csv``): no
absolute path, no ``..``, no empty part, no NUL or other control character.
A file is written and read only by walking its parts from the workspace's
descriptor without following links, so a hostile name or a planted link
reaches nothing outside. :func:`materialise` puts a declared file back from
the object store when it is missing or differs; when the store cannot give
it back, the caller stops the consumer and asks for a person.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

from charter.artifacts.objects import CHUNK, Objects
from charter.errors import ArtifactError

_CONTROL = re.compile(r"[\x00-\x1f\x7f\\]")
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


def check_name(name: str) -> tuple[str, ...]:
    """The parts of a safe artifact name, or :class:`ArtifactError` saying why not."""
    bad = None
    if not isinstance(name, str) or not name:
        bad = "it is empty"
    elif len(name) > 255:
        bad = "it is longer than 255 characters"
    elif _CONTROL.search(name):
        bad = "it holds a NUL, a control character or a backslash"
    elif name.startswith("/"):
        bad = "it is an absolute path"
    elif any(p in ("", ".", "..") for p in name.split("/")):
        bad = "it has an empty, '.' or '..' part"
    if bad is not None:
        raise ArtifactError(
            f"artifact name {name!r} is refused: {bad}; use a relative path like "
            "'data/report.csv' inside the workspace",
            name=repr(name),
        )
    return tuple(name.split("/"))


@contextlib.contextmanager
def _parent(root: str, parts: tuple[str, ...], *, create: bool) -> Iterator[int]:
    """A descriptor of the directory that holds ``parts[-1]``, walked from ``root``."""
    if create:
        Path(root).mkdir(parents=True, exist_ok=True)
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except FileNotFoundError:
        # A run's workspace on a machine that has not worked on it yet (another
        # worker's, N2): every file of it is missing, to be put back from the store.
        raise ArtifactError(
            f"workspace {root} does not exist here", path=root, missing=True
        ) from None
    try:
        for part in parts[:-1]:
            if create:
                with contextlib.suppress(FileExistsError):
                    os.mkdir(part, 0o700, dir_fd=fd)
            try:
                nxt = os.open(part, _DIR, dir_fd=fd)
            except OSError as exc:
                raise ArtifactError(
                    f"workspace directory {part!r} under {root} cannot be used "
                    f"({exc.strerror}); links are never followed",
                    path=part,
                    missing=isinstance(exc, FileNotFoundError),
                ) from None
            os.close(fd)
            fd = nxt
        yield fd
    finally:
        os.close(fd)


@contextlib.contextmanager
def open_file(root: str, name: str) -> Iterator[BinaryIO]:
    """Open a workspace file for reading, without following links."""
    parts = check_name(name)
    with _parent(root, parts, create=False) as d:
        try:
            fd = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW, dir_fd=d)
        except OSError as exc:
            raise ArtifactError(
                f"workspace file {name!r} under {root} cannot be read ({exc.strerror})",
                name=name,
                missing=isinstance(exc, FileNotFoundError),
            ) from None
    with os.fdopen(fd, "rb") as f:
        yield f


def file_hash(root: str, name: str) -> str | None:
    """The SHA-256 of a workspace file, or ``None`` when it is missing."""
    h = hashlib.sha256()
    try:
        with open_file(root, name) as f:
            while chunk := f.read(CHUNK):
                h.update(chunk)
    except ArtifactError as exc:
        if exc.details.get("missing"):
            return None
        raise
    return h.hexdigest()


def materialise(objects: Objects, root: str, name: str, sha256: str) -> str:
    """Make the workspace file ``name`` hold the artifact ``sha256``.

    ``"present"`` when it already does; ``"restored"`` when it was copied back
    from the store (verified while copied, then renamed into place). Raises
    :class:`ArtifactError` with ``missing`` when the store has no such object,
    and with ``mismatch`` when the object does not hash to its name: then
    the file is left as it was.
    """
    if file_hash(root, name) == sha256:
        return "present"
    if not objects.has(sha256):
        raise ArtifactError(
            f"workspace file {name!r} is missing and the artifact store has no object "
            f"{sha256}; it cannot be re-materialised: a person must restore it",
            name=name,
            sha256=sha256,
            missing=True,
        )
    parts = check_name(name)
    tmp = f".{parts[-1]}.{os.urandom(6).hex()}.part"
    with _parent(root, parts, create=True) as d:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600, dir_fd=d)
        try:
            h = hashlib.sha256()
            with os.fdopen(fd, "wb") as out:
                for chunk in objects.chunks(sha256):
                    h.update(chunk)
                    out.write(chunk)
                out.flush()
                os.fsync(out.fileno())
            if h.hexdigest() != sha256:
                raise ArtifactError(
                    f"the artifact store's object {sha256} does not match its hash; "
                    f"{name!r} was not restored",
                    name=name,
                    sha256=sha256,
                    mismatch=True,
                )
            os.replace(tmp, parts[-1], src_dir_fd=d, dst_dir_fd=d)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=d)
    return "restored"
