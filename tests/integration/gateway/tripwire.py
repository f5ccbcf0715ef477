"""A TCP relay in front of a worker that acts once the gateway sends it given bytes: the way the tests kill
a worker at a known point of its work (mid-batch, mid-probe) instead of at a time that may fall between
batches. It relays bytes unchanged; the gateway, the worker and the kill are the real ones."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Callable, Iterator


class Tripwire:
    """Relays 127.0.0.1:``port`` → 127.0.0.1:``target``. Once :meth:`arm` is called, the first gateway→worker
    chunk whose stream contains ``marker`` is passed on and then ``action`` runs, once; ``fired`` says
    whether it has."""

    def __init__(self, target: int, marker: bytes, action: Callable[[], None]) -> None:
        self.target, self.marker, self.action = target, marker, action
        self._armed = threading.Event()
        self._fired = threading.Event()
        self._closed = threading.Event()
        self._fire_lock = threading.Lock()
        self._sockets: list[socket.socket] = []
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._listener.settimeout(0.2)  # so the accept loop sees close() promptly
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._accept, name="tripwire", daemon=True)
        self._thread.start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def fired(self) -> bool:
        return self._fired.is_set()

    def arm(self) -> None:
        self._armed.set()

    def close(self) -> None:
        self._closed.set()
        self._thread.join(5)
        self._listener.close()
        for s in list(self._sockets):
            _drop(s)

    def _accept(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                upstream = socket.create_connection(("127.0.0.1", self.target), timeout=5)
                upstream.settimeout(None)
            except OSError:  # the worker is gone: the gateway sees its connection closed
                _drop(client)
                continue
            self._sockets += [client, upstream]
            for src, dst, watch in ((client, upstream, True), (upstream, client, False)):
                threading.Thread(target=self._pump, args=(src, dst, watch), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, watch: bool) -> None:
        tail = b""  # the marker may straddle two chunks
        try:
            while data := src.recv(65536):
                dst.sendall(data)
                if watch and self._armed.is_set() and self.marker in tail + data:
                    self._fire()
                tail = data[-len(self.marker) :]
        except OSError:
            pass
        finally:  # one side ended: end the other, as the worker's own close would
            _drop(src)
            _drop(dst)

    def _fire(self) -> None:
        with self._fire_lock:
            if not self._fired.is_set():
                self.action()
                self._fired.set()


def _drop(s: socket.socket) -> None:
    with contextlib.suppress(OSError):
        s.shutdown(socket.SHUT_RDWR)  # wakes a thread blocked in recv on it
    s.close()


@contextlib.contextmanager
def tripwire(target_url: str, marker: bytes, action: Callable[[], None]) -> Iterator[Tripwire]:
    port = int(target_url.rsplit(":", 1)[1])
    wire = Tripwire(port, marker, action)
    try:
        yield wire
    finally:
        wire.close()
