"""The recovery room (R1-R9): the takeover after a crash and the state it reports.

:mod:`~charter.recovery.takeover` fences and takes a run over;
:mod:`~charter.recovery.state` builds what ``recover`` returns.
"""
