"""IPFS bombs: DAGs that are tiny to store and huge (or endless) to read.

Each bomb is built from raw blocks with the project's own dag-pb/UnixFS encoders and put
into both real stores: the local blockstore and the js-ipfs daemon (through the Kubo RPC
``block/put``). A fetch with the job's limit must end in an ``IntegrityError`` quickly and
with bounded memory, never a ``RecursionError``; a provider handed a bomb reports the job
failed and keeps serving.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import IntegrityError
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import JobAssignment, JobConfig, new_id
from aitbc_agent_sdk.storage import DAG_PB, LocalContentStore, cid_from_str, cid_to_str, iter_blocks
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.storage._unixfs import cid_bytes, encode_file_node
from aitbc_agent_sdk.coordinator.data._datasets import store_shard
from aitbc_agent_sdk.wire._checkpoint import encode_state
from test_provider_agent import TRAINING, open_market

CHUNK = 256 * 1024
JOB_LIMIT = 4 * 1024 * 1024  # what a job may declare for the shard in these tests: 4 MiB
MEMORY_BOUND = 4 * 1024 * 1024  # peak Python allocations while a bomb is refused
QUICK_S = 30.0  # a refusal takes milliseconds; this only has to survive a loaded machine


@dataclass(frozen=True)
class Bomb:
    root: str
    blocks: list[tuple[str, bytes]]  # every distinct block, root last

    @property
    def stored_bytes(self) -> int:
        return sum(len(b) for _, b in self.blocks)


def _node(children: list[tuple[bytes, int, int]]) -> tuple[bytes, str, bytes]:
    """An internal UnixFS file node over (binary CID, Tsize, file bytes) children."""
    block = encode_file_node([c for c, _, _ in children], [t for _, t, _ in children], [f for _, _, f in children])
    raw = cid_bytes(0, DAG_PB, hashlib.sha256(block).digest())
    return raw, cid_to_str(raw), block


def _chunk_leaf(size: int = CHUNK) -> tuple[bytes, str, bytes]:
    ((cid, block),) = iter_blocks(os.urandom(size))  # one chunk: the root is the dag-pb leaf
    return cid_from_str(cid), cid, block


def wide_bomb(width: int = 4000, levels: int = 1) -> Bomb:
    """``width`` links to the same 256 KiB block, ``levels`` deep: width**levels * 256 KiB of content."""
    raw, cid, block = _chunk_leaf()
    blocks = [(cid, block)]
    tsize, filesize = len(block), CHUNK
    for _ in range(levels):
        raw, cid, node = _node([(raw, tsize, filesize)] * width)
        blocks.append((cid, node))
        tsize, filesize = len(node) + width * tsize, width * filesize
    return Bomb(cid, blocks)


def deep_bomb(depth: int = 1200) -> Bomb:
    """A chain of ``depth`` one-link nodes over a 10-byte leaf; honest about every size."""
    raw, cid, block = _chunk_leaf(10)
    blocks = [(cid, block)]
    tsize = len(block)
    for _ in range(depth):
        raw, cid, node = _node([(raw, tsize, 10)])
        blocks.append((cid, node))
        tsize += len(node)
    return Bomb(cid, blocks)


def lying_bomb() -> Bomb:
    """A root that declares 4 bytes (1 per child) over four 256 KiB children."""
    raw, cid, block = _chunk_leaf()
    _, root, node = _node([(raw, len(block), 1)] * 4)
    return Bomb(root, [(cid, block), (root, node)])


# --- the two real stores ----------------------------------------------------------------------

@pytest.fixture(params=["local", "kubo"])
async def store_with(request: pytest.FixtureRequest, tmp_path: Path, ipfs_daemon: str) -> AsyncIterator[Callable]:
    """``await store_with(bomb)`` -> a store holding the bomb's raw blocks."""
    if request.param == "local":
        local = LocalContentStore(tmp_path / "store")

        async def put_local(bomb: Bomb) -> LocalContentStore:
            assert await local.put_blocks(bomb.blocks) == len(bomb.blocks)
            return local
        yield put_local
        return
    async with KuboClient(ipfs_daemon, timeout=60.0, find_timeout=2.0) as client:
        remote = KuboContentStore(client)

        async def put_remote(bomb: Bomb) -> KuboContentStore:
            limit = asyncio.Semaphore(8)

            async def put(block: tuple[str, bytes]) -> int:
                async with limit:
                    return await remote.put_blocks([block])
            assert sum(await asyncio.gather(*(put(b) for b in bomb.blocks))) == len(bomb.blocks)
            return remote
        yield put_remote


async def refused(fetch: Callable[[], object], match: str) -> tuple[float, int]:
    """Run ``fetch`` expecting an IntegrityError; returns (seconds, peak traced bytes)."""
    tracemalloc.start()
    started = time.monotonic()
    try:
        with pytest.raises(IntegrityError, match=match):
            await fetch()  # type: ignore[misc]
        return time.monotonic() - started, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


