"""The content cache's files: checked keys, one entry's files on disk, streaming a download into one.

Blocking functions here run in worker threads (``ContentCache`` calls them through ``asyncio.to_thread``).
The layout and the verification rules are described in :mod:`.cache`.
"""

from __future__ import annotations

import asyncio
import hashlib
import inspect
import json
import os
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import AitbcError, FetchLimitError, StorageError, UnsafeNameError
from ..storage import ContentStore, cid_from_str

ENTRIES_DIR = "entries"
PARTIAL_DIR = "partial"
META_SUFFIX = ".meta"
META_MAX_BYTES = 64 * 1024
WRITE_BATCH_BYTES = 4 * 1024 * 1024  # chunks written (and hashed) per hop to a worker thread
HASH_READ_BYTES = 1024 * 1024
MAX_ADDRESS_CHARS = 4096
ENTRY_NAME = re.compile(r"[0-9a-f]{64}")
PARTIAL_NAME = re.compile(r"[0-9a-f]{64}\.[0-9a-f]{32}(\.meta)?|trash-[0-9a-f]{32}")  # what we write in partial/


@dataclass(frozen=True)
class CacheKey:
    """What one entry holds: ``length`` bytes (None: to the end) from ``offset`` of ``address``."""

    address: str  # a CID, or CID/path into a directory; checked by cache_key
    offset: int = 0
    length: int | None = None

    @property
    def name(self) -> str:
        """The entry's file name: a hash of the checked key, never the key itself."""
        text = json.dumps([self.address, self.offset, self.length], separators=(",", ":"))
        return hashlib.sha256(text.encode()).hexdigest()


def cache_key(address: str, offset: int = 0, length: int | None = None) -> CacheKey:
    """The checked key: InvalidCidError for a bad CID, UnsafeNameError for a bad path, StorageError for a bad range."""
    root, _, path = address.partition("/")
    cid_from_str(root)
    if path and (len(address) > MAX_ADDRESS_CHARS
                 or any(s in ("", ".", "..") or "\0" in s for s in path.split("/"))):
        raise UnsafeNameError(f"{address[:200]!r} is not a CID followed by a plain path")
    if offset < 0 or (length is not None and length < 0):
        raise StorageError(f"bad byte range: offset {offset}, length {length}")
    return CacheKey(address, offset, length)


@dataclass(eq=False)
class CacheEntry:
    key: CacheKey
    path: Path
    size: int
    digest: str  # SHA-256 hex of the content
    mtime_ns: int
    verified: bool  # hashed (or written) by this process
    kept: bool = True  # False: larger than the quota, a temp file deleted when no longer held
    holds: int = 0
    gone: bool = False


def meta_path(path: Path) -> Path:
    return path.with_name(path.name + META_SUFFIX)


# --- reading content from the store


def _takes_ranges(store: ContentStore) -> bool:
    try:
        parameters = inspect.signature(store.stream).parameters
    except (TypeError, ValueError):
        return False
    return "offset" in parameters and "length" in parameters


def read_range(store: ContentStore, address: str, *, size: int, offset: int = 0, length: int | None = None,
               timeout_s: float | None = None) -> AsyncIterator[bytes]:
    """Yield ``length`` bytes (None: to the end) from ``offset`` of ``address``, each block verified by the store.

    A store whose ``stream`` takes ``offset``/``length`` reads the range only; another streams
    from the start and this slices. ``size`` bounds the bytes returned (the caller counts them too).
    Close what it returns (``aclose``) when stopping early.
    """
    if offset == 0 and length is None:
        return store.stream(address, max_bytes=size, timeout_s=timeout_s)
    if _takes_ranges(store):  # its max_bytes bounds the bytes of the range
        return store.stream(address, offset=offset, length=length, max_bytes=size, timeout_s=timeout_s)
    # Without ranges max_bytes bounds the file: none for a bounded range (the walk is lazy and this
    # stops at its end), the end of an open one at offset + size.
    limit = None if length is not None else offset + size
    return _sliced(store.stream(address, max_bytes=limit, timeout_s=timeout_s), offset, length)


async def _sliced(stream: AsyncIterator[bytes], offset: int, length: int | None) -> AsyncIterator[bytes]:
    end = None if length is None else offset + length
    position = 0
    try:
        async for chunk in stream:
            start, position = position, position + len(chunk)
            if position > offset:
                piece = chunk[max(offset - start, 0):None if end is None else end - start]
                if piece:
                    yield piece
            if end is not None and position >= end:
                return
    finally:
        await aclose(stream)


async def aclose(stream: AsyncIterator[bytes]) -> None:
    closer = getattr(stream, "aclose", None)
    if closer is not None:
        await closer()


