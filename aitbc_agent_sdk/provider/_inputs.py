"""A job's inputs in its directory, from the provider's content cache.

The job names the CID of its shard record (``shard.json``, a :class:`ShardData`: slices of the
dataset's files) and of the global weights. The provider fetches the record, then every slice by
range into ``part-NNNNNN`` (the names come from the index, never from the record's paths), and the
weights; the training process reads that layout (``training.shard_files.load_shard``; the sandbox
links it on into its read-only ``in/``). Each file is a hard link to its cache entry (a copy where
the job directory is on another file system), so the job directory can go with the job and the next
job on the same shard downloads nothing. The entries stay held, so never evicted, until
``release``: after the job directory is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from collections.abc import Iterable
from pathlib import Path

from ..chain._keywrap import data_key_info, unwrap_key
from ..errors import AitbcError, DatasetError, DecryptionError, FetchLimitError, StorageError
from ..records import MAX_SHARD_BYTES, JobAssignment
from ..records._datasets import ShardData
from ..storage import ContentStore, fetch_timeout_s
from ..storage._sealed import HEADER_SIZE, open_slice, slice_span
from ..data._shard_files import part_name
from ._cache import CacheLease, ContentCache
from ._process import SHARD_FILE, WEIGHTS_FILE
from ._owners import TrainingOwner
from ._tasks import ProviderTasks
from ._weights_delta import holds_base, rebuilt_weights

__all__ = ["JobInputs", "link_inputs", "read_shard_record"]

Piece = tuple[str, int, int | None, int]  # (CID, offset, length or None: the whole file, declared bytes)

log = logging.getLogger(__name__)


def read_shard_record(path: Path) -> ShardData:
    """Blocking: the job's shard record; its slices may hold MAX_SHARD_BYTES together at most."""
    try:
        shard = ShardData.model_validate_json(path.read_bytes())
    except ValueError as exc:
        raise DatasetError(f"the job's shard is not a shard record: {exc}") from exc
    if shard.data.bytes > MAX_SHARD_BYTES:
        raise FetchLimitError(f"the shard's slices hold {shard.data.bytes} bytes, over the "
                              f"{MAX_SHARD_BYTES}-byte limit of one job")
    return shard


def slice_pieces(shard: ShardData) -> list[Piece]:
    """What to fetch for the shard's slices: each slice; for a sealed file its header and covering chunks."""
    if shard.sealed is None:
        return [(s.cid, s.offset, s.length, s.length) for s in shard.data.slices]
    pieces: list[Piece] = []
    for s in shard.data.slices:
        assert s.file_size is not None  # ShardData checks it for sealed shards
        start, length = slice_span(s.offset, s.length, chunk_size=shard.sealed.chunk_size, file_size=s.file_size)
        pieces += [(s.cid, 0, HEADER_SIZE, HEADER_SIZE), (s.cid, start, length, length)]
    return pieces


def open_parts(key: bytes, shard: ShardData, fetched: list[Path], job_dir: Path) -> None:
    """Blocking: each sealed slice's plaintext into ``part-NNNNNN`` (authenticated chunk by chunk)."""
    assert shard.sealed is not None
    for i, s in enumerate(shard.data.slices):
        assert s.file_size is not None
        start, _ = slice_span(s.offset, s.length, chunk_size=shard.sealed.chunk_size, file_size=s.file_size)
        open_slice(key, fetched[2 * i], fetched[2 * i + 1], start, job_dir / part_name(i), offset=s.offset,
                   length=s.length, file_size=s.file_size, context=shard.sealed.file_context(s.path),
                   chunk_size=shard.sealed.chunk_size)


def link_inputs(job_dir: Path, files: dict[str, Path]) -> None:
    """Blocking: put each cached file into ``job_dir`` under its name (hard link, else a copy)."""
    job_dir.mkdir(parents=True, exist_ok=True)
    for name, source in files.items():
        target = job_dir / name
        target.unlink(missing_ok=True)
        try:
            os.link(source, target, follow_symlinks=False)
        except OSError:  # another file system (or one without hard links)
            shutil.copyfile(source, target, follow_symlinks=False)


