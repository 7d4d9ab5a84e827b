"""The lineage of a node's executions: where the earlier tries of its effects live (A4, N4).

A node's context reads it once and hands it down with each effect
(:attr:`charter.attempts.model.Effect.lineage`), so the attempts room checks
an effect against all its earlier tries without reading the plans room's
tables itself.
"""

from __future__ import annotations

from charter.attempts.model import Lineage
from charter.plans import store as plans_store
from charter.storage import Tx


def lineage(tx: Tx, run_id: str, node_id: str, execution: int) -> Lineage:
    """The node executions whose attempts are the same effects as ``execution``'s:
    this one and the earlier ones of the node, then, for a linked run, those of
    the ended run that its first execution continues."""
    out: Lineage = []
    run: str | None = run_id
    top = execution
    while run is not None:
        out.append((run, top))
        link = plans_store.inherited(tx, run, node_id)
        if link is None:
            break
        run, top = link
    return out
