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
import logging
import os
import uuid
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import AitbcError, FetchLimitError, StorageError
from ..storage import ContentStore, fetch_timeout_s
from ._cache_files import (
    PARTIAL_DIR, CacheEntry, CacheKey, cache_key, commit_download, download_to, entry_intact, meta_path, read_range,
    scan_entries,
)

__all__ = ["DEFAULT_CACHE_BYTES", "CacheKey", "CacheLease", "CacheStats", "ContentCache", "cache_key", "read_range"]

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