async def _drain(stream: AsyncIterator[bytes]) -> int:
    return sum([len(chunk) async for chunk in stream])


# --- the store refuses every bomb ----------------------------------------------------------------

async def test_a_wide_bomb_is_refused_by_its_link_count(store_with: Callable) -> None:
    bomb = wide_bomb()
    assert bomb.stored_bytes < 700_000  # 0.67 MB stored ...
    store = await store_with(bomb)       # ... for 1 GB of content
    for fetch in (lambda: store.cat(bomb.root), lambda: _drain(store.stream(bomb.root))):
        seconds, peak = await refused(fetch, "links")
        assert seconds < QUICK_S and peak < MEMORY_BOUND


async def test_a_bomb_one_level_deeper_is_refused_before_its_children_are_read(store_with: Callable) -> None:
    bomb = wide_bomb(width=1000, levels=2)  # 262 GB of content from three blocks
    store = await store_with(bomb)
    for limit in (None, JOB_LIMIT):  # the conservative default, and what a job declares
        kwargs = {} if limit is None else {"max_bytes": limit}
        seconds, peak = await refused(lambda: store.cat(bomb.root, **kwargs), "declares")
        assert seconds < QUICK_S and peak < MEMORY_BOUND


async def test_a_deep_bomb_is_an_integrity_error_not_a_recursion_error(store_with: Callable) -> None:
    bomb = deep_bomb()
    store = await store_with(bomb)
    for fetch in (lambda: store.cat(bomb.root), lambda: store.cat(bomb.root, max_bytes=JOB_LIMIT),
                  lambda: _drain(store.stream(bomb.root))):
        seconds, peak = await refused(fetch, "deep")
        assert seconds < QUICK_S and peak < MEMORY_BOUND


async def test_a_node_that_lies_about_its_size_is_refused(store_with: Callable) -> None:
    bomb = lying_bomb()
    store = await store_with(bomb)
    seconds, peak = await refused(lambda: store.cat(bomb.root, max_bytes=64), "size")
    assert seconds < QUICK_S and peak < MEMORY_BOUND
    assert await store.size(bomb.root) == 4  # what it declares, which the walk then holds it to


async def test_honest_content_within_the_limit_still_reads(store_with: Callable) -> None:
    data = os.urandom(3 * CHUNK + 5)
    store = await store_with(Bomb("", list(iter_blocks(data))))
    root = list(iter_blocks(data))[-1][0]
    assert await store.size(root) == len(data)
    assert await store.cat(root, max_bytes=len(data)) == data
    with pytest.raises(IntegrityError, match="declares"):
        await store.cat(root, max_bytes=len(data) - 1)


async def test_a_daemon_that_never_answers_hits_the_timeout() -> None:
    # A real socket that accepts and never replies: the daemon of an attacker, or a wedged one.
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        async with KuboClient(f"http://127.0.0.1:{port}", timeout=60.0, find_timeout=60.0) as client:
            store = KuboContentStore(client)
            root = wide_bomb(width=1).root
            started = time.monotonic()
            with pytest.raises(IntegrityError, match="timed out"):
                await store.cat(root, max_bytes=JOB_LIMIT, timeout_s=1.0)
            with pytest.raises(IntegrityError, match="timed out"):
                await _drain(store.stream(root, max_bytes=JOB_LIMIT, timeout_s=1.0))
            assert time.monotonic() - started < QUICK_S  # not the client's 60 s + 60 s
    finally:
        server.close()


# --- a provider handed a bomb ----------------------------------------------------------------------

async def test_a_provider_handed_bombs_fails_those_jobs_and_keeps_serving(tmp_path: Path) -> None:
    async with open_market(tmp_path) as market, market.provider() as provider:
        contract = await market.hire(provider)
        weights = encode_state(market.initial_weights())
        weights_cid = await market.store.add(weights)
        _, shard_bytes = await store_shard(market.store, market.data)
        for bomb, why in ((deep_bomb(), "deep"), (wide_bomb(), "links"), (lying_bomb(), "size")):
            assert await market.store.put_blocks(bomb.blocks) == len(bomb.blocks)
            job = JobAssignment(job_id=new_id("job"), training_id=TRAINING,
                                round=1, worker_id=provider.address, contract_id=contract, shard_cid=bomb.root,
                                shard_bytes=shard_bytes, weights_cid=weights_cid, weights_bytes=len(weights),
                                model=market.spec, config=JobConfig(epochs=1))
            await market.coordinator.publish(topics.jobs(provider.address), job)
            failed = await market.status(job, "failed")
            assert failed.error is not None and why in failed.error
        honest = await market.assign(provider, contract)  # still serving
        assert (await market.result(honest)).job_id == honest.job_id
