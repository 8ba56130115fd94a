"""NFS in user space: the libnfs tools (``nfs-ls``, ``nfs-cat``, ``nfs-cp``) against the server.

Used where the kernel has no NFS client, so no mount can be made: the same access, manifest
and speed checks run against the export itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from ._checks import CheckResult
from ._installer import find_binary
from ._manifest import make_manifest
from ._records import PROBE_PREFIX, AccessReport, IoReport, Manifest, MountError

LIBNFS_TOOLS = ("nfs-ls", "nfs-cat", "nfs-cp")
_PROBE_BYTES = 1024


class LibnfsClient:
    """The userspace libnfs tools (``nfs-ls``, ``nfs-cat``, ``nfs-cp``) against one export path."""

    def __init__(self, server: str, path: str, *, version: int = 4, tools: Mapping[str, str] | None = None,
                 timeout: float = 60) -> None:
        self.server, self.path, self.version = server, path.rstrip("/") or "/", version
        self.tools = dict(tools or {t: find_binary(t) or t for t in LIBNFS_TOOLS})
        self.timeout = timeout

    def url(self, relative: str = "") -> str:
        path = f"{self.path}/{relative}".replace("//", "/").rstrip("/") or "/"
        return f"nfs://{self.server}{path}?version={self.version}"

    def _run(self, argv: list[str], *, binary: bool = False) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(argv, capture_output=True, timeout=self.timeout)
        if done.returncode != 0:
            raise MountError(f"{Path(argv[0]).name} {' '.join(argv[1:])}: exit {done.returncode}: "
                             f"{(done.stderr or done.stdout).decode(errors='replace').strip()[-300:]}")
        return done

    def list_files(self) -> dict[str, int]:
        """Relative path -> size of every regular file (``nfs-ls -R``)."""
        out = self._run([self.tools["nfs-ls"], "-R", self.url()]).stdout.decode(errors="replace")
        files = {}
        for line in out.splitlines():
            parts = line.split(None, 5)
            if len(parts) == 6 and parts[0].startswith("-"):
                files[parts[5]] = int(parts[4])
        return files

    def read(self, relative: str) -> bytes:
        return self._run([self.tools["nfs-cat"], self.url(relative)]).stdout

    def write(self, relative: str, data: bytes) -> None:
        with tempfile.NamedTemporaryFile() as tmp:
            tmp.write(data)
            tmp.flush()
            self._run([self.tools["nfs-cp"], tmp.name, self.url(relative)])

    def manifest(self) -> Manifest:
        files = {}
        for rel, size in self.list_files().items():
            if Path(rel).name.startswith(PROBE_PREFIX):
                continue
            data = self.read(rel)
            if len(data) != size:
                raise MountError(f"{rel}: listed as {size} bytes, read {len(data)}")
            files[rel] = (size, hashlib.sha256(data).hexdigest())
        return make_manifest(files)


def _write_probe(client: LibnfsClient, tag: str, errors: list[str]) -> bool:
    # libnfs-utils 4.0's nfs-cp fails NFSv4 writes of more than ~2 KB against nfs-ganesha 4.3,
    # so the write probe is small; write throughput is therefore not measured this way.
    probe = f"{PROBE_PREFIX}{tag}-{os.getpid()}-{time.time_ns()}"
    payload = os.urandom(_PROBE_BYTES)
    try:
        client.write(probe, payload)
        writable = client.read(probe) == payload
        if not writable:
            errors.append("write: read back different bytes")
        return writable
    except MountError as exc:
        errors.append(f"write {client.url(probe)}: {exc}")
        return False


def _speed(client: LibnfsClient, sizes: Mapping[str, int], samples: int) -> tuple[list[float], float | None]:
    """Latencies (ms) of ``samples`` listings, and the read throughput (MB/s) of the largest file."""
    latencies: list[float] = []
    read_mb_s = None
    for _ in range(samples):
        started = time.perf_counter()
        with contextlib.suppress(MountError):
            client.list_files()
            latencies.append((time.perf_counter() - started) * 1000)
    real = {p: s for p, s in sizes.items() if not Path(p).name.startswith(PROBE_PREFIX)}
    if real:
        biggest = max(real, key=lambda p: real[p])
        started = time.perf_counter()
        with contextlib.suppress(MountError):
            got = len(client.read(biggest))
            read_mb_s = got / (time.perf_counter() - started) / 1e6 if got else None
    return latencies, read_mb_s


def libnfs_checks(client: LibnfsClient, *, write: bool, tag: str, samples: int = 5) -> CheckResult:
    """Access, manifest and speed through libnfs (no mount needed)."""
    errors: list[str] = []
    readable = False
    sizes: dict[str, int] = {}
    try:
        sizes = client.list_files()
        readable = True
    except MountError as exc:
        errors.append(f"read {client.url()}: {exc}")
    writable = _write_probe(client, tag, errors) if write else None
    problems = list(errors)
    manifest = None
    if readable:
        try:
            manifest = client.manifest()
        except MountError as exc:
            problems.append(f"manifest: {exc}")
    latencies, read_mb_s = _speed(client, sizes, samples) if readable else ([], None)
    notes = ("latency is one nfs-ls call (process start and NFS session set-up included)",
             "write throughput not measured: only a 1 KiB write probe goes through libnfs")
    io = IoReport(latency_ms=statistics.median(latencies) if latencies else None, write_mb_s=None,
                  read_mb_s=read_mb_s, probe_bytes=_PROBE_BYTES if write else 0, notes=notes)
    return AccessReport(readable=readable, writable=writable, errors=tuple(errors)), manifest, io, problems
