"""IPFS through a Kubo RPC daemon: the ContentStore adapter, verifying everything it reads.

``KuboClient`` (:mod:`.kubo_rpc`) is the transport and trusts the daemon. ``KuboContentStore``
does not: ``add`` recomputes the CID locally and ``stream``/``cat`` fetch raw blocks and check
every one against its CID before a byte is yielded.
"""

from __future__ import annotations

import asyncio
import hashlib
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Iterable
from itertools import islice
from pathlib import Path
from typing import TypeVar

from ..errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from .bounds import DagBudget, FileNode, deadline_after, read_file_node
from .kubo_rpc import DEFAULT_API, KuboClient, same_cid
from .local import compute_file_cid
from .port import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, AddOptions
from .unixfs import Block, cid_from_str, cid_to_str, compute_cid, decode_cid_bytes

__all__ = ["DEFAULT_API", "KuboClient", "KuboContentStore"]

T = TypeVar("T")


def _local_cid(data: bytes | Path, options: AddOptions) -> str:
    return compute_file_cid(data, options) if isinstance(data, Path) else compute_cid(data, options)


class KuboContentStore:
    """The ContentStore port over a Kubo RPC daemon, verifying everything it reads.

    ``prefetch`` is how many sibling blocks are requested ahead while streaming.
    """

    def __init__(self, client: KuboClient, *, prefetch: int = 8) -> None:
        self.client = client
        self._prefetch = max(1, prefetch)

    async def add(self, data: bytes | Path, *, pin: bool = True, options: AddOptions | None = None,
                  only_hash: bool = False) -> str:
        """Add through the daemon; IntegrityError if its CID differs from the local computation."""
        opts = options or AddOptions()
        local = asyncio.ensure_future(asyncio.to_thread(_local_cid, data, opts))
        try:
            remote = await self.client.add(data, cid_version=opts.cid_version, raw_leaves=opts.use_raw_leaves,
                                           chunker=f"size-{opts.chunk_size}", pin=pin, only_hash=only_hash)
        except BaseException:
            await asyncio.gather(local, return_exceptions=True)  # the thread runs to the end anyway
            raise
        try:
            expected = await local
        except OSError as exc:
            raise StorageError(f"cannot read {data}: {exc}") from exc
        if not same_cid(remote, expected):
            raise IntegrityError(f"IPFS API {self.client.api_url} returned {remote} for content whose"
                                 f" CID is {expected} ({opts})")
        return expected

    async def cat(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bytes:
        return b"".join([chunk async for chunk in self.stream(cid, max_bytes=max_bytes, timeout_s=timeout_s)])

    async def stream(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                     timeout_s: float | None = DEFAULT_TIMEOUT_S) -> AsyncIterator[bytes]:
        """Yield the content in order; each block is checked against its CID and the limits before use.

        The walk is a loop over a stack of sibling prefetchers, so DAG depth costs no recursion.
        """
        root = cid_from_str(cid)  # InvalidCidError before any I/O
        budget = DagBudget(root, max_bytes, deadline_after(timeout_s))
        node = budget.accept(root, await self._within(budget, self._get_verified(root)), None, 0)
        if node.data:
            yield node.data
        stack = [self._fetch_in_order(node)]
        try:
            while stack:
                nxt = await self._within(budget, anext(stack[-1], None))
                if nxt is None:
                    await stack.pop().aclose()
                    continue
                child, size, block = nxt
                node = budget.accept(child, block, size, len(stack))
                if node.data:
                    yield node.data
                if node.children:
                    stack.append(self._fetch_in_order(node))
        finally:
            for pending in reversed(stack):  # the consumer stopped early or a limit was hit
                await pending.aclose()

    async def size(self, cid: str) -> int:
        """The file size the root block of ``cid`` declares."""
        raw = cid_from_str(cid)
        return read_file_node(raw, await self._get_verified(raw)).size

    async def pin(self, cid: str) -> None:
        await self.client.pin_add(cid_to_str(cid_from_str(cid)))

    async def unpin(self, cid: str) -> None:
        """Like the local store: unpinning what is not pinned is a no-op."""
        canonical = cid_to_str(cid_from_str(cid))
        try:
            await self.client.pin_rm(canonical)
        except ContentNotFoundError:
            return
        except StorageError as exc:
            if "not pinned" in str(exc):
                return
            raise

    async def pins(self) -> list[str]:
        return await self.client.pin_ls()

    async def put_blocks(self, blocks: Iterable[Block]) -> int:
        """Push blocks (e.g. from another store) to the daemon, checking each CID it assigns."""
        count = 0
        for cid, block in blocks:
            version, codec, _ = decode_cid_bytes(cid_from_str(cid))
            got = await self.client.block_put(block, codec=codec, cid_version=version)
            if not same_cid(got, cid):
                raise IntegrityError(f"IPFS API {self.client.api_url} stored block {cid} as {got}")
            count += 1
        return count

    # internals

    async def _get_verified(self, raw_cid: bytes) -> bytes:
        block = await self.client.block_get(cid_to_str(raw_cid))
        _, _, digest = decode_cid_bytes(raw_cid)
        if hashlib.sha256(block).digest() != digest:
            raise IntegrityError(f"block {cid_to_str(raw_cid)} from {self.client.api_url} does not match its hash")
        return block

    @staticmethod
    async def _within(budget: DagBudget, step: Awaitable[T]) -> T:
        """Await one fetch under the read's total deadline."""
        if budget.deadline is None:
            return await step
        try:
            async with asyncio.timeout(max(0.0, budget.deadline - time.monotonic())):
                return await step
        except TimeoutError as exc:
            raise FetchLimitError(f"reading {budget.root} timed out") from exc

    async def _fetch_in_order(self, node: FileNode) -> AsyncIterator[tuple[bytes, int, bytes]]:
        """A node's children as (CID, declared size, verified block) in link order, up to ``prefetch`` ahead.

        Only children of a node that passed its size checks are ever requested.
        """
        queue: deque[tuple[bytes, int, asyncio.Task[bytes]]] = deque()
        ahead = iter(node.children)
        try:
            for cid, size in islice(ahead, self._prefetch):
                queue.append((cid, size, asyncio.ensure_future(self._get_verified(cid))))
            while queue:
                cid, size, task = queue.popleft()
                block = await task
                for nxt, nxt_size in islice(ahead, 1):
                    queue.append((nxt, nxt_size, asyncio.ensure_future(self._get_verified(nxt))))
                yield cid, size, block
        finally:
            for _, _, task in queue:  # the consumer stopped early or a block failed
                task.cancel()
            await asyncio.gather(*(t for _, _, t in queue), return_exceptions=True)
