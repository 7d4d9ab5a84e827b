"""A TCP relay on loopback that a test can cut and mend: a store made unreachable.

``Cut(host, port)`` listens on a port of its own and relays every connection to
``host:port`` (a PostgreSQL server). ``cut()`` ends every relayed connection at
once and from then on closes each new one as soon as it is accepted, counting
them: what a worker whose database went away sees (a lost connection, then
every try refused), and how many times it tried. ``mend()`` relays again.
"""

from __future__ import annotations

import contextlib
import socket
import threading


class Cut:
    """A relay to ``host:port`` (see the module)."""

    def __init__(self, host: str, port: int) -> None:
        self.target = (host, port)
        self._server = socket.create_server(("127.0.0.1", 0))
        self.port = int(self._server.getsockname()[1])
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        #: Connections tried while the relay was cut.
        self.refused = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self._server.accept()
            except OSError:
                return  # closed
            with self._lock:
                if self._cut:
                    self.refused += 1
                    conn.close()
                    continue
            try:
                upstream = socket.create_connection(self.target, timeout=10)
            except OSError:
                conn.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                self._open += [conn, upstream]
            for a, b in ((conn, upstream), (upstream, conn)):
                threading.Thread(target=_pump, args=(a, b), daemon=True).start()

    def cut(self) -> None:
        """End every relayed connection; refuse every new one until :meth:`mend`."""
        with self._lock:
            self._cut, self.refused = True, 0
            ending, self._open = self._open, []
        for s in ending:
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()

    def mend(self) -> None:
        with self._lock:
            self._cut = False

    def close(self) -> None:
        self.cut()
        self._server.close()


def _pump(source: socket.socket, sink: socket.socket) -> None:
    """Copy ``source`` to ``sink`` until either ends; then end both."""
    try:
        while data := source.recv(65536):
            sink.sendall(data)
    except OSError:
        pass
    for s in (source, sink):
        with contextlib.suppress(OSError):
            s.shutdown(socket.SHUT_RDWR)
