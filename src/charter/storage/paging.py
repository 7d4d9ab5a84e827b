"""Keyset paging: a listing reads one page in a stable order, bounded in the store.

Listings are ordered by an immutable time column and the row's ID, and a page is
the rows after a *position* — the ``(time, id)`` of the last row seen — at most
``limit`` of them. Unlike ``OFFSET``, a position stays meaningful while rows are
written: paging on sees every row that was there once, in order, and a row added
meanwhile at most once. The store applies the limit, so a page costs memory for
its own rows only, however many the store holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from charter.errors import UsageError

#: Where a page starts: the ``(time_us, id)`` of the last row of the page before.
Position = tuple[int, str]

_INT64 = 2**63 - 1


def page(
    select: str,
    where: Sequence[str],
    params: Sequence[Any],
    *,
    key: str,
    after: Position | None,
    limit: int | None,
) -> tuple[str, list[Any]]:
    """``select`` with its conditions, the position and the limit, ordered by ``key``
    and then ``id``; the statement and its parameters."""
    conditions, args = list(where), list(params)
    if after is not None:
        time_us, row_id = after
        if not isinstance(time_us, int) or not 0 <= time_us <= _INT64 or not row_id:
            raise UsageError(f"a page starts after a (time_us, id) position, got {after!r}")
        conditions.append(f"({key}, id) > (?, ?)")
        args += [time_us, row_id]
    sql = select + (" WHERE " + " AND ".join(conditions) if conditions else "")
    sql += f" ORDER BY {key}, id"
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise UsageError(
                f"a page holds at least one row; limit must be 1 or more, got {limit!r}"
            )
        sql += " LIMIT ?"
        args.append(limit)
    return sql, args
