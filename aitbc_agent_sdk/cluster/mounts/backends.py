"""Which backend serves a source kind: one table, like :data:`aitbc_agent_sdk.stack.STACK_BUILDERS`."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from .ipfs import fetch_ipfs
from .mountpoint import Mounted
from .nfs import mount_nfs
from .records import MountCommand, MountSettings, MountSource
from .s3fs import mount_s3

MountBackend = Callable[[MountCommand, str, MountSettings], Awaitable[Mounted]]
MOUNT_BACKENDS: dict[MountSource, MountBackend] = {"nfs": mount_nfs, "s3": mount_s3, "ipfs": fetch_ipfs}


async def perform_mount(command: MountCommand, *, host: str, settings: MountSettings | None = None) -> Mounted:
    """Mount (or fetch) on this host and check it; never raises for a failed mount, it reports it."""
    return await MOUNT_BACKENDS[command.source](command, host, settings or MountSettings())
