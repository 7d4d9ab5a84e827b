"""Identifiers: those Charter makes, and what any identifier must be (A10).

IDs are ``<prefix>_<26 base32 chars>``: 48 bits of milliseconds then 80 random
bits, so they sort by creation time (useful in listings) and never collide in
practice across processes. They come from a seeded random source, so tests can
replay them.

Identifiers a caller gives (an effect key, a segment, a run, a principal) and
text kept as given are stored as given or refused, the same on every store:
PostgreSQL holds no NUL in text (it would cut ``inv\0A`` and ``inv\0B`` to one
``inv``), and a lone surrogate is not Unicode, so no store keeps it and no
adapter can encode it. :func:`check_text` refuses both with a typed error.
"""

from __future__ import annotations

import random
import secrets

from charter.clock import Clock
from charter.errors import TextRefused

_ALPHABET = "0123456789abcdefghjkmnpqrstvwxyz"
#: Every two characters, by the 10 bits they spell: an ID is 13 look-ups, not 26.
_PAIRS = [a + b for a in _ALPHABET for b in _ALPHABET]
_SHIFTS = range(120, -1, -10)


class IdFactory:
    """Makes IDs from a clock and a random source (both injectable)."""

    def __init__(self, clock: Clock, rng: random.Random | None = None) -> None:
        self._clock = clock
        self._rng = rng

    def _bits(self, n: int) -> int:
        if self._rng is None:
            return secrets.randbits(n)
        return self._rng.getrandbits(n)

    def new(self, prefix: str) -> str:
        value = ((self._clock.now_us() // 1000) << 80) | self._bits(80)
        # 26 characters of 5 bits, the most significant first (the top 2 bits are 0).
        return f"{prefix}_{''.join([_PAIRS[(value >> s) & 1023] for s in _SHIFTS])}"

    def token(self, nbytes: int = 32) -> str:
        """A random secret (credentials); always from the OS source."""
        return secrets.token_urlsafe(nbytes)


def problem(text: str) -> tuple[str, int] | None:
    """What keeps ``text`` from being stored as given: ``("nul", position)`` or
    ``("surrogate", position)``, whichever comes first; ``None`` when nothing does."""
    nul = text.find("\0")
    if text.isascii():
        return None if nul < 0 else ("nul", nul)
    try:
        text.encode()
    except UnicodeEncodeError as exc:
        if nul < 0 or exc.start < nul:
            return ("surrogate", exc.start)
    return None if nul < 0 else ("nul", nul)


def refusal(field: str, text: str, found: tuple[str, int]) -> TextRefused:
    """The error for ``text`` (named ``field``) holding what :func:`problem` found."""
    kind, position = found
    what = (
        "a NUL character (U+0000) at position {}: PostgreSQL holds no NUL in text, and "
        "text is stored as given on every store or refused"
        if kind == "nul"
        else "a lone surrogate (U+{:04X}) at position {}: it is not Unicode text, so no "
        "store keeps it and no adapter can send it"
    )
    shown = text if len(text) <= 80 else text[:77] + "..."
    where = [position] if kind == "nul" else [ord(text[position]), position]
    return TextRefused(
        f"{field} ({shown!r}) holds {what.format(*where)}. Nothing was written; give it "
        "without that character",
        field=field,
        problem=kind,
        position=position,
    )


def check_text(field: str, text: object) -> None:
    """Refuse ``text`` (named ``field``) when a store could not keep it as given (A10).

    Anything but a string passes: its own checks say what it must be.
    """
    if isinstance(text, str):
        found = problem(text)
        if found is not None:
            raise refusal(field, text, found)
