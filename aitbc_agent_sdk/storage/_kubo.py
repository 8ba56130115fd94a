"""IPFS through a Kubo RPC daemon: the ContentStore adapter, verifying everything it reads.

``KuboClient`` (:mod:`._kubo_rpc`) is the transport and trusts the daemon. ``KuboContentStore``
does not: ``add`` recomputes the CID locally, and ``stream``/``cat`` check every block against its
CID before a byte is yielded. A whole file comes as one ``dag/export`` CAR stream, checked block by
block as it arrives (:mod:`._car`); a range, or a daemon without ``dag/export``, is read block by
block with ``block/get``.
"""

from __future__ import annotations

import asyncio
import hashlib
import io
import time
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Generator, Iterable
from itertools import islice
from pathlib import Path
from typing import TypeVar

from ..errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from ._bounds import Child, DagBudget, check_range, deadline_after, node_parts, read_file_node
from ._car import CarFileReader, IncompleteCarError
from ._directory_import import FileRequest, FileResult, ImportJournal, ImportTracker, Steps, import_steps
from ._kubo_rpc import DEFAULT_API, KuboClient, UnsupportedEndpointError, same_cid
from ._local import compute_directory_cid, compute_file_cid, file_dag
from ._paths import parse_content_path, resolve_steps, walk_steps
from ._port import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_TIMEOUT_S, AddOptions, DirEntry
from ._unixfs import Block, cid_from_str, cid_to_str, compute_cid, decode_cid_bytes

__all__ = ["DEFAULT_API", "KuboClient", "KuboContentStore"]

T = TypeVar("T")


def _local_cid(data: bytes | Path, options: AddOptions) -> str:
    return compute_file_cid(data, options) if isinstance(data, Path) else compute_cid(data, options)


def _step(steps: Steps, value: FileResult | None) -> FileRequest | list[Block] | str:
    """Advance an import walk in a worker thread; its root CID once it is done (StopIteration cannot
    cross into a future)."""
    try:
        return steps.send(value)
    except StopIteration as done:
        return str(done.value)


