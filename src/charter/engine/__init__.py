"""The engine room: orchestration over the rooms below, no SQL of its own (ideally).

:mod:`~charter.engine.engine` is the facade, its methods split by concern
(:mod:`~charter.engine.reads`, :mod:`~charter.engine.decisions`,
:mod:`~charter.engine.runs` and the rest, each mixed into ``Engine``);
:mod:`~charter.engine.coordinator` recovers, reconciles and resumes,
:mod:`~charter.engine.executor` runs a segment of a run.
"""
