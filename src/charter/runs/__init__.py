"""The runs room (F1, F2, N4): run records, and ownership, the one place fencing lives.

:mod:`~charter.runs.model` holds a run's record and statuses (plain data);
:mod:`~charter.runs.run` says what loading a run and changing its status mean;
:mod:`~charter.runs.ownership` is the segment that owns a run: its epoch,
lease and deadlines; :mod:`~charter.runs.store` owns the ``runs`` and
``segments`` tables.
"""
