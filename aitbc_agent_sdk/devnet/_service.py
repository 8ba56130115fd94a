"""Starting and stopping the devnet's server processes.

Servers run detached (their own session and process group), so a devnet outlives
the command that started it; a ``ServiceProcess`` record (pid, port, log) is what
``devnet down`` and the tests use to stop them again.
"""

from __future__ import annotations

import asyncio
import ipaddress
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from ..errors import AitbcError
from ..profile import LOCALHOST, ServiceProcess, pid_alive  # noqa: F401 - these live with the profile that stores them


class ServiceError(AitbcError):
    """A devnet server could not be found, started or reached."""


def check_bind_host(host: str) -> str:
    """``host`` if it is one IPv4 address a devnet server may bind to; never a wildcard.

    The devnet's chain runs with publicly known keys, so 0.0.0.0 (every interface) is refused,
    as are names (a hostname may resolve anywhere) and broadcast or multicast addresses.
    """
    try:
        address = ipaddress.IPv4Address(host)
    except ValueError:
        raise ServiceError(f"bind address {host!r} must be an IPv4 address such as 127.0.0.1") from None
    if address.is_unspecified or address.is_multicast or address == ipaddress.IPv4Address("255.255.255.255"):
        raise ServiceError(f"refusing to bind devnet servers to {host}: give one local address, e.g. 127.0.0.1")
    return str(address)


def free_port(host: str = LOCALHOST) -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def spawn(name: str, argv: Sequence[str], *, port: int, log: Path, host: str = LOCALHOST,
          env: Mapping[str, str] | None = None, cwd: Path | None = None,
          stdin_data: bytes | None = None) -> ServiceProcess:
    """Start ``argv`` detached, stdout and stderr to ``log``; ``stdin_data`` (a secret, say) goes to its stdin."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        try:
            proc = subprocess.Popen(list(argv), stdout=out, stderr=subprocess.STDOUT,
                                    stdin=subprocess.PIPE if stdin_data is not None else subprocess.DEVNULL,
                                    env=dict(env) if env is not None else None, cwd=cwd, start_new_session=True)
        except OSError as exc:
            raise ServiceError(f"cannot start {name} ({argv[0]}): {exc}") from exc
    if stdin_data is not None:
        assert proc.stdin is not None
        proc.stdin.write(stdin_data)
        proc.stdin.close()
    return ServiceProcess(name=name, pid=proc.pid, host=host, port=port, log=log)


async def wait_for_port(service: ServiceProcess, timeout: float = 30.0) -> None:
    """Wait until the service accepts TCP connections; fail early if it died."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not service.alive():
            raise ServiceError(f"{service.name} exited during start-up; last log lines:\n{tail(service.log)}")
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(service.host, service.port), 1.0)
        except (OSError, TimeoutError):
            await asyncio.sleep(0.1)
            continue
        writer.close()
        await writer.wait_closed()
        return
    raise ServiceError(f"{service.name} did not listen on {service.host}:{service.port} within {timeout:.0f}s;"
                       f" last log lines:\n{tail(service.log)}")


def stop(service: ServiceProcess, timeout: float = 10.0) -> None:
    """SIGTERM the service's process group, SIGKILL what is left after ``timeout``."""
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(service.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            _reap(service.pid)
            if not pid_alive(service.pid):
                return
            time.sleep(0.05)


def _reap(pid: int) -> None:
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass


def tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"
