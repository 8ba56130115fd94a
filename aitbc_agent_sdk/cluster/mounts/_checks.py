"""The checks every mounted (or fetched) dataset goes through: access, hash manifest and speed."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import statistics
import time
from pathlib import Path

from ._manifest import make_manifest
from ._records import PROBE_PREFIX, AccessReport, IoReport, Manifest, MountCommand

CheckResult = tuple[AccessReport, Manifest | None, IoReport, list[str]]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def hash_manifest(root: Path) -> Manifest:
    """The manifest of every regular file under ``root`` (probe files skipped)."""
    files: dict[str, tuple[int, str]] = {}
    for directory, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            if name.startswith(PROBE_PREFIX):
                continue
            path = Path(directory) / name
            if path.is_file():
                files[path.relative_to(root).as_posix()] = (path.stat().st_size, _sha256_file(path))
    return make_manifest(files)


def check_access(root: Path, *, write: bool, tag: str) -> AccessReport:
    """Read: list ``root`` and read one file. Write: a probe file created, read back, compared, removed."""
    errors: list[str] = []
    readable = False
    try:
        entries = sorted(root.iterdir())
        for entry in entries:
            if entry.is_file() and not entry.name.startswith(PROBE_PREFIX):
                with entry.open("rb") as fh:
                    fh.read(4096)
                break
        readable = True
    except OSError as exc:
        errors.append(f"read {root}: {exc}")
    writable = None
    if write:
        probe = root / f"{PROBE_PREFIX}{tag}-{os.getpid()}-{time.time_ns()}"
        payload = os.urandom(1024)
        try:
            with probe.open("wb") as fh:
                fh.write(payload)
                fh.flush()
                os.fsync(fh.fileno())
            writable = probe.read_bytes() == payload
            if not writable:
                errors.append(f"write {root}: read back different bytes")
        except OSError as exc:
            writable = False
            errors.append(f"write {root}: {exc}")
        finally:
            with contextlib.suppress(OSError):
                probe.unlink()
    return AccessReport(readable=readable, writable=writable, errors=tuple(errors))


def _write_probe(probe: Path, size: int) -> float:
    """Write ``size`` random bytes to ``probe`` (fsync'd); the throughput in MB/s."""
    block = os.urandom(min(size, 1 << 20))
    started = time.perf_counter()
    with probe.open("wb") as fh:
        left = size
        while left > 0:
            left -= fh.write(block[:left])
        fh.flush()
        os.fsync(fh.fileno())
    return size / (time.perf_counter() - started) / 1e6


def _read_throughput(target: Path) -> float | None:
    """MB/s of reading the whole of ``target``; None for an empty file."""
    started = time.perf_counter()
    with target.open("rb") as fh:
        got = sum(len(c) for c in iter(lambda: fh.read(1 << 20), b""))
    elapsed = time.perf_counter() - started
    return got / elapsed / 1e6 if got else None


def _read_latencies(target: Path, samples: int, into: list[float]) -> None:
    """Milliseconds of ``samples`` open+small-read calls, appended to ``into`` as they are taken."""
    for _ in range(samples):
        started = time.perf_counter()
        with target.open("rb") as fh:
            fh.read(512)
        into.append((time.perf_counter() - started) * 1000)


def measure_io(root: Path, *, size: int, write: bool, tag: str, samples: int = 15) -> IoReport:
    """Latency: median of open+read of a small file. Throughput: a ``size``-byte probe written
    (fsync'd) and read back. Without ``write`` the largest existing file is read instead."""
    notes: list[str] = []
    latencies: list[float] = []
    write_mb_s = read_mb_s = None
    probe = root / f"{PROBE_PREFIX}{tag}-io-{os.getpid()}-{time.time_ns()}"
    try:
        if write and size:
            write_mb_s = _write_probe(probe, size)
            target: Path | None = probe
        else:
            files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(PROBE_PREFIX)]
            target = max(files, key=lambda p: p.stat().st_size) if files else None
            if not write:
                notes.append("write throughput not measured (read-only check)")
        if target is not None:
            read_mb_s = _read_throughput(target)
            notes.append("read-back may be served from a local cache")
            _read_latencies(target, samples, latencies)
    except OSError as exc:
        notes.append(f"measurement failed: {exc}")
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return IoReport(latency_ms=statistics.median(latencies) if latencies else None, write_mb_s=write_mb_s,
                    read_mb_s=read_mb_s, probe_bytes=size if write else 0, notes=tuple(notes))


async def check_mounted(root: Path, command: MountCommand, host: str, *, write: bool) -> CheckResult:
    """Every check of a dataset visible at ``root``, off the event loop; problems collected."""
    problems: list[str] = []
    access = await asyncio.to_thread(check_access, root, write=write, tag=host)
    problems += list(access.errors)
    manifest = None
    if access.readable:
        try:
            manifest = await asyncio.to_thread(hash_manifest, root)
        except OSError as exc:
            problems.append(f"manifest of {root}: {exc}")
    io = await asyncio.to_thread(measure_io, root, size=command.measure_bytes, write=write and bool(access.writable),
                                 tag=host)
    return access, manifest, io, problems
