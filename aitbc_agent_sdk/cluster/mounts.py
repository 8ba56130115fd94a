"""Shared datasets on every host: NFS, S3 (s3fs) or IPFS, each checked the same way.

Each host's agent (:mod:`.agent`) runs :func:`perform_mount` for a :class:`MountCommand` from the
coordinator and answers a :class:`MountReport`; the coordinator compares the hosts' reports
with :func:`summarize_mounts`. On every host the checks are:

* **client**: the mount tool is installed with apt-get when missing (``s3fs``; ``nfs-common``
  for a kernel NFS mount; ``libnfs-utils`` for the userspace NFS client); an offline or failed
  install is reported, not hidden;
* **access**: read (list, read a file) and write (create, write, read back, compare, remove a
  probe file named ``.aitbc-probe-*``, which manifests skip);
* **content**: a hash manifest (relative path, size, sha256 of every file) whose digest the
  coordinator compares across hosts, naming each host's missing, extra and changed files;
* **speed**: latency (median of small reads) and write/read throughput of a probe file.

How each source is reached:

* **s3**: ``s3fs BUCKET MOUNTPOINT -f -o url=ENDPOINT -o use_path_request_style``, run as the
  agent's child (so the agent owns and unmounts it); credentials come from a file on the host
  (``MountSettings.s3_credentials_file`` or s3fs's own defaults), never over the bus.
* **nfs**: a kernel mount (``mount -t nfs``) where the kernel has an NFS client. Where it has
  none, no mount can be made: the report says so (``mounted=False``) and the same access,
  manifest and speed checks run through the userspace libnfs tools (``nfs-ls``, ``nfs-cat``,
  ``nfs-cp``) against the server instead.
* **ipfs**: the CID is fetched through a Kubo RPC API with every block checked against its
  hash (:class:`~aitbc_agent_sdk.storage.kubo.KuboContentStore`) into ``MOUNTPOINT/CID``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator

PROBE_PREFIX = ".aitbc-probe-"
MountSource = Literal["nfs", "s3", "ipfs"]
# binary -> Debian package that provides it
CLIENT_PACKAGES = {"s3fs": "s3fs", "mount.nfs": "nfs-common", "nfs-cp": "libnfs-utils"}
_MOUNT_WAIT_S = 30.0


class MountError(Exception):
    """Raised inside this module only; every public function turns it into a report problem."""


class MountSettings(BaseModel):
    """Host-side settings of the agent (nothing here travels over the bus)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    s3_credentials_file: Path | None = Field(default=None, description="s3fs passwd file ACCESS:SECRET (mode 600)")
    ipfs_api: str | None = Field(default=None, description="Kubo RPC API URL used when the command names none")
    install_missing: bool = True
    apt_get: tuple[str, ...] = ("apt-get",)


class MountCommand(BaseModel):
    """To every host: make ``source`` available at ``mountpoint`` and check it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["mount"] = "mount"
    source: MountSource
    target: str = Field(description="nfs: SERVER:/export[/path]; s3: BUCKET; ipfs: CID")
    endpoint: str | None = Field(default=None, description="s3: the S3 endpoint URL; ipfs: the Kubo API URL")
    mountpoint: str
    nfs_version: Literal[3, 4] = 4
    check_write: bool = True
    measure_bytes: int = Field(default=4 << 20, ge=0, le=1 << 30)

    @field_validator("mountpoint")
    @classmethod
    def _absolute(cls, value: str) -> str:
        if not Path(value).is_absolute():
            raise ValueError(f"mountpoint must be an absolute path, got {value!r}")
        return value

    @field_validator("target")
    @classmethod
    def _target(cls, value: str) -> str:
        if not value or any(c in value for c in "\0\n"):
            raise ValueError("target must be a non-empty single line")
        return value


class Manifest(BaseModel):
    """Every file under a root: relative path -> (size, sha256); ``digest`` summarises it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    files: dict[str, tuple[int, str]]
    digest: str
    bytes_total: int
    count: int


class AccessReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    readable: bool
    writable: bool | None = Field(description="None: not checked")
    errors: tuple[str, ...] = ()


class IoReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    latency_ms: float | None = Field(description="median of small operations")
    write_mb_s: float | None
    read_mb_s: float | None
    probe_bytes: int
    notes: tuple[str, ...] = ()


class MountReport(BaseModel):
    # ``ok`` is computed: it appears in JSON and is ignored when read back.
    model_config = ConfigDict(extra="ignore", frozen=True)

    host: str
    source: MountSource
    target: str
    mountpoint: str
    mounted: bool
    method: str = Field(description="kernel-nfs, libnfs-userspace, s3fs-fuse, ipfs-fetch")
    installed: tuple[str, ...] = Field(default=(), description="packages installed by this request")
    access: AccessReport | None = None
    manifest: Manifest | None = None
    io: IoReport | None = None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @computed_field  # type: ignore[prop-decorator]
    @property
    def ok(self) -> bool:
        return not self.problems


class ManifestComparison(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    ok: bool
    digest: str | None = Field(description="the digest most hosts have")
    agreeing: tuple[str, ...]
    differences: dict[str, dict[str, list[str]]] = Field(default_factory=dict)


class ClusterMountReport(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    source: MountSource
    target: str
    mountpoint: str
    hosts: dict[str, MountReport]
    errors: dict[str, str] = Field(default_factory=dict, description="hosts that sent no report, and why")
    comparison: ManifestComparison
    ok: bool
    not_exercised: tuple[str, ...] = ()


# --- pure checks ------------------------------------------------------------------------------

def manifest_digest(files: Mapping[str, tuple[int, str]]) -> str:
    lines = "".join(f"{path}\0{size}\0{sha}\n" for path, (size, sha) in sorted(files.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def make_manifest(files: Mapping[str, tuple[int, str]]) -> Manifest:
    return Manifest(files=dict(files), digest=manifest_digest(files), bytes_total=sum(s for s, _ in files.values()),
                    count=len(files))


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


def compare_manifests(manifests: Mapping[str, Manifest]) -> ManifestComparison:
    """Which hosts see the same dataset: the digest most hosts have is the reference
    (ties: the first host by name); each other host's missing, extra and changed files."""
    if not manifests:
        return ManifestComparison(ok=False, digest=None, agreeing=())
    counts = Counter(m.digest for m in manifests.values())
    top = max(counts.values())
    reference_host = min(h for h, m in manifests.items() if counts[m.digest] == top)
    reference = manifests[reference_host]
    agreeing = tuple(sorted(h for h, m in manifests.items() if m.digest == reference.digest))
    differences: dict[str, dict[str, list[str]]] = {}
    for host, manifest in sorted(manifests.items()):
        if manifest.digest == reference.digest:
            continue
        ref, mine = reference.files, manifest.files
        differences[host] = {"missing": sorted(set(ref) - set(mine)), "extra": sorted(set(mine) - set(ref)),
                             "changed": sorted(p for p in set(ref) & set(mine) if ref[p] != mine[p])}
    return ManifestComparison(ok=not differences, digest=reference.digest, agreeing=agreeing, differences=differences)


def summarize_mounts(command: MountCommand, reports: Mapping[str, MountReport],
                     errors: Mapping[str, str] | None = None) -> ClusterMountReport:
    errors = dict(errors or {})
    manifests = {h: r.manifest for h, r in reports.items() if r.manifest is not None}
    comparison = compare_manifests(manifests)
    not_exercised = sorted({n for r in reports.values() for n in r.notes if n.startswith("not exercised")})
    ok = (not errors and bool(reports) and all(r.ok for r in reports.values()) and comparison.ok
          and len(manifests) == len(reports))
    return ClusterMountReport(source=command.source, target=command.target, mountpoint=command.mountpoint,
                              hosts=dict(reports), errors=errors, comparison=comparison, ok=ok,
                              not_exercised=tuple(not_exercised))


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


def measure_io(root: Path, *, size: int, write: bool, tag: str, samples: int = 15) -> IoReport:
    """Latency: median of open+read of a small file. Throughput: a ``size``-byte probe written
    (fsync'd) and read back. Without ``write`` the largest existing file is read instead."""
    notes: list[str] = []
    latencies: list[float] = []
    write_mb_s = read_mb_s = None
    probe = root / f"{PROBE_PREFIX}{tag}-io-{os.getpid()}-{time.time_ns()}"
    try:
        if write and size:
            block = os.urandom(min(size, 1 << 20))
            started = time.perf_counter()
            with probe.open("wb") as fh:
                left = size
                while left > 0:
                    left -= fh.write(block[:left])
                fh.flush()
                os.fsync(fh.fileno())
            write_mb_s = size / (time.perf_counter() - started) / 1e6
            target = probe
        else:
            files = [p for p in root.rglob("*") if p.is_file() and not p.name.startswith(PROBE_PREFIX)]
            target = max(files, key=lambda p: p.stat().st_size) if files else None
            if not write:
                notes.append("write throughput not measured (read-only check)")
        if target is not None:
            started = time.perf_counter()
            with target.open("rb") as fh:
                got = sum(len(c) for c in iter(lambda: fh.read(1 << 20), b""))
            elapsed = time.perf_counter() - started
            read_mb_s = got / elapsed / 1e6 if got else None
            notes.append("read-back may be served from a local cache")
            for _ in range(samples):
                started = time.perf_counter()
                with target.open("rb") as fh:
                    fh.read(512)
                latencies.append((time.perf_counter() - started) * 1000)
    except OSError as exc:
        notes.append(f"measurement failed: {exc}")
    finally:
        with contextlib.suppress(OSError):
            probe.unlink()
    return IoReport(latency_ms=statistics.median(latencies) if latencies else None, write_mb_s=write_mb_s,
                    read_mb_s=read_mb_s, probe_bytes=size if write else 0, notes=tuple(notes))


# --- clients ----------------------------------------------------------------------------------

def find_binary(name: str) -> str | None:
    return shutil.which(name) or next((str(p) for d in ("/usr/sbin", "/sbin", "/usr/bin")
                                       if (p := Path(d) / name).is_file()), None)


def ensure_client(binary: str, *, install: bool, apt_get: Sequence[str] = ("apt-get",),
                  package: str | None = None, timeout: float = 600) -> tuple[str | None, str | None, str | None]:
    """``(path, installed_package, error)``: the binary, installing its Debian package when missing."""
    found = find_binary(binary)
    if found:
        return found, None, None
    package = package or CLIENT_PACKAGES.get(binary, binary)
    if not install:
        return None, None, f"{binary} is not installed (Debian package {package}) and installing is off"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        done = subprocess.run([*apt_get, "install", "-y", "--no-install-recommends", package], capture_output=True,
                              text=True, timeout=timeout, env=env)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, None, f"{binary} is missing and 'apt-get install {package}' could not run: {exc}"
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        return None, None, (f"{binary} is missing and 'apt-get install {package}' failed (exit {done.returncode}; "
                            f"offline?): {' | '.join(tail)}")
    found = find_binary(binary)
    if not found:
        return None, None, f"'apt-get install {package}' succeeded but {binary} is still not found"
    return found, package, None


def kernel_has_nfs() -> bool:
    """Whether this kernel can mount NFS (the module is loaded, built in, or loads now)."""
    def listed() -> bool:
        with contextlib.suppress(OSError):
            lines = Path("/proc/filesystems").read_text().splitlines()
            return any(line.split()[-1] in ("nfs", "nfs4") for line in lines if line.strip())
        return False

    if listed():
        return True
    modprobe = find_binary("modprobe")
    if modprobe:
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            subprocess.run([modprobe, "nfs"], capture_output=True, timeout=20)
    return listed()


class MountHandle:
    """A mount this agent made; :meth:`unmount` undoes it."""

    def __init__(self, mountpoint: Path, proc: asyncio.subprocess.Process | None = None) -> None:
        self.mountpoint = mountpoint
        self.proc = proc

    async def unmount(self) -> None:
        for tool in (["fusermount", "-u"], ["umount"]):
            if find_binary(tool[0]) and os.path.ismount(self.mountpoint):
                proc = await asyncio.create_subprocess_exec(*tool, str(self.mountpoint),
                                                            stdout=asyncio.subprocess.DEVNULL,
                                                            stderr=asyncio.subprocess.DEVNULL)
                await proc.wait()
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.terminate()
            try:
                await asyncio.wait_for(self.proc.wait(), 10)
            except TimeoutError:
                self.proc.kill()
                await self.proc.wait()


async def _wait_mounted(mountpoint: Path, proc: asyncio.subprocess.Process | None, what: str) -> None:
    deadline = time.monotonic() + _MOUNT_WAIT_S
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            return
        if proc is not None and proc.returncode is not None:
            out = b""
            if proc.stdout is not None:
                out = await proc.stdout.read()
            raise MountError(f"{what} exited with {proc.returncode}: {out.decode(errors='replace').strip()[-500:]}")
        await asyncio.sleep(0.1)
    raise MountError(f"{mountpoint} is not a mount point {_MOUNT_WAIT_S:.0f}s after starting {what}")


def _prepare_mountpoint(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point; unmount it first")
    mountpoint.mkdir(parents=True, exist_ok=True)
    if any(mountpoint.iterdir()):
        raise MountError(f"{mountpoint} is not empty; a mount would hide its files")


async def _checks(root: Path, command: MountCommand, host: str, *, write: bool) -> tuple[AccessReport, Manifest | None,
                                                                                          IoReport, list[str]]:
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


# --- the three sources ------------------------------------------------------------------------

Mounted = tuple[MountHandle | None, MountReport]


async def _mount_s3(command: MountCommand, host: str, settings: MountSettings) -> Mounted:
    mountpoint = Path(command.mountpoint)
    base = {"host": host, "source": "s3", "target": command.target, "mountpoint": command.mountpoint,
            "method": "s3fs-fuse"}
    s3fs, installed, error = await asyncio.to_thread(ensure_client, "s3fs", install=settings.install_missing,
                                                     apt_get=settings.apt_get)
    if error or s3fs is None:
        return None, MountReport(**base, mounted=False, problems=(error or "s3fs missing",))
    argv = [s3fs, command.target, str(mountpoint), "-f", "-o", "use_path_request_style", "-o", "dbglevel=warn"]
    if command.endpoint:
        argv += ["-o", f"url={command.endpoint}"]
    if settings.s3_credentials_file:
        argv += ["-o", f"passwd_file={settings.s3_credentials_file}"]
    try:
        _prepare_mountpoint(mountpoint)
        proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL)
        handle = MountHandle(mountpoint, proc)
        try:
            await _wait_mounted(mountpoint, proc, "s3fs")
        except BaseException:
            await handle.unmount()
            raise
    except (MountError, OSError) as exc:
        return None, MountReport(**base, mounted=False, installed=tuple(filter(None, [installed])),
                                 problems=(str(exc),))
    access, manifest, io, problems = await _checks(mountpoint, command, host, write=command.check_write)
    return handle, MountReport(**base, mounted=True, installed=tuple(filter(None, [installed])), access=access,
                               manifest=manifest, io=io, problems=tuple(problems))


def _nfs_parts(target: str) -> tuple[str, str]:
    server, sep, path = target.partition(":")
    if not sep or not server or not path.startswith("/"):
        raise MountError(f"an NFS source is SERVER:/path, got {target!r}")
    return server, path


class LibnfsClient:
    """The userspace libnfs tools (``nfs-ls``, ``nfs-cat``, ``nfs-cp``) against one export path."""

    def __init__(self, server: str, path: str, *, version: int = 4, tools: Mapping[str, str] | None = None,
                 timeout: float = 60) -> None:
        self.server, self.path, self.version = server, path.rstrip("/") or "/", version
        self.tools = dict(tools or {t: find_binary(t) or t for t in ("nfs-ls", "nfs-cat", "nfs-cp")})
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


def libnfs_checks(client: LibnfsClient, *, write: bool, tag: str,
                  samples: int = 5) -> tuple[AccessReport, Manifest | None, IoReport, list[str]]:
    """Access, manifest and speed through libnfs (no mount needed)."""
    problems: list[str] = []
    errors: list[str] = []
    readable = False
    sizes: dict[str, int] = {}
    try:
        sizes = client.list_files()
        readable = True
    except MountError as exc:
        errors.append(f"read {client.url()}: {exc}")
    writable = None
    if write:
        # libnfs-utils 4.0's nfs-cp fails NFSv4 writes of more than ~2 KB against nfs-ganesha 4.3,
        # so the write probe is small; write throughput is therefore not measured this way.
        probe = f"{PROBE_PREFIX}{tag}-{os.getpid()}-{time.time_ns()}"
        payload = os.urandom(1024)
        try:
            client.write(probe, payload)
            writable = client.read(probe) == payload
            if not writable:
                errors.append("write: read back different bytes")
        except MountError as exc:
            writable = False
            errors.append(f"write {client.url(probe)}: {exc}")
    problems += errors
    manifest = None
    if readable:
        try:
            manifest = client.manifest()
        except MountError as exc:
            problems.append(f"manifest: {exc}")
    latencies: list[float] = []
    read_mb_s = None
    notes = ["latency is one nfs-ls call (process start and NFS session set-up included)",
             "write throughput not measured: only a 1 KiB write probe goes through libnfs"]
    if readable:
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
    io = IoReport(latency_ms=statistics.median(latencies) if latencies else None, write_mb_s=None,
                  read_mb_s=read_mb_s, probe_bytes=1024 if write else 0, notes=tuple(notes))
    return AccessReport(readable=readable, writable=writable, errors=tuple(errors)), manifest, io, problems


async def _mount_nfs(command: MountCommand, host: str, settings: MountSettings) -> Mounted:
    mountpoint = Path(command.mountpoint)
    base = {"host": host, "source": "nfs", "target": command.target, "mountpoint": command.mountpoint}
    try:
        server, path = _nfs_parts(command.target)
    except MountError as exc:
        return None, MountReport(**base, method="none", mounted=False, problems=(str(exc),))
    installed: list[str] = []
    if await asyncio.to_thread(kernel_has_nfs):
        helper, package, error = await asyncio.to_thread(ensure_client, "mount.nfs", install=settings.install_missing,
                                                         apt_get=settings.apt_get)
        installed += [package] if package else []
        if error:
            return None, MountReport(**base, method="kernel-nfs", mounted=False, installed=tuple(installed),
                                     problems=(error,))
        try:
            _prepare_mountpoint(mountpoint)
            fstype = "nfs4" if command.nfs_version == 4 else "nfs"
            done = await asyncio.to_thread(subprocess.run, ["mount", "-t", fstype, "-o", f"vers={command.nfs_version}",
                                                            command.target, str(mountpoint)],
                                           capture_output=True, text=True, timeout=60)
            if done.returncode != 0:
                raise MountError(f"mount -t {fstype} {command.target}: {done.stderr.strip()}")
        except (MountError, OSError, subprocess.TimeoutExpired) as exc:
            return None, MountReport(**base, method="kernel-nfs", mounted=False, installed=tuple(installed),
                                     problems=(str(exc),))
        access, manifest, io, problems = await _checks(mountpoint, command, host, write=command.check_write)
        return MountHandle(mountpoint), MountReport(**base, method="kernel-nfs", mounted=True,
                                                    installed=tuple(installed), access=access, manifest=manifest,
                                                    io=io, problems=tuple(problems))
    # No kernel NFS client: check the export through libnfs in user space instead.
    tools: dict[str, str] = {}
    for tool in ("nfs-ls", "nfs-cat", "nfs-cp"):
        found, package, error = await asyncio.to_thread(ensure_client, tool, install=settings.install_missing,
                                                        apt_get=settings.apt_get, package="libnfs-utils")
        installed += [package] if package and package not in installed else []
        if error or found is None:
            return None, MountReport(**base, method="libnfs-userspace", mounted=False, installed=tuple(installed),
                                     problems=(error or f"{tool} missing",))
        tools[tool] = found
    client = LibnfsClient(server, path, version=command.nfs_version, tools=tools)
    access, manifest, io, problems = await asyncio.to_thread(libnfs_checks, client, write=command.check_write, tag=host)
    notes = ("not exercised: kernel NFS mount (this kernel has no NFS client: no 'nfs' in /proc/filesystems and "
             "modprobe nfs failed); access, manifest and speed were checked through libnfs in user space",)
    return None, MountReport(**base, method="libnfs-userspace", mounted=False, installed=tuple(installed),
                             access=access, manifest=manifest, io=io,
                             problems=(*problems, f"{command.mountpoint} not mounted: no kernel NFS client"),
                             notes=notes)


async def _fetch_ipfs(command: MountCommand, host: str, settings: MountSettings) -> Mounted:
    from ..errors import AitbcError
    from ..storage.kubo import KuboClient, KuboContentStore

    mountpoint = Path(command.mountpoint)
    base = {"host": host, "source": "ipfs", "target": command.target, "mountpoint": command.mountpoint,
            "method": "ipfs-fetch"}
    api = command.endpoint or settings.ipfs_api
    if not api:
        return None, MountReport(**base, mounted=False, problems=("no IPFS API: pass --endpoint or start the agent "
                                                                  "with --ipfs-api",))
    mountpoint.mkdir(parents=True, exist_ok=True)
    dest = mountpoint / command.target
    tmp = mountpoint / f"{PROBE_PREFIX}{host}-fetch-{os.getpid()}"
    started = time.perf_counter()
    size = 0
    try:
        async with KuboClient(api, timeout=60.0, find_timeout=10.0) as client:
            store = KuboContentStore(client)
            with tmp.open("wb") as out:
                # Every block checked against its CID; to disk, so any declared size (the DAG shape limits hold).
                async for chunk in store.stream(command.target, max_bytes=None, timeout_s=None):
                    out.write(chunk)
                    size += len(chunk)
                out.flush()
                os.fsync(out.fileno())
        os.replace(tmp, dest)
    except (AitbcError, OSError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None, MountReport(**base, mounted=False, problems=(f"fetching {command.target} from {api}: {exc}",))
    fetch_s = time.perf_counter() - started
    access, manifest, io, problems = await _checks(mountpoint, command, host, write=command.check_write)
    io = io.model_copy(update={"notes": (*io.notes, f"fetched and verified {size} bytes from {api} in "
                                         f"{fetch_s * 1000:.0f} ms ({size / fetch_s / 1e6:.1f} MB/s)")})
    return None, MountReport(**base, mounted=True, access=access, manifest=manifest, io=io, problems=tuple(problems),
                             notes=("content-addressed: every block was checked against its hash while fetching",))


async def perform_mount(command: MountCommand, *, host: str,
                        settings: MountSettings | None = None) -> tuple[MountHandle | None, MountReport]:
    """Mount (or fetch) on this host and check it; never raises for a failed mount, it reports it."""
    settings = settings or MountSettings()
    if command.source == "s3":
        return await _mount_s3(command, host, settings)
    if command.source == "nfs":
        return await _mount_nfs(command, host, settings)
    return await _fetch_ipfs(command, host, settings)
