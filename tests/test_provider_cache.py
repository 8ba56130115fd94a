"""The provider's content cache (real local stores in temp dirs) and, end to end, a real provider whose
consecutive jobs on one shard download it once, with a queued job's inputs fetched while another trains."""

from __future__ import annotations

import asyncio
import os
from collections import Counter
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from eth_account import Account

from aitbc_agent_sdk.errors import FetchLimitError, StorageError, UnsafeNameError
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import JobCancel, new_id
from aitbc_agent_sdk.records._datasets import ShardData
from aitbc_agent_sdk.provider._cache import ContentCache, cache_key
from aitbc_agent_sdk.provider._cache import ENTRIES_DIR, PARTIAL_DIR, meta_path
from aitbc_agent_sdk.provider._node import ProviderAgent, ProviderConfig
from aitbc_agent_sdk.provider._sandbox import TrainingSandbox
from aitbc_agent_sdk.storage import InvalidCidError, LocalContentStore
from test_provider_agent import HARDWARE, LONG_JOB, PRICE, TRAINING, open_market, until

KB = 1000


class CountingStore:
    """Counting spy, not a mock: every call goes to the real store; it only counts the reads per CID."""

    def __init__(self, inner: LocalContentStore) -> None:
        self.inner = inner
        self.streams: Counter[str] = Counter()
        self.bytes_read: Counter[str] = Counter()

    def __getattr__(self, name: str):
        return getattr(self.inner, name)

    async def cat(self, cid: str, **limits) -> bytes:
        self.streams[cid] += 1
        data = await self.inner.cat(cid, **limits)
        self.bytes_read[cid] += len(data)
        return data

    async def stream(self, cid: str, *, max_bytes=None, timeout_s=None, offset: int = 0,
                     length: int | None = None) -> AsyncIterator[bytes]:
        self.streams[cid] += 1
        async for chunk in self.inner.stream(cid, max_bytes=max_bytes, timeout_s=timeout_s, offset=offset,
                                             length=length):
            self.bytes_read[cid] += len(chunk)
            yield chunk


class WholeFileStore(CountingStore):
    """The same spy with the port's older ``stream`` (no ranges): the cache must stream and slice."""

    async def stream(self, cid: str, *, max_bytes=None, timeout_s=None) -> AsyncIterator[bytes]:
        async for chunk in super().stream(cid, max_bytes=max_bytes, timeout_s=timeout_s):
            yield chunk


async def stored(store: LocalContentStore, *sizes: int) -> list[tuple[str, bytes]]:
    blobs = [os.urandom(size) for size in sizes]
    return [(await store.add(blob), blob) for blob in blobs]


def cache_files(root: Path, folder: str) -> set[str]:
    return set(os.listdir(root / folder))


async def test_a_second_fetch_reads_nothing_and_ranges_read_the_same_bytes_with_or_without_range_reads(tmp_path):
    store = CountingStore(LocalContentStore(tmp_path / "store"))
    [(cid, blob)] = await stored(store.inner, 700 * KB)  # three 256 KiB chunks
    async with ContentCache(tmp_path / "cache", 10 * 1000 * KB) as cache:
        first = await cache.fetch(store, cid, size=len(blob))
        again = await cache.fetch(store, cid, size=len(blob))
        assert first == again and again.read_bytes() == blob
        assert store.streams[cid] == 1 and store.bytes_read[cid] == len(blob)
        assert (cache.stats.hits, cache.stats.misses) == (1, 1)

    plain = WholeFileStore(store.inner)
    ranges = ((0, 10), (262_100, 300), (500 * KB, None), (699 * KB, 5 * KB), (len(blob), None))
    for source in (store, plain):  # range reads, and streaming from the start and slicing
        async with ContentCache(tmp_path / f"cache-{type(source).__name__}", 10 * 1000 * KB) as cache:
            for offset, length in ranges:
                end = None if length is None else offset + length
                path = await cache.fetch(source, cid, size=len(blob[offset:end]), offset=offset, length=length)
                assert path.read_bytes() == blob[offset:end], (type(source).__name__, offset, length)
    assert plain.streams[cid] == len(ranges)


