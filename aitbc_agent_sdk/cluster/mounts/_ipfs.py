"""IPFS: the CID fetched through a Kubo RPC API into ``MOUNTPOINT/CID``, every block checked against its hash."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

from ...errors import AitbcError
from ._checks import check_mounted
from ._mountpoint import Mounted
from ._records import PROBE_PREFIX, MountCommand, MountReport, MountSettings


async def _fetch_to(api: str, cid: str, dest: Path, tmp: Path) -> int:
    """Stream ``cid`` into ``tmp``, then move it to ``dest``; the bytes fetched."""
    # Imported on use: reading a MountCommand needs no HTTP client.
    from ...storage._kubo import KuboClient, KuboContentStore

    size = 0
    async with KuboClient(api, timeout=60.0, find_timeout=10.0) as client:
        store = KuboContentStore(client)
        with tmp.open("wb") as out:
            # Every block checked against its CID; to disk, so any declared size (the DAG shape limits hold).
            async for chunk in store.stream(cid, max_bytes=None, timeout_s=None):
                out.write(chunk)
                size += len(chunk)
            out.flush()
            os.fsync(out.fileno())
    os.replace(tmp, dest)
    return size


async def fetch_ipfs(command: MountCommand, host: str, settings: MountSettings) -> Mounted:
    mountpoint = Path(command.mountpoint)
    base = {"host": host, "source": "ipfs", "target": command.target, "mountpoint": command.mountpoint,
            "method": "ipfs-fetch"}
    api = command.endpoint or settings.ipfs_api
    if not api:
        return None, MountReport(**base, mounted=False, problems=("no IPFS API: pass --endpoint or start the agent "
                                                                  "with --ipfs-api",))
    mountpoint.mkdir(parents=True, exist_ok=True)
    tmp = mountpoint / f"{PROBE_PREFIX}{host}-fetch-{os.getpid()}"
    started = time.perf_counter()
    try:
        size = await _fetch_to(api, command.target, mountpoint / command.target, tmp)
    except (AitbcError, OSError) as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        return None, MountReport(**base, mounted=False, problems=(f"fetching {command.target} from {api}: {exc}",))
    fetch_s = time.perf_counter() - started
    access, manifest, io, problems = await check_mounted(mountpoint, command, host, write=command.check_write)
    io = io.model_copy(update={"notes": (*io.notes, f"fetched and verified {size} bytes from {api} in "
                                         f"{fetch_s * 1000:.0f} ms ({size / fetch_s / 1e6:.1f} MB/s)")})
    return None, MountReport(**base, mounted=True, access=access, manifest=manifest, io=io, problems=tuple(problems),
                             notes=("content-addressed: every block was checked against its hash while fetching",))
