"""S3 through s3fs over FUSE, run as the agent's child so the agent owns (and unmounts) it.

Credentials come from a file on the host (``MountSettings.s3_credentials_file`` or s3fs's own
defaults), never over the bus.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from ._checks import check_mounted
from ._installer import ensure_client
from ._mountpoint import MountHandle, Mounted, prepare_mountpoint, wait_mounted
from ._records import MountCommand, MountError, MountReport, MountSettings


def s3fs_argv(s3fs: str, command: MountCommand, settings: MountSettings) -> list[str]:
    argv = [s3fs, command.target, str(Path(command.mountpoint)), "-f", "-o", "use_path_request_style",
            "-o", "dbglevel=warn"]
    if command.endpoint:
        argv += ["-o", f"url={command.endpoint}"]
    if settings.s3_credentials_file:
        argv += ["-o", f"passwd_file={settings.s3_credentials_file}"]
    return argv


async def _start_s3fs(argv: list[str], mountpoint: Path) -> MountHandle:
    prepare_mountpoint(mountpoint)
    proc = await asyncio.create_subprocess_exec(*argv, stdout=asyncio.subprocess.PIPE,
                                                stderr=asyncio.subprocess.STDOUT, stdin=asyncio.subprocess.DEVNULL)
    handle = MountHandle(mountpoint, proc)
    try:
        await wait_mounted(mountpoint, proc, "s3fs")
    except BaseException:
        await handle.unmount()
        raise
    return handle


async def mount_s3(command: MountCommand, host: str, settings: MountSettings) -> Mounted:
    mountpoint = Path(command.mountpoint)
    base = {"host": host, "source": "s3", "target": command.target, "mountpoint": command.mountpoint,
            "method": "s3fs-fuse"}
    s3fs, installed, error = await asyncio.to_thread(ensure_client, "s3fs", install=settings.install_missing,
                                                     apt_get=settings.apt_get)
    if error or s3fs is None:
        return None, MountReport(**base, mounted=False, problems=(error or "s3fs missing",))
    packages = tuple(filter(None, [installed]))
    try:
        handle = await _start_s3fs(s3fs_argv(s3fs, command, settings), mountpoint)
    except (MountError, OSError) as exc:
        return None, MountReport(**base, mounted=False, installed=packages, problems=(str(exc),))
    access, manifest, io, problems = await check_mounted(mountpoint, command, host, write=command.check_write)
    return handle, MountReport(**base, mounted=True, installed=packages, access=access,
                               manifest=manifest, io=io, problems=tuple(problems))
