"""The plans room (N1, A6): nodes, their journaled context, and the runner.

:mod:`~charter.plans.nodes` defines nodes, plans and the :class:`Context`;
:mod:`~charter.plans.runner` runs a plan; :mod:`~charter.plans.journal` holds
the records of what the nodes recorded; :mod:`~charter.plans.store` owns the
``node_executions`` and ``journal`` tables. The store and those records sit on
the attempts room's floor, which walks an effect's lineage through them (N4).
"""
