"""The master's rendezvous port, reserved between preflight and launch: bound on the host's address
and held, accepting the other hosts' preflight probes, until torchrun's c10d store binds it."""

from __future__ import annotations

import asyncio
import contextlib
import socket


class PortReservations:
    """The ports this host holds, one per job id."""

    def __init__(self) -> None:
        self._held: dict[str, tuple[socket.socket, asyncio.Task[None]]] = {}

    def reserve(self, job_id: str, address: str, port: int) -> int:
        """Bind ``address:port`` (0: any free port) for ``job_id``; the port bound. Raises OSError."""
        self.release(job_id)
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, port))
            sock.listen(64)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._held[job_id] = (sock, asyncio.create_task(_accept_probes(sock)))
        return int(sock.getsockname()[1])

    def release(self, job_id: str) -> None:
        held = self._held.pop(job_id, None)
        if held is not None:
            held[1].cancel()
            held[0].close()

    def release_all(self) -> None:
        for job_id in list(self._held):
            self.release(job_id)


async def _accept_probes(sock: socket.socket) -> None:
    """Accept preflight connections; the prober closes first, so no TIME_WAIT holds the port here."""
    loop = asyncio.get_running_loop()

    async def drain(conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, TimeoutError):
            conn.setblocking(False)
            async with asyncio.timeout(10):
                while await loop.sock_recv(conn, 1024):
                    pass

    pending: set[asyncio.Task[None]] = set()
    try:
        while True:
            conn, _ = await loop.sock_accept(sock)
            task = asyncio.create_task(drain(conn))
            pending.add(task)
            task.add_done_callback(pending.discard)
    finally:
        for task in pending:
            task.cancel()
