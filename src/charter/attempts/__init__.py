"""The attempts room (A1-A9): one try at one effect, from admission to settlement.

:mod:`~charter.attempts.model` holds the records (an attempt, its status, its
effect), :mod:`~charter.attempts.calls` checks a request,
:mod:`~charter.attempts.admission` admits it against the allowance,
:mod:`~charter.attempts.dispatch` is the one send path (live and replay),
:mod:`~charter.attempts.evidence` the one evidence format, and
:mod:`~charter.attempts.settlement` settles what was learnt.
:mod:`~charter.attempts.store` owns the ``attempts`` and ``evidence`` tables:
every statement on them is there. Where an effect was tried before is
handed down with it (``Effect.lineage``), read by the plans room.
"""
