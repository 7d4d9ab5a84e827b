"""The plans room (N1, A6): nodes, their journaled context, and the runner.

:mod:`~charter.plans.nodes` defines nodes, plans and the :class:`Context`;
:mod:`~charter.plans.runner` runs a plan; :mod:`~charter.plans.journal` holds
the records of what the nodes recorded; :mod:`~charter.plans.store` owns the
``node_executions`` and ``journal`` tables; :mod:`~charter.plans.lineage` walks
a node's executions, across the runs it continues, for where an effect was
tried before (A4, N4), and the context hands that down with each effect.
"""
