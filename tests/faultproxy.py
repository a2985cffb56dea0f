"""A loopback TCP proxy to a PostgreSQL server's Unix socket that breaks a connection on cue.

For the healing tests: a client connects to `127.0.0.1:port` (and only
there; the proxy listens on no other address), and every connection is
relayed byte for byte to the server's Unix socket. Armed, the proxy breaks
the next connection whose client sends a chosen marker (a parameter value
such as a transaction id), in one of two ways:

- `drop_reply(marker)`: the request reaches the server; the server's whole
  answer, up to and including its ReadyForQuery (sent after the implicit
  commit), is held back and both ends are closed. The statement ran and
  committed, and the client never hears so.
- `drop_request(marker)`: the request is not forwarded; both ends are
  closed. The server never saw it.

Clients must not ask for SSL or GSS encryption (`sslmode=disable
gssencmode=disable`, as `dsn()` writes), so that everything the server
sends is plain protocol messages, a type byte and a length each. Every
socket is closed by `close()`, which waits at most a few seconds for the
relay threads.
"""

from __future__ import annotations

import contextlib
import socket
import threading
from pathlib import Path
from types import TracebackType
from typing import Literal

from psycopg import conninfo

__all__ = ["FaultProxy"]

_CHUNK = 65536
_TAIL = 1024  # markers are shorter: one split across two chunks is still seen
_JOIN_TIMEOUT_S = 5.0
_READY_FOR_QUERY = ord("Z")  # the server is done with a request, commit included

Mode = Literal["reply", "request"]


class _Link:
    """One relayed connection: the client's socket, the server's, and whether to hold replies."""

    def __init__(self, client: socket.socket, server: socket.socket) -> None:
        self.client = client
        self.server = server
        self.holding = False
        self._closed = False
        self._lock = threading.Lock()

    def cut(self) -> None:
        """Close both ends at once (harmless twice)."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


class FaultProxy:
    """Relays 127.0.0.1:`port` to the server socket `target`; breaks connections when armed."""

    def __init__(self, target: Path) -> None:
        self.target = target
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.1)
        self.port: int = self._listener.getsockname()[1]
        self._lock = threading.Lock()
        self._mode: Mode | None = None
        self._marker = b""
        self._times = 0
        self._fired = 0
        self._links: list[_Link] = []
        self._threads: list[threading.Thread] = []
        self._closing = threading.Event()
        self._accepting = threading.Thread(target=self._accept, name="faultproxy-accept")
        self._accepting.start()

    def dsn(self, dbname: str, user: str = "postgres") -> str:
        """A connection string reaching database `dbname` through the proxy."""
        return conninfo.make_conninfo(
            host="127.0.0.1",
            port=str(self.port),
            user=user,
            dbname=dbname,
            sslmode="disable",
            gssencmode="disable",
        )

    def drop_reply(self, marker: bytes, times: int = 1) -> None:
        """Arm: the next `times` connections sending `marker` lose the server's answer to it."""
        self._arm("reply", marker, times)

    def drop_request(self, marker: bytes, times: int = 1) -> None:
        """Arm: the next `times` requests holding `marker` are not forwarded; they are cut."""
        self._arm("request", marker, times)

    def _arm(self, mode: Mode, marker: bytes, times: int) -> None:
        if not marker or times < 1:
            raise ValueError("a marker and at least one time are needed")
        with self._lock:
            self._mode, self._marker, self._times, self._fired = mode, marker, times, 0

    @property
    def fired(self) -> int:
        """How many connections the armed fault has broken since it was armed."""
        with self._lock:
            return self._fired

    def _trigger(self, tail: bytes, chunk: bytes) -> Mode | None:
        """The armed mode if `chunk` holds the marker, or ends it after `tail` (a firing)."""
        with self._lock:
            if self._mode is None:
                return None
            start = max(0, len(tail) - len(self._marker) + 1)
            if (tail + chunk).find(self._marker, start) < 0:
                return None
            mode = self._mode
            self._fired += 1
            self._times -= 1
            if self._times == 0:
                self._mode = None
            return mode

    def _accept(self) -> None:
        while not self._closing.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # the listener was closed
            client.settimeout(None)
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(str(self.target))
            except OSError:
                server.close()
                client.close()
                continue
            link = _Link(client, server)
            threads = [
                threading.Thread(target=self._upstream, args=(link,), name="faultproxy-up"),
                threading.Thread(target=self._downstream, args=(link,), name="faultproxy-down"),
            ]
            with self._lock:
                self._links.append(link)
                self._threads += threads
            for thread in threads:
                thread.start()

    def _upstream(self, link: _Link) -> None:
        """Client to server, watching for the marker (also across two chunks)."""
        tail = b""
        try:
            while chunk := link.client.recv(_CHUNK):
                mode = self._trigger(tail, chunk)
                tail = (tail + chunk)[-_TAIL:]
                if mode == "request":
                    link.cut()
                    return
                if mode == "reply":
                    link.holding = True  # before the server can have answered
                link.server.sendall(chunk)
        except OSError:
            pass  # the link was cut
        link.cut()

    def _downstream(self, link: _Link) -> None:
        """Server to client, a whole message at a time, so that a reply can be held back."""
        pending = b""
        try:
            while chunk := link.server.recv(_CHUNK):
                pending += chunk
                out = bytearray()
                while len(pending) >= 5:
                    end = 1 + int.from_bytes(pending[1:5], "big")
                    if len(pending) < end:
                        break
                    message, pending = pending[:end], pending[end:]
                    if not link.holding:
                        out += message
                    elif message[0] == _READY_FOR_QUERY:
                        link.cut()  # the answer, commit included, dies here
                        return
                if out:
                    link.client.sendall(out)
        except OSError:
            pass
        link.cut()

    def close(self) -> None:
        """Stop listening, cut every connection, and wait (boundedly) for the relay threads."""
        self._closing.set()
        self._listener.close()
        self._accepting.join(_JOIN_TIMEOUT_S)
        with self._lock:
            links, threads = list(self._links), list(self._threads)
        for link in links:
            link.cut()
        for thread in threads:
            thread.join(_JOIN_TIMEOUT_S)

    def __enter__(self) -> FaultProxy:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
