"""The audit room (S1): the hash-chained event log, one chain per mission.

:mod:`~charter.audit.chain` verifies the chains and reads their heads.
"""