async def test_lru_eviction_keeps_the_recently_used_and_never_what_a_job_holds(tmp_path):
    store = LocalContentStore(tmp_path / "store")
    (a, blob_a), (b, _), (c, _), (d, _) = await stored(store, 100 * KB, 100 * KB, 100 * KB, 100 * KB)
    async with ContentCache(tmp_path / "cache", 300 * KB) as cache:
        for cid in (a, b, c):
            await cache.fetch(store, cid, size=100 * KB)
        await cache.fetch(store, a, size=100 * KB)  # a is now the most recent: b is the oldest
        await cache.fetch(store, d, size=100 * KB)
        assert [cache.cached(cid) is not None for cid in (a, b, c, d)] == [True, False, True, True]
        assert cache.stats.evictions == 1 and cache.used_bytes == 300 * KB

        # c (the oldest now) is held, as a running job's input is: b comes back and a goes instead.
        with cache.hold(cache.cached(c)) as held:
            await cache.fetch(store, b, size=100 * KB)
            assert cache.cached(c) == held and cache.cached(a) is None
            lease = await cache.acquire(store, a, size=100 * KB)  # held from the start: d goes
            assert [cache.cached(cid) is not None for cid in (a, b, c, d)] == [True, True, True, False]
            with cache.hold(cache.cached(b)):  # everything held: the quota waits
                await cache.fetch(store, d, size=100 * KB)
                assert cache.used_bytes == 400 * KB and cache.stats.evictions == 3
            assert cache.cached(b) is None and cache.used_bytes == 300 * KB  # released: the oldest free one goes
        assert [cache.cached(cid) is not None for cid in (a, b, c, d)] == [True, False, True, True]
        assert lease.path.read_bytes() == blob_a
        lease.release()
        with pytest.raises(StorageError, match="not in the content cache"):
            with cache.hold(tmp_path / "elsewhere"):
                pass


async def test_concurrent_fetches_of_one_content_share_one_download(tmp_path):
    store = CountingStore(LocalContentStore(tmp_path / "store"))
    [(cid, blob)] = await stored(store.inner, 300 * KB)
    async with ContentCache(tmp_path / "cache", 1000 * KB) as cache:
        paths = await asyncio.gather(*(cache.fetch(store, cid, size=len(blob)) for _ in range(5)))
    assert len(set(paths)) == 1 and store.streams[cid] == 1
    assert (cache.stats.misses, cache.stats.coalesced) == (1, 4)


async def test_a_restart_rebuilds_the_index_in_lru_order_and_deletes_leftovers(tmp_path):
    store = CountingStore(LocalContentStore(tmp_path / "store"))
    (a, blob_a), (b, _) = await stored(store.inner, 100 * KB, 100 * KB)
    root = tmp_path / "cache"
    async with ContentCache(root, 1000 * KB) as cache:
        path_a, path_b = [await cache.fetch(store, cid, size=100 * KB) for cid in (a, b)]
    os.utime(meta_path(path_a), ns=(2 * 10**18, 2 * 10**18))  # a was used last (a second's tick may hold both)
    os.utime(meta_path(path_b), ns=(10**18, 10**18))
    crash = {"partial": f"{'0' * 64}.{'1' * 32}", "orphan": "f" * 64, "foreign": "notes.txt"}
    (root / PARTIAL_DIR / crash["partial"]).write_bytes(b"half a download")
    (root / ENTRIES_DIR / crash["orphan"]).write_bytes(b"content without its .meta")
    (root / PARTIAL_DIR / crash["foreign"]).write_text("not ours: left alone")

    async with ContentCache(root, 150 * KB) as cache:  # a smaller quota: the least recently used goes
        assert cache.cached(a) == path_a and cache.cached(b) is None and cache.used_bytes == 100 * KB
        assert (await cache.fetch(store, a, size=100 * KB)).read_bytes() == blob_a
        assert store.streams[a] == 1 and cache.stats.hits == 1
    assert cache_files(root, PARTIAL_DIR) == {crash["foreign"]}
    assert cache_files(root, ENTRIES_DIR) == {path_a.name, meta_path(path_a).name}


async def test_a_damaged_file_is_fetched_again_by_size_while_running_and_by_digest_after_a_restart(tmp_path):
    store = CountingStore(LocalContentStore(tmp_path / "store"))
    [(cid, blob)] = await stored(store.inner, 200 * KB)
    root = tmp_path / "cache"
    async with ContentCache(root, 1000 * KB) as cache:
        path = await cache.fetch(store, cid, size=len(blob))
        os.chmod(path, 0o644)
        with open(path, "r+b") as f:
            f.truncate(100)  # a running job wrote through its link
        assert (await cache.fetch(store, cid, size=len(blob))).read_bytes() == blob
        assert cache.stats.corrupt == 1 and store.streams[cid] == 2

    # One flipped byte, same size and mtime, while the provider was down: only the digest can tell.
    before = os.stat(path)
    os.chmod(path, 0o644)
    with open(path, "r+b") as f:
        f.seek(1234)
        f.write(bytes([blob[1234] ^ 1]))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    async with ContentCache(root, 1000 * KB) as cache:
        assert (await cache.fetch(store, cid, size=len(blob))).read_bytes() == blob
        assert cache.stats.corrupt == 1 and store.streams[cid] == 3
        await cache.fetch(store, cid, size=len(blob))  # verified now: a plain hit
        assert cache.stats.hits == 1 and store.streams[cid] == 3


