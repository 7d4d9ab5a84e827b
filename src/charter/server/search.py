"""The console's search page: runs and attempts by a business key.

The loader reads through :meth:`charter.Engine.search`, one bounded window of
attempts a page (its ``older`` link is the next window), so a search costs the
same whatever the store holds. A page without a text shows the box alone.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from charter.server.wire import PAGE

if TYPE_CHECKING:
    from charter import Engine


def search(engine: Engine, path: Mapping[str, str], query: Mapping[str, str]) -> dict[str, Any]:
    """The matches of ``q`` newest first, each linking to its run; bad text is the
    engine's refusal, shown as one."""
    text = query.get("q", "")
    if not text:
        return {"q": "", "items": [], "next": None, "scanned": 0}
    found = engine.search(text, limit=PAGE, before=query.get("before") or None)
    return {"q": text, **found}
