"""The plans room (N1, A6): nodes, their journaled context, and the runner.

:mod:`~charter.plans.nodes` defines nodes, plans and the :class:`Context`;
:mod:`~charter.plans.runner` runs a plan; :mod:`~charter.plans.journal` reads
what the nodes recorded.
"""
