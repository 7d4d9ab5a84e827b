"""Clocks for the tests of the last check before a send (F3)."""

from __future__ import annotations

from charter.testing import ManualClock


class Stalls(ManualClock):
    """A clock that passes the send deadline once the adapter has made its own
    checks (``checks`` readings of the monotonic clock): as if the process were
    paused between them and the socket, while its connection was taken."""

    def __init__(self, checks: int) -> None:
        super().__init__()
        self.checks = checks

    def monotonic_us(self) -> int:
        self.checks -= 1
        if self.checks < 0:
            self.advance(60)
        return super().monotonic_us()
