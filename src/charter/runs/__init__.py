"""The runs room (F1, F2, N4): run records, and ownership, the one place fencing lives.

:mod:`~charter.runs.run` holds a run's record and status changes;
:mod:`~charter.runs.ownership` is the segment that owns a run: its epoch,
lease and deadlines.
"""
