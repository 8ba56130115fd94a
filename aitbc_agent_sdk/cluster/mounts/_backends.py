"""Which backend serves a source kind: one table, like :data:`aitbc_agent_sdk._stack.STACK_BUILDERS`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from ._ipfs import fetch_ipfs
from ._mountpoint import Mounted
from ._nfs import mount_nfs
from ._records import MountCommand, MountSettings, MountSource
from ._s3fs import mount_s3

MountBackend = Callable[[MountCommand, str, MountSettings], Awaitable[Mounted]]
MOUNT_BACKENDS: dict[MountSource, MountBackend] = {"nfs": mount_nfs, "s3": mount_s3, "ipfs": fetch_ipfs}


async def perform_mount(command: MountCommand, *, host: str, settings: MountSettings | None = None) -> Mounted:
    """Mount (or fetch) on this host and check it; never raises for a failed mount, it reports it."""
    return await MOUNT_BACKENDS[command.source](command, host, settings or MountSettings())