class KuboContentStore:
    """The ContentStore port over a Kubo RPC daemon, verifying everything it reads.

    ``prefetch`` is how many sibling blocks are requested ahead while streaming.
    """

    def __init__(self, client: KuboClient, *, prefetch: int = 8) -> None:
        self.client = client
        self._prefetch = max(1, prefetch)
        self._car = True  # until the daemon shows it has no dag/export

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

    async def add_directory(self, path: Path, *, pin: bool = True, options: AddOptions | None = None,
                            only_hash: bool = False, hidden: bool = False, journal: Path | None = None,
                            progress: Callable[[int], None] | None = None) -> str:
        """Import a directory tree: each file through the daemon's ``add`` (its CID checked against the
        local computation), then the directory and HAMT blocks through ``block/put``; the root is
        pinned last. Resumable through ``journal``; ``progress`` gets the bytes done after each file.
        """
        opts = options or AddOptions()
        if only_hash:  # nothing reaches the daemon: the CID is computed here
            return await asyncio.to_thread(compute_directory_cid, Path(path), opts, hidden=hidden)
        steps = import_steps(Path(path), opts, hidden=hidden)
        tracker = ImportTracker(await asyncio.to_thread(ImportJournal, journal, path, opts, hidden) if journal
                                else None, progress)
        try:
            request = await asyncio.to_thread(_step, steps, None)
            while not isinstance(request, str):
                if isinstance(request, FileRequest):
                    result = tracker.reuse(request)
                    fresh = result is None
                    if result is None:
                        result = await self._add_file(request.path, opts)
                    await asyncio.to_thread(tracker.finished, request, result, fresh=fresh)
                    request = await asyncio.to_thread(_step, steps, result)
                else:
                    await self.put_blocks(request)
                    request = await asyncio.to_thread(_step, steps, None)
            root = request
        except OSError as exc:
            raise StorageError(f"cannot add {path}: {exc}") from exc
        finally:
            tracker.close()
        if pin:
            await self.pin(root)
        return root

    async def cat(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S, offset: int = 0, length: int | None = None) -> bytes:
        out = io.BytesIO()  # getvalue() hands over its buffer: the content is held once, not twice
        async for chunk in self.stream(cid, max_bytes=max_bytes, timeout_s=timeout_s, offset=offset, length=length):
            out.write(chunk)
        return out.getvalue()

    async def stream(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                     timeout_s: float | None = DEFAULT_TIMEOUT_S, offset: int = 0,
                     length: int | None = None) -> AsyncIterator[bytes]:
        """Yield the content (or the range) in order; each block is checked against its CID and the
        limits before use, and only the blocks that overlap the range are fetched.

        The walk is a loop over a stack of sibling prefetchers, so DAG depth costs no recursion.
        """
        check_range(offset, length)
        deadline = deadline_after(timeout_s)
        root = await self._resolve(cid, deadline)  # InvalidCidError before any I/O
        budget = DagBudget(root, max_bytes, deadline, offset, length)
        if self._car and offset == 0 and length is None:
            started = False
            try:
                async for chunk in self._stream_car(root, budget):
                    started = True
                    yield chunk
                return
            except UnsupportedEndpointError:
                if started:
                    raise
                self._car = False  # this daemon has no dag/export: read block by block from now on
                budget = DagBudget(root, max_bytes, deadline, offset, length)
        node = budget.accept(root, await self._within(budget, self._get_verified(root)), None, 0)
        data, children = node_parts(node, 0, budget.lo, budget.hi)
        if data:
            yield data
        stack = [self._fetch_in_order(children)]
        try:
            while stack:
                nxt = await self._within(budget, anext(stack[-1], None))
                if nxt is None:
                    await stack.pop().aclose()
                    continue
                child, size, start, block = nxt
                node = budget.accept(child, block, size, len(stack))
                data, children = node_parts(node, start, budget.lo, budget.hi)
                if data:
                    yield data
                if children:
                    stack.append(self._fetch_in_order(children))
        finally:
            for pending in reversed(stack):  # the consumer stopped early or a limit was hit
                await pending.aclose()

    async def size(self, cid: str) -> int:
        """The file size the root block of ``cid`` (or of ``CID/path``) declares."""
        raw = await self._resolve(cid, None)
        return read_file_node(raw, await self._get_verified(raw)).size

    async def resolve(self, path: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> str:
        """``CID/a/b`` -> the CID it names, through directories and HAMT shards, each block verified."""
        return cid_to_str(await self._resolve(path, deadline_after(timeout_s)))

    async def walk_directory(self, cid: str, *, max_entries: int = DEFAULT_MAX_ENTRIES,
                             timeout_s: float | None = DEFAULT_TIMEOUT_S) -> AsyncIterator[DirEntry]:
        """Every file and directory below ``cid`` (depth first, name order), each block verified."""
        deadline = deadline_after(timeout_s)
        steps = walk_steps(await self._resolve(cid, deadline), max_entries)
        sent: bytes | None = None
        while True:
            try:
                step = steps.send(sent)
            except StopIteration:
                return
            if isinstance(step, DirEntry):
                sent = None
                yield step
            else:
                sent = await self._within_deadline(deadline, cid, self._get_verified(step))

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

    async def _add_file(self, path: Path, opts: AddOptions) -> tuple[bytes, int]:
        """One file through the daemon (unpinned), its CID and Tsize computed here and compared."""
        local = asyncio.ensure_future(asyncio.to_thread(file_dag, path, opts, None))
        try:
            remote = await self.client.add(path, cid_version=opts.cid_version, raw_leaves=opts.use_raw_leaves,
                                           chunker=f"size-{opts.chunk_size}", pin=False)
        except BaseException:
            await asyncio.gather(local, return_exceptions=True)
            raise
        raw_cid, tsize = await local
        if cid_from_str(remote) != raw_cid:
            raise IntegrityError(f"IPFS API {self.client.api_url} returned {remote} for {path}, whose"
                                 f" CID is {cid_to_str(raw_cid)} ({opts})")
        return raw_cid, tsize

    async def _resolve(self, path: str, deadline: float | None) -> bytes:
        root, segments = parse_content_path(path)
        if not segments:
            return root
        steps: Generator[bytes, bytes, bytes] = resolve_steps(root, segments)
        try:
            need = next(steps)
            while True:
                need = steps.send(await self._within_deadline(deadline, path, self._get_verified(need)))
        except StopIteration as done:
            return bytes(done.value)

    async def _get_verified(self, raw_cid: bytes) -> bytes:
        block = await self.client.block_get(cid_to_str(raw_cid))
        _, _, digest = decode_cid_bytes(raw_cid)
        if hashlib.sha256(block).digest() != digest:
            raise IntegrityError(f"block {cid_to_str(raw_cid)} from {self.client.api_url} does not match its hash")
        return block

    @staticmethod
    async def _within(budget: DagBudget, step: Awaitable[T]) -> T:
        """Await one fetch under the read's total deadline."""
        return await KuboContentStore._within_deadline(budget.deadline, budget.root, step)

    @staticmethod
    async def _within_deadline(deadline: float | None, what: str, step: Awaitable[T]) -> T:
        if deadline is None:
            return await step
        try:
            async with asyncio.timeout(max(0.0, deadline - time.monotonic())):
                return await step
        except TimeoutError as exc:
            raise FetchLimitError(f"reading {what} timed out") from exc

    async def _stream_car(self, root: bytes, budget: DagBudget) -> AsyncIterator[bytes]:
        """The whole file from one ``dag/export`` CAR, each block checked as it arrives.

        A block the exporter sent once but the file uses again, and that the reader no longer
        holds, is fetched with ``block/get`` (and checked too).
        """
        reader = CarFileReader(root, budget)
        chunks = aiter(self.client.dag_export(cid_to_str(root)))
        try:
            while (piece := await self._within(budget, anext(chunks, None))) is not None:
                out = reader.feed(piece)
                while True:
                    for data in out:
                        yield data
                    if reader.wants is None:
                        break
                    out = reader.supply(reader.wants, await self._within(budget, self._get_verified(reader.wants)))
            reader.finish()
        except IncompleteCarError as exc:
            raise ContentNotFoundError(f"IPFS API {self.client.api_url}: dag/export {budget.root}: content not found"
                                       f" in time ({exc})") from exc
        finally:
            await chunks.aclose()  # type: ignore[attr-defined]

    async def _fetch_in_order(self, children: list[Child]) -> AsyncIterator[tuple[bytes, int, int, bytes]]:
        """Children as (CID, declared size, start, verified block) in link order, up to ``prefetch`` ahead.

        Only children of a node that passed its size checks are ever requested.
        """
        queue: deque[tuple[bytes, int, int, asyncio.Task[bytes]]] = deque()
        ahead = iter(children)
        try:
            for cid, size, start in islice(ahead, self._prefetch):
                queue.append((cid, size, start, asyncio.ensure_future(self._get_verified(cid))))
            while queue:
                cid, size, start, task = queue.popleft()
                block = await task
                for nxt, nxt_size, nxt_start in islice(ahead, 1):
                    queue.append((nxt, nxt_size, nxt_start, asyncio.ensure_future(self._get_verified(nxt))))
                yield cid, size, start, block
        finally:
            for *_, task in queue:  # the consumer stopped early or a block failed
                task.cancel()
            await asyncio.gather(*(t for *_, t in queue), return_exceptions=True)
