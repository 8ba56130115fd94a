"""pytest fixtures for a real js-ipfs daemon (Kubo RPC API) on 127.0.0.1.

The daemon is installed by ``make setup`` (npm, into tools/node). When it is missing the
tests that need it fail with a message saying so: CI installs it, so a silent skip would
hide a broken set-up.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator

import pytest

from aitbc_agent_sdk.devnet._ipfs import jsipfs_path, start_ipfs_daemon
from aitbc_agent_sdk.devnet._service import ServiceError, free_port, stop
from aitbc_agent_sdk.storage._kubo import KuboClient


@pytest.fixture(scope="session")
def ipfs_daemon(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A fresh offline js-ipfs daemon for the whole session; yields its API URL."""
    try:
        jsipfs = jsipfs_path()
    except ServiceError as exc:
        pytest.fail(f"the js-ipfs daemon is needed for this test: {exc}", pytrace=False)
    repo = tmp_path_factory.mktemp("ipfs") / "repo"
    # tied_to: if this run is killed outright, the daemon still goes with it.
    service, url = asyncio.run(start_ipfs_daemon(repo, api_port=free_port(), swarm_port=free_port(),
                                                 jsipfs=jsipfs, tied_to=os.getpid()))
    try:
        yield url
    finally:
        stop(service)


@pytest.fixture
async def kubo_client(ipfs_daemon: str) -> AsyncIterator[KuboClient]:
    """A client on the session daemon; unknown CIDs give up after 2 s (the daemon is offline)."""
    async with KuboClient(ipfs_daemon, timeout=60.0, find_timeout=2.0) as client:
        yield client
