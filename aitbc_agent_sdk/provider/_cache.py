"""The provider's content cache: fetched content kept on disk by CID, within a size quota (LRU).

A job's shard and weights used to be downloaded again for every job, because the job directory
goes with the job. The cache keeps each fetched content (a whole file, or one byte range of it)
as one file, verified once, and the job directory gets a hard link to it:

* **Keys** are (CID or ``CID/path``, offset, length). The CID is parsed and every path segment
  checked before anything else; an entry's file name is the SHA-256 of the checked key, so no
  name on disk comes from a network string.
* **Layout** under ``root``: ``entries/<name>`` (the content, read-only), ``entries/<name>.meta``
  (its key, size and SHA-256, JSON; its mtime is the entry's last use) and ``partial/`` (downloads
  under way, and files waiting to be deleted). Writes are temp file + rename, not fsynced: a crash
  may lose an entry, never leave a wrong one under its name.
* **Restart.** ``open()`` rebuilds the index from ``entries/`` (least recently used first, by the
  ``.meta`` mtime), deletes anything of ours left in ``partial/`` and what has no valid ``.meta``.
* **Verification.** The store verifies every block as it streams; the cache records the SHA-256 of
  what it wrote. A hit checks the file's size and mtime (a cheap ``stat``: catches a truncated or
  rewritten file); the first hit after a restart also re-hashes the file against the recorded
  SHA-256 (catches what changed while the provider was down). A bad file is dropped and fetched
  again, and counted in ``stats.corrupt``.
* **Quota.** After each download, and when a hold ends, the least recently used entries are
  deleted until the kept ones fit ``quota_bytes``; an entry that is held (a running job links it)
  is never deleted. Downloads under way are not counted, so the disk may briefly hold more.
* **Too large to keep.** Content larger than the whole quota is fetched but not kept: it is served
  from its temp file in ``partial/``, deleted when its last hold ends (or, fetched by ``fetch``
  without a hold, at the next fetch or at ``close``).
* **Concurrency.** Fetches of one key at once share one download, and at most ``max_downloads``
  stream at once. ``prefetch`` starts a download in a task the cache owns (cancelled by ``close``)
  so a queued job's inputs arrive while another job trains.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import inspect
import json
import logging
import os
import re
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from ..errors import AitbcError, FetchLimitError, StorageError, UnsafeNameError
from ..storage import ContentStore, cid_from_str, fetch_timeout_s

__all__ = ["DEFAULT_CACHE_BYTES", "CacheKey", "CacheLease", "CacheStats", "ContentCache", "cache_key", "read_range"]

# -- the cache's files: checked keys, one entry's files on disk, streaming a download into one.
# The blocking functions run in worker threads (ContentCache calls them through asyncio.to_thread).

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


# -- the cache ---------------------------------------------------------------------------------

DEFAULT_CACHE_BYTES = 20 * 2**30  # a provider's default quota: a few shards and many rounds of weights
MAX_DOWNLOADS = 8  # streams from the store at once

log = logging.getLogger(__name__)


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0  # downloads started
    coalesced: int = 0  # fetches that joined a download already under way
    evictions: int = 0
    corrupt: int = 0  # entries found damaged on disk and dropped
    fetched_bytes: int = 0


@dataclass(eq=False)
class _Download:
    task: asyncio.Task[CacheEntry]
    waiters: int = 0


class CacheLease:
    """One hold on a cache entry: its file stays until ``release()`` (or the end of a ``with`` block)."""

    def __init__(self, cache: ContentCache, entry: CacheEntry) -> None:
        self._cache, self._entry, self._released = cache, entry, False

    @property
    def path(self) -> Path:
        return self._entry.path

    @property
    def size(self) -> int:
        return self._entry.size

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._cache._release(self._entry)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        self.release()


class ContentCache:
    """``async with ContentCache(root, quota_bytes)``: see the module's docstring for what it keeps and why."""

    def __init__(self, root: Path, quota_bytes: int, *, max_downloads: int = MAX_DOWNLOADS) -> None:
        if quota_bytes < 0:
            raise ValueError("the cache quota cannot be negative")
        self.root = Path(root)
        self._download_slots = asyncio.Semaphore(max_downloads)  # an image shard is thousands of slices
        self.quota_bytes = quota_bytes
        self.stats = CacheStats()
        self._partial_dir = self.root / PARTIAL_DIR
        self._index: OrderedDict[str, CacheEntry] = OrderedDict()  # kept entries, least recently used first
        self._used = 0
        self._downloads: dict[str, _Download] = {}
        self._loose: list[CacheEntry] = []  # too large to keep, returned by fetch() without a hold
        self._prefetches: set[asyncio.Task[None]] = set()
        self._unlinks: set[asyncio.Task[None]] = set()
        self._verifying: dict[str, asyncio.Task[bool]] = {}
        self._open = False

    # --- life cycle

    async def open(self) -> ContentCache:
        """Rebuild the index from disk (after a restart or a crash); idempotent."""
        if not self._open:
            try:
                found = await asyncio.to_thread(scan_entries, self.root)
            except OSError as exc:
                raise StorageError(f"cannot open the content cache in {self.root}: {exc}") from exc
            for entry in found:
                self._index[entry.key.name] = entry
                self._used += entry.size
            self._open = True
            self._evict()  # the quota may be smaller than last time
        return self

    async def close(self) -> None:
        """Stop prefetches and downloads, delete temp files; kept entries stay for the next start."""
        tasks = [*self._prefetches, *(d.task for d in self._downloads.values()), *self._verifying.values()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for entry in self._loose:
            self._delete(entry.path)
        self._loose.clear()
        await asyncio.gather(*self._unlinks, return_exceptions=True)
        self._open = False

    async def __aenter__(self) -> ContentCache:
        return await self.open()

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    @property
    def used_bytes(self) -> int:
        """Bytes of the kept entries (what the quota bounds)."""
        return self._used

    def cached(self, address: str, offset: int = 0, length: int | None = None) -> Path | None:
        """The kept entry's file, if there is one (no check, no LRU touch)."""
        entry = self._index.get(cache_key(address, offset, length).name)
        return entry.path if entry is not None else None

    # --- reads

    async def acquire(self, store: ContentStore, address: str, *, size: int, offset: int = 0,
                      length: int | None = None, timeout_s: float | None = None) -> CacheLease:
        """The content held for the caller: from the cache, or streamed from ``store`` into it.

        ``size``: the declared byte count; content holding more is a FetchLimitError, and nothing is kept.
        ``timeout_s`` (None: ``fetch_timeout_s(size)``) bounds the download.
        """
        if not self._open:
            raise StorageError("the content cache is not open")
        key = cache_key(address, offset, length)
        self._drop_loose()
        timeout = fetch_timeout_s(size) if timeout_s is None else timeout_s
        while True:
            entry = self._index.get(key.name)
            if entry is None:
                entry = await self._join_download(key, store, size, timeout)
            elif not await self._hit(entry):
                continue  # it was damaged and is gone: download it again
            if entry.size > size:
                self._release(entry)
                raise FetchLimitError(f"{address} holds {entry.size} bytes, more than the {size} declared")
            return CacheLease(self, entry)

    async def fetch(self, store: ContentStore, address: str, *, size: int, offset: int = 0,
                    length: int | None = None, timeout_s: float | None = None) -> Path:
        """The entry's path, not held: valid until the next eviction pass (a later download or release)
        deletes it; ``hold`` it, or ``acquire`` instead, to keep it.

        Content larger than the quota is not kept: its temp file lasts until the next fetch or ``close``.
        """
        lease = await self.acquire(store, address, size=size, offset=offset, length=length, timeout_s=timeout_s)
        entry = lease._entry
        if not entry.kept:
            self._loose.append(entry)
        lease._released = True
        entry.holds -= 1  # no eviction pass now: the caller gets a path that still exists
        return entry.path

    @contextlib.contextmanager
    def hold(self, path: Path) -> Iterator[Path]:
        """Keep the entry at ``path`` (from ``fetch``) from eviction for the block's duration."""
        path = Path(path)
        entry = self._index.get(path.name)
        if entry is None or entry.path != path:
            entry = next((e for e in self._loose if e.path == path), None)
        if entry is None or entry.gone:
            raise StorageError(f"{path} is not in the content cache")
        entry.holds += 1
        with CacheLease(self, entry):
            yield entry.path

    def prefetch(self, store: ContentStore, address: str, *, size: int, offset: int = 0,
                 length: int | None = None, timeout_s: float | None = None) -> bool:
        """Start fetching in the background (a task ``close`` cancels); False if there is nothing to do.

        Content larger than the quota is not prefetched: it would not be kept. A failure is logged
        only: the job's own fetch tries again and reports it.
        """
        try:
            key = cache_key(address, offset, length)
        except AitbcError:
            return False
        if not self._open or size > self.quota_bytes or key.name in self._index or key.name in self._downloads:
            return False

        async def fetch_and_release() -> None:
            try:
                (await self.acquire(store, address, size=size, offset=offset, length=length,
                                    timeout_s=timeout_s)).release()
            except AitbcError as exc:
                log.info("prefetch of %s failed: %s", address, exc)

        _track(self._prefetches, asyncio.create_task(fetch_and_release()))
        return True

    # --- internals

    async def _hit(self, entry: CacheEntry) -> bool:
        """Hold ``entry`` if its file is intact (and touch its LRU time); else drop it."""
        entry.holds += 1
        try:
            intact = await self._check(entry)
        except BaseException:
            self._release(entry)
            raise
        if intact and not entry.gone:
            self.stats.hits += 1
            if entry.kept and self._index.get(entry.key.name) is entry:
                self._index.move_to_end(entry.key.name)
            return True
        if not entry.gone:
            log.warning("cache entry %s (%s) is damaged on disk: fetching it again", entry.key.name, entry.key.address)
            self.stats.corrupt += 1
            self._drop(entry)
        self._release(entry)
        return False

    async def _check(self, entry: CacheEntry) -> bool:
        if entry.verified:
            return await asyncio.to_thread(entry_intact, entry, rehash=False)
        # The first use after a restart hashes the file once; concurrent hits share the hash.
        task = self._verifying.get(entry.key.name)
        if task is None:
            task = asyncio.create_task(asyncio.to_thread(entry_intact, entry, rehash=True))
            self._verifying[entry.key.name] = task
            task.add_done_callback(lambda _: self._verifying.pop(entry.key.name, None))
        intact = await asyncio.shield(task)
        entry.verified = entry.verified or intact
        return intact

    async def _join_download(self, key: CacheKey, store: ContentStore, size: int, timeout_s: float) -> CacheEntry:
        download = self._downloads.get(key.name)
        if download is None:
            download = _Download(asyncio.create_task(self._download(key, store, size, timeout_s)))
            self._downloads[key.name] = download
            self.stats.misses += 1
        else:
            self.stats.coalesced += 1
        download.waiters += 1  # the entry comes back held once per waiter
        try:
            return await asyncio.shield(download.task)
        except asyncio.CancelledError:
            task = download.task
            if task.done() and not task.cancelled() and task.exception() is None:
                self._release(task.result())  # it arrived just as this waiter was cancelled
            else:
                download.waiters -= 1
            raise

    async def _download(self, key: CacheKey, store: ContentStore, size: int, timeout_s: float) -> CacheEntry:
        temp = self._partial_dir / f"{key.name}.{uuid.uuid4().hex}"
        try:
            async with self._download_slots:
                written, digest = await download_to(temp, store, key, size, timeout_s)
            kept = written <= self.quota_bytes
            try:
                entry = await asyncio.to_thread(commit_download, self.root, key, temp, written, digest, kept)
            except OSError as exc:  # e.g. the disk is full
                temp.unlink(missing_ok=True)
                raise StorageError(f"the content cache cannot keep {key.address}: {exc}") from exc
            self.stats.fetched_bytes += written
            entry.holds = self._downloads[key.name].waiters
            if kept:
                self._replace(entry)
                self._evict(protect=entry)
            elif entry.holds == 0:  # every waiter gave up: nobody will release it
                self._drop(entry)
            return entry
        finally:
            self._downloads.pop(key.name, None)

    def _replace(self, entry: CacheEntry) -> None:
        old = self._index.pop(entry.key.name, None)
        if old is not None:  # defensive: downloads are one per key, so no entry should be there
            old.gone = True
            self._used -= old.size
        self._index[entry.key.name] = entry
        self._used += entry.size

    def _release(self, entry: CacheEntry) -> None:
        entry.holds -= 1
        if entry.holds > 0:
            return
        if not entry.kept:
            if entry not in self._loose:
                self._drop(entry)
        else:
            self._evict()

    def _evict(self, protect: CacheEntry | None = None) -> None:
        """Drop least recently used entries that nothing holds until the kept ones fit the quota."""
        for entry in list(self._index.values()):
            if self._used <= self.quota_bytes:
                return
            if entry.holds == 0 and entry is not protect:
                self._drop(entry)
                self.stats.evictions += 1

    def _drop(self, entry: CacheEntry) -> None:
        """Forget ``entry`` and delete its files (renamed away now, unlinked in a worker thread)."""
        entry.gone = True
        if self._index.get(entry.key.name) is entry:
            del self._index[entry.key.name]
            self._used -= entry.size
        self._delete(entry.path)
        if entry.kept:
            self._delete(meta_path(entry.path))

    def _delete(self, path: Path) -> None:
        trash = self._partial_dir / f"trash-{uuid.uuid4().hex}"
        try:
            os.replace(path, trash)  # at once, so a new entry under the same name is never the one deleted
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot delete %s from the content cache: %s", path, exc)
            return
        _track(self._unlinks, asyncio.create_task(asyncio.to_thread(trash.unlink, True)))

    def _drop_loose(self) -> None:
        for entry in [e for e in self._loose if e.holds == 0]:
            self._loose.remove(entry)
            self._drop(entry)


def _track(tasks: set[asyncio.Task[None]], task: asyncio.Task[None]) -> None:
    tasks.add(task)
    task.add_done_callback(tasks.discard)
