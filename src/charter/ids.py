"""Identifiers from a seeded random source, so tests can replay them.

IDs are ``<prefix>_<26 base32 chars>``: 48 bits of milliseconds then 80 random
bits, so they sort by creation time (useful in listings) and never collide in
practice across processes.
"""

from __future__ import annotations

import random
import secrets

from charter.clock import Clock

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
