"""A host's preflight checks: the route and interface to the master, TCP to its rendezvous port,
the script and datasets readable, the checkpoint directory writable (blocking; run in a thread)."""

from __future__ import annotations

import fcntl
import os
import socket
import struct
import time
from pathlib import Path

from ._protocol import Preflight, PreflightReport

_SIOCGIFADDR = 0x8915


def route_source(dest: str) -> str:
    """The local address the kernel uses to reach ``dest`` (a UDP connect sends nothing)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((dest, 9))
        return str(probe.getsockname()[0])


def interface_of(address: str) -> str | None:
    """The interface that holds IPv4 ``address``, or None."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), _SIOCGIFADDR, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue
            if socket.inet_ntoa(raw[20:24]) == address:
                return name
    return None


def check_readable(path: str) -> str:
    """'ok' when ``path`` (a file, or a directory and a file in it) can be read, else the error."""
    p = Path(path)
    try:
        if p.is_dir():
            for entry in sorted(p.rglob("*"))[:64]:
                if entry.is_file():
                    with entry.open("rb") as fh:
                        fh.read(4096)
                    return "ok"
            os.listdir(p)
            return "ok"
        with p.open("rb") as fh:
            fh.read(4096)
        return "ok"
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def check_writable(directory: Path) -> str | None:
    """None when a file can be created, written and removed in ``directory`` (made if missing)."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".aitbc-probe-{os.getpid()}-{time.time_ns()}"
        probe.write_bytes(b"x")
        probe.unlink()
        return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def run_preflight(command: Preflight, host: str, *, connect_timeout: float = 3.0) -> PreflightReport:
    problems: list[str] = []
    local_addr = ifname = None
    try:
        local_addr = route_source(command.master_addr)
        ifname = interface_of(local_addr)
    except OSError as exc:
        problems.append(f"no route to the master {command.master_addr}: {exc}")
    reachable, connect_ms = False, None
    started = time.perf_counter()
    try:
        with socket.create_connection((command.master_addr, command.port), timeout=connect_timeout):
            pass
        reachable, connect_ms = True, (time.perf_counter() - started) * 1000
    except OSError as exc:
        problems.append(f"cannot open TCP to the master's rendezvous port {command.master_addr}:{command.port}: {exc}")
    script = check_readable(command.script)
    if script != "ok":
        problems.append(f"script {command.script} unreadable: {script}")
    datasets = {path: check_readable(path) for path in command.datasets}
    problems += [f"dataset {p} unreadable: {why}" for p, why in datasets.items() if why != "ok"]
    writable = None
    if command.checkpoint_dir:
        why = check_writable(Path(command.checkpoint_dir))
        writable = why is None
        if why:
            problems.append(f"checkpoint directory {command.checkpoint_dir} not writable: {why}")
    return PreflightReport(host=host, local_addr=local_addr, ifname=ifname, master_reachable=reachable,
                           connect_ms=connect_ms, script_readable=script == "ok", datasets=datasets,
                           checkpoint_writable=writable, problems=tuple(problems))

