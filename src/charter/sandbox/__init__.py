"""A payments service to run Charter against: loopback HTTP, its own SQLite file.

Shipped so that adapters, tests and the demo meet a system outside Charter's
process that behaves like a real payments API (idempotency keys, lookups,
fencing tokens) and misbehaves on request. The service itself uses the
standard library only; :func:`declaration` is how Charter's HTTP adapter
talks to it.
"""

from charter.sandbox.client import declaration
from charter.sandbox.server import FAULTS, Sandbox, SandboxError

__all__ = ["FAULTS", "Sandbox", "SandboxError", "declaration"]
