"""A TCP proxy on loopback that holds every byte for a fixed time each way.

The bench's PostgreSQL server runs on this machine, where a round trip costs
a few tens of microseconds; a server on another machine costs far more. To
time the engines as a network would, the PostgreSQL rows are also run through
this proxy: each chunk read from one side is written to the other once
``delay`` has passed since it was read, in order. Threads and ``time.sleep``
(not an event loop, whose timers are rounded to milliseconds) keep the delay
close to what is asked.

Run as a process of its own (``python bench/latency.py PORT DELAY_US``): it
prints the port it listens on, then serves until it is killed, so its work
never takes the measured process's interpreter lock.
"""

from __future__ import annotations

import contextlib
import queue
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path


def _pump(src: socket.socket, dst: socket.socket, delay_s: float) -> None:
    """Forward ``src`` to ``dst``, each chunk ``delay_s`` after it arrived."""
    held: queue.SimpleQueue[tuple[float, bytes]] = queue.SimpleQueue()

    def write() -> None:
        while True:
            due, data = held.get()
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            if not data:
                dst.shutdown(socket.SHUT_WR)
                return
            dst.sendall(data)

    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        while data := src.recv(1 << 16):
            held.put((time.perf_counter() + delay_s, data))
    except OSError:
        pass
    held.put((time.perf_counter() + delay_s, b""))
    writer.join()


def _serve(client: socket.socket, upstream: tuple[str, int], delay_s: float) -> None:
    server = socket.create_connection(upstream)
    for s in (client, server):
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    there = threading.Thread(target=_pump, args=(client, server, delay_s), daemon=True)
    there.start()
    _pump(server, client, delay_s)
    there.join()
    client.close()
    server.close()


def main() -> None:
    port, delay_us = int(sys.argv[1]), int(sys.argv[2])
    listener = socket.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    print(listener.getsockname()[1], flush=True)
    while True:
        client, _ = listener.accept()
        threading.Thread(
            target=_serve, args=(client, ("127.0.0.1", port), delay_us / 1e6), daemon=True
        ).start()


@contextlib.contextmanager
def proxy(port: int, delay_us: int) -> Iterator[int]:
    """A proxy process in front of ``127.0.0.1:port``; yields the port it listens on."""
    proc = subprocess.Popen(
        [sys.executable, str(Path(__file__)), str(port), str(delay_us)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        yield int(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait()


def round_trips(url: str, n: int) -> list[float]:
    """Seconds per ``SELECT 1`` answered on one connection to ``url``, ``n`` times."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        times = []
        for _ in range(n):
            start = time.perf_counter()
            conn.execute("SELECT 1").fetchone()
            times.append(time.perf_counter() - start)
    return times


if __name__ == "__main__":
    main()
