"""The queue of runs that workers carry (K1, K2): when each should next be looked at.

A room of its own beside the runs room: the decisions that wake a run (an
answer, an approval, a settlement) write here in their own transaction, and
workers take from here; the run's epoch and lease, in the runs room, still
decide who may act.
"""
