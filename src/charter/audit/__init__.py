"""The audit room (S1): the hash-chained event log, one chain per mission.

:mod:`~charter.audit.chain` verifies the chains; :mod:`~charter.audit.model`
holds a chain's head as recorded; :mod:`~charter.audit.store` reads the events
and heads back (they are written by :meth:`charter.storage.Tx.audit`).
"""
