"""A local blockstore that gives the CIDs ``ipfs add`` gives, and verifies every read.

Layout under ``root``::

    blocks/<xy>/<key>   one file per block; key = base32 of the binary CID, xy = key[-3:-1]
    packs/<id>.pack     the blocks of one large ``add``, back to back
    packs/<id>.idx      where each block of that pack is; written (renamed into place) last
    pins/<key>          one empty file per pinned root

An ``add`` of at least ``pack_min_bytes`` goes to one pack (:mod:`._packs`), not a file per
block: 1 GB is one sequential write, not 4,000 files. Pack and index are renamed into place
when the import is done, index last: an interrupted import leaves nothing a reader uses.

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
import time
import uuid
from collections.abc import AsyncIterator, Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from ..errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from ._bounds import MAX_BLOCK_BYTES, check_range, deadline_after, read_file_node, walk_file
from ._directory_import import FileRequest, ImportJournal, ImportTracker, import_steps, run_import
from ._packs import PackIndex, PackWriter
from ._paths import drive, parse_content_path, resolve_steps, walk_steps
from ._port import DEFAULT_MAX_BYTES, DEFAULT_MAX_ENTRIES, DEFAULT_TIMEOUT_S, AddOptions, DirEntry
from ._unixfs import (
    Block,
    FileDagBuilder,
    cid_from_str,
    cid_to_str,
    decode_cid_bytes,
    split,
)

_DEFAULT_READ_BATCH = 4 * 1024 * 1024
_DEFAULT_PACK_MIN = 8 * 1024 * 1024
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
    return cid_to_str(file_dag(Path(path), options, None)[0])


def file_dag(path: Path, options: AddOptions | None, put: Callable[[str, bytes], None] | None) -> tuple[bytes, int]:
    """Chunk one file into its DAG, handing each block to ``put`` (None: only hash); (root CID, Tsize)."""
    builder = FileDagBuilder(options, emit_blocks=put is not None)
    for chunk in read_chunks(path, builder.chunk_size):
        for cid, block in builder.add_chunk(chunk):
            put(cid, block)  # type: ignore[misc]  # emit_blocks is off without put: no blocks come
    last, root = builder.finish()
    for cid, block in last:
        put(cid, block)  # type: ignore[misc]
    return cid_from_str(root), builder.root_tsize


def compute_directory_cid(path: Path, options: AddOptions | None = None, *, hidden: bool = False) -> str:
    """``ipfs add -r --only-hash`` for a directory, with bounded memory. Blocking."""
    opts = options or AddOptions()
    return run_import(import_steps(Path(path), opts, hidden=hidden), ImportTracker(None, None),
                      lambda request: file_dag(request.path, opts, None), lambda blocks: None, lambda cid: True)


class LocalContentStore:
    """The ContentStore port over a directory.

    ``add(..., only_hash=True)`` computes the CID without storing or pinning anything.
    ``pin`` needs the root block to be present; ``unpin`` of an unpinned CID is a no-op.
    """

    def __init__(self, root: Path, *, read_batch_bytes: int = _DEFAULT_READ_BATCH,
                 pack_min_bytes: int = _DEFAULT_PACK_MIN) -> None:
        self.root = Path(root)
        self._blocks = self.root / "blocks"
        self._packs = PackIndex(self.root / "packs")
        self._pins = self.root / "pins"
        self._read_batch = read_batch_bytes
        self._pack_min = pack_min_bytes
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

    async def add_directory(self, path: Path, *, pin: bool = True, options: AddOptions | None = None,
                            only_hash: bool = False, hidden: bool = False, journal: Path | None = None,
                            progress: Callable[[int], None] | None = None) -> str:
        """Import a directory tree (the CID ``ipfs add -r`` prints); resumable through ``journal``.

        ``progress`` is called in a worker thread with the bytes done after each file.
        """
        return await self._io(self._add_directory_sync, Path(path), pin, options or AddOptions(), only_hash,
                              hidden, journal, progress)

    async def cat(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S, offset: int = 0, length: int | None = None) -> bytes:
        check_range(offset, length)
        deadline = deadline_after(timeout_s)  # checked at every block by the walk in the worker thread
        return await self._io(lambda: b"".join(self._iter_content(cid, max_bytes, deadline, offset, length)))

    async def stream(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                     timeout_s: float | None = DEFAULT_TIMEOUT_S, offset: int = 0,
                     length: int | None = None) -> AsyncIterator[bytes]:
        """Yield the content in order; blocks are read and verified a batch at a time.

        A bad or missing block raises after every verified chunk before it was yielded.
        """
        check_range(offset, length)
        chunks = self._iter_content(cid, max_bytes, deadline_after(timeout_s), offset, length)
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
        """The file size the root block of ``cid`` (or of ``CID/path``) declares."""
        def read() -> int:
            raw = self._resolve_sync(cid, None)
            return read_file_node(raw, self._get_block(raw)).size
        return await self._io(read)

    async def resolve(self, path: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> str:
        """``CID/a/b`` -> the CID it names, through directories and HAMT shards, each block verified."""
        deadline = deadline_after(timeout_s)
        return cid_to_str(await self._io(self._resolve_sync, path, deadline))

    async def walk_directory(self, cid: str, *, max_entries: int = DEFAULT_MAX_ENTRIES,
                             timeout_s: float | None = DEFAULT_TIMEOUT_S) -> AsyncIterator[DirEntry]:
        """Every file and directory below ``cid`` (depth first, name order), read a batch at a time."""
        deadline = deadline_after(timeout_s)
        steps = walk_steps(await self._io(self._resolve_sync, cid, deadline), max_entries)
        sent: bytes | None = None
        while True:
            batch, sent, done = await self._io(self._walk_batch, steps, sent, deadline)
            for entry in batch:
                yield entry
            if done:
                return

    async def put_blocks(self, blocks: Iterable[Block]) -> int:
        """Store raw blocks as they are (e.g. from another store), each checked against its CID."""
        return await self._io(self._put_blocks_sync, list(blocks))

    async def has(self, cid: str) -> bool:
        """Whether the root block of ``cid`` is stored (children are not checked)."""
        return await self._io(self._has_block, cid_from_str(cid))

    # --- blocking helpers (run in a worker thread)

    async def _io(self, fn: Callable[..., T], *args: object) -> T:
        try:
            return await asyncio.to_thread(fn, *args)
        except OSError as exc:  # map file-system failures onto the SDK's error root
            raise StorageError(f"content store {self.root}: {exc}") from exc

    def _add_directory_sync(self, path: Path, pin: bool, options: AddOptions, only_hash: bool, hidden: bool,
                            journal: Path | None, progress: Callable[[int], None] | None) -> str:
        put = None if only_hash else self._put_block
        tracker = ImportTracker(ImportJournal(journal, path, options, hidden) if journal else None, progress)

        def add_file(request: FileRequest) -> tuple[bytes, int]:
            return file_dag(request.path, options, put)

        def put_blocks(blocks: list[Block]) -> None:
            for cid, block in blocks if put else ():
                self._put_block(cid, block)

        def has_block(raw_cid: bytes) -> bool:  # a journalled file counts only while its root is stored
            return only_hash or self._has_block(raw_cid)

        root = run_import(import_steps(path, options, hidden=hidden), tracker, add_file, put_blocks, has_block)
        if pin and not only_hash:
            self._pin_sync(cid_from_str(root))
        return root

    def _resolve_sync(self, path: str, deadline: float | None) -> bytes:
        root, segments = parse_content_path(path)
        return drive(resolve_steps(root, segments), self._timed_get(deadline)) if segments else root

    def _timed_get(self, deadline: float | None) -> Callable[[bytes], bytes]:
        def get(raw_cid: bytes) -> bytes:
            if deadline is not None and time.monotonic() > deadline:
                raise FetchLimitError(f"reading {cid_to_str(raw_cid)} timed out")
            return self._get_block(raw_cid)
        return get

    def _walk_batch(self, steps: Generator[bytes | DirEntry, bytes | None, None], sent: bytes | None,
                    deadline: float | None) -> tuple[list[DirEntry], bytes | None, bool]:
        """Advance a walk until a batch of entries is found; (entries, value to send next, finished)."""
        get = self._timed_get(deadline)
        batch: list[DirEntry] = []
        try:
            while len(batch) < 256:
                step = steps.send(sent)
                if isinstance(step, DirEntry):
                    batch.append(step)
                    sent = None
                else:
                    sent = get(step)
        except StopIteration:
            return batch, None, True
        return batch, sent, False

    def _add_sync(self, data: bytes | Path, pin: bool, options: AddOptions | None, only_hash: bool) -> str:
        builder = FileDagBuilder(options, emit_blocks=not only_hash)
        if isinstance(data, Path):
            chunks, size = read_chunks(data, builder.chunk_size), data.stat().st_size
        else:
            chunks, size = split(data, builder.chunk_size), len(data)
        pack = PackWriter(self._packs.folder) if not only_hash and size >= self._pack_min else None
        put = (lambda cid, block: pack.put(cid_from_str(cid), block)) if pack else self._put_block
        try:
            for chunk in chunks:
                for cid, block in builder.add_chunk(chunk):
                    put(cid, block)
            last, root = builder.finish()
            for cid, block in last:
                put(cid, block)
            if pack:
                pack.commit()
                self._packs.add(pack.name, pack.entries)
        except BaseException:
            if pack:
                pack.abort()
            raise
        if pin and not only_hash:
            self._pin_sync(cid_from_str(root))
        return root

    def _has_block(self, raw_cid: bytes) -> bool:
        return self._packs.find(raw_cid, refresh=False) is not None or self._block_path(raw_cid).is_file() \
            or self._packs.find(raw_cid) is not None

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
            block = self._read_block(raw_cid)
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

    def _read_block(self, raw_cid: bytes) -> bytes:
        """A block's stored bytes (unchecked), from a pack or its own file; FileNotFoundError if absent."""
        if self._packs.find(raw_cid, refresh=False) is None:
            try:
                with open(self._block_path(raw_cid), "rb") as f:
                    return f.read(MAX_BLOCK_BYTES + 1)
            except FileNotFoundError:
                if self._packs.find(raw_cid) is None:  # perhaps packed since this store last looked
                    raise
        return self._packs.read(raw_cid, MAX_BLOCK_BYTES + 1)

    def _iter_content(self, cid: str, max_bytes: int | None, deadline: float | None, offset: int = 0,
                      length: int | None = None) -> Generator[bytes, None, None]:
        raw = self._resolve_sync(cid, deadline)  # raises InvalidCidError before any I/O
        yield from walk_file(raw, self._get_block, max_bytes=max_bytes, deadline=deadline, offset=offset,
                             length=length)

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
        if not self._has_block(raw_cid):
            raise ContentNotFoundError(f"cannot pin {cid_to_str(raw_cid)}: it is not stored")
        path = self._pins / _key(raw_cid)
        if not path.exists():
            self._write_atomic(path, b"")

    def _pins_sync(self) -> list[str]:
        if not self._pins.is_dir():
            return []
        return sorted(cid_to_str(_unkey(p.name)) for p in self._pins.iterdir() if not p.name.startswith("."))