class JobInputs:
    """Fetches through the cache into job directories, and prefetches for jobs waiting for a slot."""

    def __init__(self, store: ContentStore, cache: ContentCache, tasks: ProviderTasks, private_key: bytes) -> None:
        self.store = store
        self._private_key = private_key  # unwraps sealed datasets' keys sent to this provider
        self.cache = cache
        self._tasks = tasks
        self._leases: dict[tuple[str, str], list[CacheLease]] = {}  # by (training key, job id), until release
        self._prefetching: set[asyncio.Task[None]] = set()

    async def open(self) -> None:
        await self.cache.open()

    async def close(self) -> None:
        for task in self._prefetching:
            task.cancel()
        await asyncio.gather(*self._prefetching, return_exceptions=True)
        for held in list(self._leases):
            self._release_leases(held)
        await self.cache.close()

    async def fetch(self, owner: TrainingOwner, job: JobAssignment, job_dir: Path) -> None:
        """The job's shard record and slices, weights (and task package and kept state) into ``job_dir``;
        call ``release`` afterwards, whatever happened.

        The signed job declares the record's and the weights' sizes, the record each slice's: content
        holding more (or a DAG too deep, too wide or too slow) is a FetchLimitError after one block,
        not gigabytes in this key-holding daemon.
        """
        leases = self._leases.setdefault((owner.hex, job.job_id), [])
        rebuilt = await rebuilt_weights(self.cache, self.store, job)  # last round's model + its change
        if rebuilt is not None:  # in the cache as if fetched: the next round's base
            leases.append(await self.cache.acquire(rebuilt, job.weights_cid, size=job.weights_bytes))  # type: ignore[arg-type]
        record, weights = await self._acquire_all(
            leases, [(job.shard_cid, 0, None, job.shard_bytes), (job.weights_cid, 0, None, job.weights_bytes)])
        shard = await asyncio.to_thread(read_shard_record, record)
        key = self._data_key(owner, job, shard)
        parts = await self._acquire_all(leases, slice_pieces(shard))
        files = {SHARD_FILE: record, WEIGHTS_FILE: weights}
        if key is None:
            files.update({part_name(i): p for i, p in enumerate(parts)})
        try:
            await asyncio.to_thread(link_inputs, job_dir, files)
            if key is not None:  # the cache keeps ciphertext; plaintext lives in the job directory only
                await asyncio.to_thread(open_parts, key, shard, parts, job_dir)
        except OSError as exc:
            raise StorageError(f"cannot put the inputs of job {job.job_id} into {job_dir}: {exc}") from exc
        await self._tasks.prepare(owner, job, job_dir)

    def _data_key(self, owner: TrainingOwner, job: JobAssignment, shard: ShardData) -> bytes | None:
        if shard.sealed is None:
            return None
        if job.data_key is None:
            raise DecryptionError("the job's shard is sealed and the job carries no key for it")
        return unwrap_key(bytes.fromhex(job.data_key), self._private_key,
                          info=data_key_info(owner.key, job.worker_id))

    def release(self, owner: TrainingOwner, job: JobAssignment) -> None:
        """The job's inputs may be evicted again (call once its directory is gone)."""
        self._release_leases((owner.hex, job.job_id))

    def prefetch(self, job: JobAssignment) -> None:
        """Start downloading the job's inputs while it waits for a slot (what is cached costs nothing)."""
        task = asyncio.create_task(self._prefetch(job))
        self._prefetching.add(task)
        task.add_done_callback(self._prefetching.discard)

    async def _prefetch(self, job: JobAssignment) -> None:
        if not holds_base(self.cache, job):  # else the fetch rebuilds the model from the base
            self._prefetch_pieces([(job.weights_cid, 0, None, job.weights_bytes)])
        try:  # the record says which slices to fetch: it comes first
            with await self.cache.acquire(self.store, job.shard_cid, size=job.shard_bytes) as record:
                shard = await asyncio.to_thread(read_shard_record, record)
        except AitbcError as exc:  # the job's own fetch tries again and reports it
            log.info("prefetch for job %s stopped: %s", job.job_id, exc)
            return
        self._prefetch_pieces(slice_pieces(shard))

    def _prefetch_pieces(self, pieces: Iterable[Piece]) -> None:
        for cid, offset, length, size in pieces:
            self.cache.prefetch(self.store, cid, size=size, offset=offset, length=length)

    async def _acquire_all(self, leases: list[CacheLease], pieces: list[Piece]) -> list[Path]:
        """Each piece's cached file, held (the leases recorded in ``leases``), in order."""
        if not pieces:
            return []
        fetches = [asyncio.create_task(self._acquire(leases, piece)) for piece in pieces]
        try:
            await asyncio.wait(fetches)
        finally:
            for fetch in fetches:  # cancelled: the fetches stop too (each releases what it holds)
                fetch.cancel()
        for fetch in fetches:
            if (error := fetch.exception()) is not None:
                raise error
        return [fetch.result() for fetch in fetches]

    async def _acquire(self, leases: list[CacheLease], piece: Piece) -> Path:
        cid, offset, length, size = piece
        lease = await self.cache.acquire(self.store, cid, size=size, offset=offset, length=length,
                                         timeout_s=fetch_timeout_s(size))
        leases.append(lease)  # at once: a cancel cannot come between the hold and its record
        return lease.path

    def _release_leases(self, held: tuple[str, str]) -> None:
        for lease in self._leases.pop(held, []):
            lease.release()