async def download_to(temp: Path, store: ContentStore, key: CacheKey, size: int,
                      timeout_s: float) -> tuple[int, str]:
    """Stream ``key`` into the new file ``temp``: (bytes, SHA-256 hex). More than ``size`` is a FetchLimitError;
    on any failure ``temp`` is removed."""
    hasher = hashlib.sha256()
    written, batch, batched = 0, [], 0
    try:
        out = await asyncio.to_thread(open, temp, "xb")
    except OSError as exc:
        raise StorageError(f"the content cache cannot write {temp}: {exc}") from exc
    stream = read_range(store, key.address, size=size, offset=key.offset, length=key.length, timeout_s=timeout_s)
    try:
        async for chunk in stream:
            written += len(chunk)
            if written > size:
                raise FetchLimitError(f"{key.address} holds more than the {size} bytes declared")
            batch.append(chunk)
            batched += len(chunk)
            if batched >= WRITE_BATCH_BYTES:
                await asyncio.to_thread(_write_batch, out, hasher, batch)
                batch, batched = [], 0
        await asyncio.to_thread(_write_batch, out, hasher, batch)
        await asyncio.to_thread(out.close)
    except BaseException as exc:
        out.close()
        temp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise StorageError(f"the content cache cannot write {temp}: {exc}") from exc
        raise
    finally:
        await aclose(stream)  # stopped early (a size breach): the store's walk ends here
    return written, hasher.hexdigest()


def _write_batch(out: BinaryIO, hasher: hashlib._Hash, batch: list[bytes]) -> None:
    for chunk in batch:
        hasher.update(chunk)
        out.write(chunk)


# --- one entry's files (blocking)


def commit_download(root: Path, key: CacheKey, temp: Path, size: int, digest: str, kept: bool) -> CacheEntry:
    """Make the download ``temp`` an entry: renamed into ``entries/`` with its ``.meta`` when it is kept."""
    os.chmod(temp, 0o444)  # a job that opens its link for writing fails; the mtime check catches the rest
    path = temp
    if kept:
        path = root / ENTRIES_DIR / key.name
        meta = {"address": key.address, "offset": key.offset, "length": key.length, "size": size, "sha256": digest}
        meta_temp = meta_path(temp)
        meta_temp.write_text(json.dumps(meta))
        os.replace(temp, path)  # content first: a crash before the .meta leaves an orphan, removed at open
        os.replace(meta_temp, meta_path(path))
    return CacheEntry(key, path, size, digest, os.stat(path).st_mtime_ns, verified=True, kept=kept)


def entry_intact(entry: CacheEntry, *, rehash: bool) -> bool:
    """Whether the file still has the size and mtime it was written with (and, ``rehash``, its SHA-256).
    Touches the ``.meta``'s mtime: the entry's last use, for the LRU order after a restart."""
    try:
        info = os.stat(entry.path)
        if entry.kept:
            os.utime(meta_path(entry.path))
        if info.st_size != entry.size or info.st_mtime_ns != entry.mtime_ns:
            return False
        return not rehash or file_digest(entry.path) == entry.digest
    except OSError:
        return False


def file_digest(path: Path) -> str:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(HASH_READ_BYTES):
            hasher.update(block)
    return hasher.hexdigest()


def scan_entries(root: Path) -> list[CacheEntry]:
    """The kept entries on disk, least recently used first. Deletes our leftovers in ``partial/`` and
    entries without a matching ``.meta``; files with names we never write are left alone."""
    entries, partial = root / ENTRIES_DIR, root / PARTIAL_DIR
    entries.mkdir(parents=True, exist_ok=True)
    partial.mkdir(parents=True, exist_ok=True)
    for leftover in os.listdir(partial):
        if PARTIAL_NAME.fullmatch(leftover):
            (partial / leftover).unlink(missing_ok=True)
    found: list[tuple[int, CacheEntry]] = []
    names = set(os.listdir(entries))
    for name in names:
        if ENTRY_NAME.fullmatch(name):
            loaded = _load_entry(entries / name)
            if loaded is None:
                (entries / name).unlink(missing_ok=True)
                meta_path(entries / name).unlink(missing_ok=True)
            else:
                found.append(loaded)
        elif name.endswith(META_SUFFIX) and ENTRY_NAME.fullmatch(content := name[:-len(META_SUFFIX)]) \
                and content not in names:
            (entries / name).unlink(missing_ok=True)
    return [entry for _, entry in sorted(found, key=lambda pair: pair[0])]


def _load_entry(path: Path) -> tuple[int, CacheEntry] | None:
    """(last use, entry) from an entry's file and its ``.meta``; None when they do not agree."""
    try:
        meta_info, info = os.stat(meta_path(path)), os.stat(path)
        if meta_info.st_size > META_MAX_BYTES:
            return None
        meta = json.loads(meta_path(path).read_text())
        key = cache_key(meta["address"], meta["offset"], meta["length"])
        size, digest = meta["size"], meta["sha256"]
    except (OSError, ValueError, KeyError, TypeError, AitbcError):
        return None
    if (key.name != path.name or not isinstance(size, int) or size != info.st_size
            or not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest)):
        return None
    return meta_info.st_mtime_ns, CacheEntry(key, path, size, digest, info.st_mtime_ns, verified=False)
