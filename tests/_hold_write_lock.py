"""A child process for the store tests: holds a SQLite store's write lock.

Run as ``python _hold_write_lock.py STORE SECONDS``. It takes the write lock
with ``BEGIN IMMEDIATE``, prints ``locked``, and keeps the lock until a line
(or end of file) arrives on stdin or ``SECONDS`` pass; then it rolls back and
prints ``released``.
"""

from __future__ import annotations

import select
import sqlite3
import sys


def main(store: str, seconds: float) -> None:
    con = sqlite3.connect(store, isolation_level=None)
    try:
        con.execute("BEGIN IMMEDIATE")
        print("locked", flush=True)
        select.select([sys.stdin], [], [], seconds)
        con.execute("ROLLBACK")
        print("released", flush=True)
    finally:
        con.close()


if __name__ == "__main__":
    main(sys.argv[1], float(sys.argv[2]))
