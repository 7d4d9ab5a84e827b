"""The engine room: orchestration over the rooms below, no SQL of its own (ideally).

:mod:`~charter.engine.engine` is the facade, :mod:`~charter.engine.coordinator`
recovers, reconciles and resumes, :mod:`~charter.engine.executor` runs a
segment of a run.
"""