async def test_more_than_the_declared_size_is_refused_and_too_large_for_the_quota_is_not_kept(tmp_path):
    store = CountingStore(LocalContentStore(tmp_path / "store"))
    [(cid, blob)] = await stored(store.inner, 300 * KB)
    root = tmp_path / "cache"
    async with ContentCache(root, 200 * KB) as cache:
        with pytest.raises(FetchLimitError):
            await cache.fetch(store, cid, size=len(blob) - 1)
        with pytest.raises(FetchLimitError):  # the range too: its declared count is what it may hold
            await cache.fetch(store, cid, size=99, offset=10, length=100)
        assert cache.cached(cid) is None and cache_files(root, PARTIAL_DIR) == set()

        with await cache.acquire(store, cid, size=len(blob)) as path:  # larger than the whole quota
            assert path.read_bytes() == blob and path.parent.name == PARTIAL_DIR
            assert cache.cached(cid) is None and cache.used_bytes == 0
        await until(lambda: not path.exists())  # deleted when released (in a worker thread)
        assert not cache.prefetch(store, cid, size=len(blob))  # it would not be kept

        small = await cache.fetch(store, cid, size=100 * KB, length=100 * KB)
        with pytest.raises(FetchLimitError):  # a hit is held to the caller's declared size too
            await cache.fetch(store, cid, size=10, length=100 * KB)
        assert small.read_bytes() == blob[:100 * KB]


def test_keys_are_checked_before_they_name_anything():
    cid = "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"
    assert cache_key(cid).name != cache_key(cid, 0, 10).name != cache_key(f"{cid}/a/b.txt").name
    with pytest.raises(InvalidCidError):
        cache_key("../../etc/passwd")
    for bad in (f"{cid}/../x", f"{cid}//x", f"{cid}/a/./b"):
        with pytest.raises(UnsafeNameError):
            cache_key(bad)


async def test_consecutive_jobs_on_one_shard_download_it_once_and_a_queued_job_prefetches(tmp_path):
    async with open_market(tmp_path) as market:
        store = CountingStore(market.store)
        cache_dir = tmp_path / "cache-elsewhere"  # as `--cache-dir` gives it: hidden from the sandbox
        agent = ProviderAgent(Account.create(), market.bus, store, ProviderConfig(
            price_wei=PRICE, work_dir=tmp_path / "providers" / new_id("provider"), cache_dir=cache_dir,
            cache_bytes="64MiB", sandbox=TrainingSandbox(hidden_paths=(cache_dir,))),
            hardware=HARDWARE, chain=market.provider_chain)
        async with agent as provider:
            contract = await market.hire(provider)
            running = await market.assign(provider, contract, config=LONG_JOB)
            await market.status(running, "running", min_epoch=1)
            # The next round's job: the same shard, other weights (another CID), queued behind `running`.
            weights = market.initial_weights(seed=1)
            queued = await market.assign(provider, contract, weights=weights)
            cache = provider.inputs.cache
            await until(lambda: cache.cached(queued.weights_cid) is not None)  # fetched while `running` trains
            assert market.statuses(queued) == []  # it has not started

            await market.coordinator.publish(topics.cancel(provider.address), JobCancel(
                job_id=running.job_id, training_id=TRAINING, reason="the test is done with it"))
            await market.result(queued)
            again = await market.assign(provider, contract, weights=weights)
            await market.result(again)
            await market.status(again, "complete")

        slices = [s.cid for s in ShardData.model_validate_json(await market.store.cat(running.shard_cid)).data.slices]
        assert running.shard_cid == queued.shard_cid == again.shard_cid
        # Three jobs on one shard: its record and each slice downloaded once (the first job's weights too).
        assert [store.streams[cid] for cid in (running.shard_cid, *slices, running.weights_cid)] == [1, 1, 1, 1]
        assert store.streams[queued.weights_cid] == 1  # the prefetch; both jobs found it cached
        # Misses: the first job's four inputs and the prefetched weights. Hits: four for each later job, and
        # the record again for the prefetch, which reads the slices from it.
        assert cache.stats.misses == 5 and cache.stats.hits + cache.stats.coalesced == 9
        # The job directories go after each result is out (the provider removes them, then releases the entries).
        await until(lambda: not any((provider.config.work_dir / "jobs").iterdir()))
        assert cache.root == cache_dir and cache.used_bytes == sum(store.bytes_read.values())
