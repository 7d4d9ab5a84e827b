"""Escrow (L10): slices of a mission's allowance that workers lease and admit
against without the mission's gate.

:mod:`~charter.ledger.escrow.slices` leases, returns and sweeps slices and
checks their books; :mod:`~charter.ledger.escrow.store` owns their tables.
How a worker uses one: :mod:`charter.workers.escrow` and ``docs/escrow.md``.
"""
