"""A local blockstore that gives the CIDs ``ipfs add`` gives, and verifies every read.

Layout under ``root``::

    blocks/<xy>/<key>   one file per block; key = base32 of the binary CID, xy = key[-3:-1]
    pins/<key>          one empty file per pinned root

Keys are lower-case base32 so the store also works on case-insensitive file systems
(base58 CIDv0 strings differ only by case in places). Block writes are atomic (temp
file + ``os.replace``) but not fsynced: a crash may lose recent blocks, never corrupt one.
Blocking file I/O runs in ``asyncio.to_thread``: a whole ``add`` or ``cat`` is one hop,
``stream`` hops once per ``read_batch_bytes`` of content.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from .bounds import MAX_BLOCK_BYTES, deadline_after, read_file_node, walk_file
from .port import DEFAULT_MAX_BYTES, DEFAULT_TIMEOUT_S, AddOptions
from .unixfs import (
    Block,
    Buffer,
    FileDagBuilder,
    cid_from_str,
    cid_to_str,
    decode_cid_bytes,
    split,
)

_DEFAULT_READ_BATCH = 4 * 1024 * 1024
T = TypeVar("T")


def _key(raw_cid: bytes) -> str:
    return base64.b32encode(raw_cid).decode("ascii").lower().rstrip("=")


def _unkey(key: str) -> bytes:
    body = key.upper()
    return base64.b32decode(body + "=" * (-len(body) % 8))


def read_chunks(path: Path, chunk_size: int) -> Iterator[memoryview]:
    """Yield full ``chunk_size`` views of one reused buffer (the last may be short).

    Like Go's ``io.ReadFull``: short reads are retried so chunk boundaries never depend on
    how the OS splits reads. Consumers must finish with a view before asking for the next.
    """
    buf = bytearray(chunk_size)
    view = memoryview(buf)
    with open(path, "rb", buffering=0) as f:
        while True:
            filled = 0
            while filled < chunk_size:
                n = f.readinto(view[filled:])
                if not n:
                    break
                filled += n
            if filled:
                yield view[:filled]
            if filled < chunk_size:
                return


def compute_file_cid(path: Path, options: AddOptions | None = None) -> str:
    """``ipfs add --only-hash`` for a file on disk, with bounded memory. Blocking."""
    builder = FileDagBuilder(options, emit_blocks=False)
    for chunk in read_chunks(Path(path), builder.chunk_size):
        builder.add_chunk(chunk)
    return builder.finish()[1]


class LocalContentStore:
    """The ContentStore port over a directory.

    ``add(..., only_hash=True)`` computes the CID without storing or pinning anything.
    ``pin`` needs the root block to be present; ``unpin`` of an unpinned CID is a no-op.
    """

    def __init__(self, root: Path, *, read_batch_bytes: int = _DEFAULT_READ_BATCH) -> None:
        self.root = Path(root)
        self._blocks = self.root / "blocks"
        self._pins = self.root / "pins"
        self._read_batch = read_batch_bytes
        self._made_dirs: set[Path] = set()

    # --- port methods

    async def add(
        self,
        data: bytes | Path,
        *,
        pin: bool = True,
        options: AddOptions | None = None,
        only_hash: bool = False,
    ) -> str:
        return await self._io(self._add_sync, data, pin, options, only_hash)

    async def cat(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bytes:
        deadline = deadline_after(timeout_s)  # checked at every block by the walk in the worker thread
        return await self._io(lambda: b"".join(self._iter_content(cid, max_bytes, deadline)))

    async def stream(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                     timeout_s: float | None = DEFAULT_TIMEOUT_S) -> AsyncIterator[bytes]:
        """Yield the content in order; blocks are read and verified a batch at a time.

        A bad or missing block raises after every verified chunk before it was yielded.
        """
        chunks = self._iter_content(cid, max_bytes, deadline_after(timeout_s))
        try:
            while True:
                batch, error = await asyncio.to_thread(self._take_batch, chunks)
                for chunk in batch:
                    yield chunk
                if error is not None:
                    raise error
                if not batch:
                    return
        finally:
            try:
                chunks.close()
            except ValueError:  # cancelled while a worker thread still runs the walk
                pass

    async def pin(self, cid: str) -> None:
        await self._io(self._pin_sync, cid_from_str(cid))

    async def unpin(self, cid: str) -> None:
        await self._io((self._pins / _key(cid_from_str(cid))).unlink, True)

    async def pins(self) -> list[str]:
        return await self._io(self._pins_sync)

    async def size(self, cid: str) -> int:
        """The file size the root block of ``cid`` declares."""
        raw = cid_from_str(cid)
        return await self._io(lambda: read_file_node(raw, self._get_block(raw)).size)

    async def put_blocks(self, blocks: Iterable[Block]) -> int:
        """Store raw blocks as they are (e.g. from another store), each checked against its CID."""
        return await self._io(self._put_blocks_sync, list(blocks))

    async def has(self, cid: str) -> bool:
        """Whether the root block of ``cid`` is stored (children are not checked)."""
        return await self._io(self._block_path(cid_from_str(cid)).is_file)

    # --- blocking helpers (run in a worker thread)

    async def _io(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except OSError as exc:  # map file-system failures onto the SDK's error root
            raise StorageError(f"content store {self.root}: {exc}") from exc

    def _add_sync(self, data: bytes | Path, pin: bool, options: AddOptions | None, only_hash: bool) -> str:
        builder = FileDagBuilder(options, emit_blocks=not only_hash)
        chunks: Iterator[Buffer]
        if isinstance(data, Path):
            chunks = read_chunks(data, builder.chunk_size)
        else:
            chunks = split(data, builder.chunk_size)
        for chunk in chunks:
            for cid, block in builder.add_chunk(chunk):
                self._put_block(cid, block)
        last, root = builder.finish()
        for cid, block in last:
            self._put_block(cid, block)
        if pin and not only_hash:
            self._pin_sync(cid_from_str(root))
        return root

    def _block_path(self, raw_cid: bytes) -> Path:
        key = _key(raw_cid)
        return self._blocks / key[-3:-1] / key

    def _put_block(self, cid: str, block: bytes) -> None:
        path = self._block_path(cid_from_str(cid))
        if path.exists():  # content addressed: same name, same bytes
            return
        self._write_atomic(path, block)

    def _write_atomic(self, path: Path, data: bytes) -> None:
        parent = path.parent
        if parent not in self._made_dirs:
            parent.mkdir(parents=True, exist_ok=True)
            self._made_dirs.add(parent)
        tmp = parent / f".{path.name}.{uuid.uuid4().hex}.tmp"
        try:
            try:
                f = open(tmp, "wb")
            except FileNotFoundError:  # the shard dir was removed behind our back
                parent.mkdir(parents=True, exist_ok=True)
                f = open(tmp, "wb")
            with f:
                f.write(data)
            os.replace(tmp, path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def _put_blocks_sync(self, blocks: list[Block]) -> int:
        for cid, block in blocks:
            _, _, digest = decode_cid_bytes(cid_from_str(cid))
            if hashlib.sha256(block).digest() != digest:
                raise IntegrityError(f"block {cid} does not match its hash")
            self._put_block(cid, block)
        return len(blocks)

    def _get_block(self, raw_cid: bytes) -> bytes:
        """Read one block (at most MAX_BLOCK_BYTES) and check it hashes to its CID."""
        try:
            with open(self._block_path(raw_cid), "rb") as f:
                block = f.read(MAX_BLOCK_BYTES + 1)
            if len(block) > MAX_BLOCK_BYTES:
                raise FetchLimitError(f"block {cid_to_str(raw_cid)} is over the {MAX_BLOCK_BYTES}-byte block limit")
        except FileNotFoundError as exc:
            raise ContentNotFoundError(f"block {cid_to_str(raw_cid)} is not in {self.root}") from exc
        except OSError as exc:
            raise StorageError(f"could not read block {cid_to_str(raw_cid)}: {exc}") from exc
        _, _, digest = decode_cid_bytes(raw_cid)
        if hashlib.sha256(block).digest() != digest:
            raise IntegrityError(f"block {cid_to_str(raw_cid)} does not match its hash")
        return block

    def _iter_content(self, cid: str, max_bytes: int | None, deadline: float | None) -> Generator[bytes, None, None]:
        raw = cid_from_str(cid)  # raises InvalidCidError before any I/O
        yield from walk_file(raw, self._get_block, max_bytes=max_bytes, deadline=deadline)

    def _take_batch(self, chunks: Iterator[bytes]) -> tuple[list[bytes], StorageError | None]:
        batch: list[bytes] = []
        size = 0
        try:
            for chunk in chunks:
                batch.append(chunk)
                size += len(chunk)
                if size >= self._read_batch:
                    break
        except StorageError as exc:  # hand over what was verified, then the error
            return batch, exc
        return batch, None

    def _pin_sync(self, raw_cid: bytes) -> None:
        if not self._block_path(raw_cid).is_file():
            raise ContentNotFoundError(f"cannot pin {cid_to_str(raw_cid)}: it is not stored")
        path = self._pins / _key(raw_cid)
        if not path.exists():
            self._write_atomic(path, b"")

    def _pins_sync(self) -> list[str]:
        if not self._pins.is_dir():
            return []
        return sorted(cid_to_str(_unkey(p.name)) for p in self._pins.iterdir() if not p.name.startswith("."))
