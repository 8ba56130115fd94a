"""The local mount point: made ready, waited on, and undone by the :class:`MountHandle` that owns it."""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from pathlib import Path

from ._installer import find_binary
from ._records import MountError, MountReport

MOUNT_WAIT_S = 30.0


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


# What every backend returns: the handle of a mount it made (None when nothing is left mounted) and the report.
Mounted = tuple[MountHandle | None, MountReport]


async def wait_mounted(mountpoint: Path, proc: asyncio.subprocess.Process | None, what: str) -> None:
    deadline = time.monotonic() + MOUNT_WAIT_S
    while time.monotonic() < deadline:
        if os.path.ismount(mountpoint):
            return
        if proc is not None and proc.returncode is not None:
            out = b""
            if proc.stdout is not None:
                out = await proc.stdout.read()
            raise MountError(f"{what} exited with {proc.returncode}: {out.decode(errors='replace').strip()[-500:]}")
        await asyncio.sleep(0.1)
    raise MountError(f"{mountpoint} is not a mount point {MOUNT_WAIT_S:.0f}s after starting {what}")


def prepare_mountpoint(mountpoint: Path) -> None:
    if os.path.ismount(mountpoint):
        raise MountError(f"{mountpoint} is already a mount point; unmount it first")
    mountpoint.mkdir(parents=True, exist_ok=True)
    if any(mountpoint.iterdir()):
        raise MountError(f"{mountpoint} is not empty; a mount would hide its files")
