"""NFS: a kernel mount (``mount -t nfs``) where the kernel has an NFS client.

Where it has none, no mount can be made: the report says so (``mounted=False``) and the same
access, manifest and speed checks run through the userspace libnfs tools against the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
from pathlib import Path
from typing import Any

from ._checks import check_mounted
from ._installer import ensure_client, find_binary
from ._libnfs import LIBNFS_TOOLS, LibnfsClient, libnfs_checks
from ._mountpoint import MountHandle, Mounted, prepare_mountpoint
from ._records import MountCommand, MountError, MountReport, MountSettings

_NO_KERNEL_CLIENT = ("not exercised: kernel NFS mount (this kernel has no NFS client: no 'nfs' in /proc/filesystems "
                     "and modprobe nfs failed); access, manifest and speed were checked through libnfs in user space")


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


def nfs_parts(target: str) -> tuple[str, str]:
    """``SERVER:/path`` split into server and path."""
    server, sep, path = target.partition(":")
    if not sep or not server or not path.startswith("/"):
        raise MountError(f"an NFS source is SERVER:/path, got {target!r}")
    return server, path


def _kernel_mount(command: MountCommand, mountpoint: Path) -> None:
    prepare_mountpoint(mountpoint)
    fstype = "nfs4" if command.nfs_version == 4 else "nfs"
    done = subprocess.run(["mount", "-t", fstype, "-o", f"vers={command.nfs_version}", command.target,
                           str(mountpoint)], capture_output=True, text=True, timeout=60)
    if done.returncode != 0:
        raise MountError(f"mount -t {fstype} {command.target}: {done.stderr.strip()}")


async def _mount_kernel_nfs(command: MountCommand, host: str, settings: MountSettings,
                            base: dict[str, Any]) -> Mounted:
    base = {**base, "method": "kernel-nfs"}
    _, package, error = await asyncio.to_thread(ensure_client, "mount.nfs", install=settings.install_missing,
                                                apt_get=settings.apt_get)
    installed = (package,) if package else ()
    if error:
        return None, MountReport(**base, mounted=False, installed=installed, problems=(error,))
    mountpoint = Path(command.mountpoint)
    try:
        await asyncio.to_thread(_kernel_mount, command, mountpoint)
    except (MountError, OSError, subprocess.TimeoutExpired) as exc:
        return None, MountReport(**base, mounted=False, installed=installed, problems=(str(exc),))
    access, manifest, io, problems = await check_mounted(mountpoint, command, host, write=command.check_write)
    return MountHandle(mountpoint), MountReport(**base, mounted=True, installed=installed, access=access,
                                                manifest=manifest, io=io, problems=tuple(problems))


async def _check_userspace_nfs(command: MountCommand, host: str, settings: MountSettings, base: dict[str, Any],
                               server: str, path: str) -> Mounted:
    base = {**base, "method": "libnfs-userspace", "mounted": False}
    installed: list[str] = []
    tools: dict[str, str] = {}
    for tool in LIBNFS_TOOLS:
        found, package, error = await asyncio.to_thread(ensure_client, tool, install=settings.install_missing,
                                                        apt_get=settings.apt_get, package="libnfs-utils")
        installed += [package] if package and package not in installed else []
        if error or found is None:
            return None, MountReport(**base, installed=tuple(installed), problems=(error or f"{tool} missing",))
        tools[tool] = found
    client = LibnfsClient(server, path, version=command.nfs_version, tools=tools)
    access, manifest, io, problems = await asyncio.to_thread(libnfs_checks, client, write=command.check_write, tag=host)
    return None, MountReport(**base, installed=tuple(installed), access=access, manifest=manifest, io=io,
                             problems=(*problems, f"{command.mountpoint} not mounted: no kernel NFS client"),
                             notes=(_NO_KERNEL_CLIENT,))


async def mount_nfs(command: MountCommand, host: str, settings: MountSettings) -> Mounted:
    base = {"host": host, "source": "nfs", "target": command.target, "mountpoint": command.mountpoint}
    try:
        server, path = nfs_parts(command.target)
    except MountError as exc:
        return None, MountReport(**base, method="none", mounted=False, problems=(str(exc),))
    if await asyncio.to_thread(kernel_has_nfs):
        return await _mount_kernel_nfs(command, host, settings, base)
    return await _check_userspace_nfs(command, host, settings, base, server, path)
