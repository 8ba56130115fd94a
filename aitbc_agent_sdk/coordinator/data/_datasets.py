"""The coordinator's datasets: imported as directories, described by a manifest, read back by slices.

A dataset goes into the store once, as the directory ``ipfs add -r`` would make of it (arrays
and text corpora are first rewritten into flat files under a staging directory, removed after
the import). Its CID in the training record is that of its :class:`DatasetManifest`. Shards and
the test split are :class:`ShardData` records: slices of the dataset's files, never copies.
The coordinator reads only what it evaluates on (the test split) and a bounded sample of the
training split for the task's ``prepare``; both are materialized as parts on disk, as a provider's
job directory holds them, and loaded the same way.
"""

from __future__ import annotations

import asyncio
import hashlib
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import numpy as np

from ...errors import ConfigError, DatasetError
from ...records import format_size
from ...records._datasets import (
    MAX_DATASET_FILES, DataSlices, DatasetKind, DatasetManifest, FileSlice, ShardData, TargetKind,
)
from ...storage import ContentStore
from ...storage._port import DirectoryStore
from ...data._datasets import LabeledData
from ...records import TrainingSpec
from ...data._dataset_dirs import PreparedDataset, build_manifest, prepare_dataset
from ...data._file_sharding import plan_split, shard_data, spread_sample
from ...data._shard_files import SHARD_INFO, ShardContent, data_layout, load_shard, part_name, target_bytes
from ._sealing import SEALED_LAYOUT, KeyRing, read_sealed_slice, seal_tree

MANIFEST_MAX_BYTES = 64 << 20  # a manifest of MAX_DATASET_FILES entries, with room
WALK_MAX_ENTRIES = 2 * MAX_DATASET_FILES  # its files and the directories they are in


def check_declared_size(declared: int | None, source: str | Path, actual: int | None = None) -> None:
    """Refuse a dataset larger than the training declared (``--dataset-size``), before it is stored or funded.

    ``actual`` is the stored form's size where ``source`` is not a file (a directory, a bundled dataset)."""
    if declared is None:
        return
    path = Path(source)
    size = path.stat().st_size if actual is None and path.is_file() else actual
    if size is not None and size > declared:
        raise ConfigError(f"the dataset {source} holds {format_size(size)} ({size} bytes), more than the "
                          f"{format_size(declared)} ({declared} bytes) the training declared with --dataset-size")


def tree_size(path: Path) -> int:
    return path.stat().st_size if path.is_file() else sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


class DatasetStore:
    """Datasets in the content store, and the parts of them this coordinator has read (under ``root``)."""

    def __init__(self, store: DirectoryStore, root: Path | None) -> None:
        self._store = store
        self._root = root
        self._manifests: dict[str, DatasetManifest] = {}
        self._loaded: dict[str, ShardContent] = {}
        self._shards: dict[str, ShardData] = {}
        self._keys: KeyRing | None = None
        # Trainings run at once on one coordinator read the same shards: one writer per directory.
        self._writing: dict[Path, asyncio.Lock] = {}

    async def import_dataset(self, source: str | Path | LabeledData, *, label_column: str | None = None,
                             target: TargetKind | None = None, kind: DatasetKind | None = None, declared_size: int | None = None,
                             progress: Callable[[int], None] | None = None, encrypt: bool = False,
                             vocab_size: int | None = None) -> tuple[str, DatasetManifest]:
        """Prepare ``source``, import its directory (sealed, with ``encrypt``), store its manifest; return
        (manifest CID, manifest). ``vocab_size``: a text corpus's BPE vocabulary (None: byte-level tokens)."""
        on_disk = isinstance(source, (str, Path)) and Path(source).exists()
        if on_disk:  # the bytes the user gave (a corpus's text, not its tokens), named by the user's path
            check_declared_size(declared_size, source, await asyncio.to_thread(tree_size, Path(source)))
        key = _staging_key(source, label_column, kind, target, vocab_size)
        staging = self._dir() / "staging" / key
        # Trainings started at once from one source share its staging: they take turns, the later reuse it.
        async with self._writing.setdefault(staging, asyncio.Lock()):
            marker, journal = staging.with_name(f"{key}.prepared.json"), staging.with_name(f"{key}.journal")
            sealed_dir = staging.with_name(f"{key}.sealed")
            try:
                prepared = await asyncio.to_thread(_prepared, source, staging, marker, label_column, kind,
                                                   target, vocab_size)
                if not on_disk:  # a bundled dataset or arrays in memory: the size of their stored form
                    check_declared_size(declared_size, source if isinstance(source, str) else "given as arrays",
                                        await asyncio.to_thread(tree_size, prepared.directory))
                directory, sealed, plain = prepared.directory, None, None
                if encrypt:  # the store sees ciphertext only; the key stays here
                    plain = await asyncio.to_thread(seal_tree, self.keys.pending(key), prepared.directory, sealed_dir)
                    directory, sealed = sealed_dir, SEALED_LAYOUT
                root = await self._store.add_directory(directory, journal=journal, progress=progress)
                walked = self._store.walk_directory(root, max_entries=WALK_MAX_ENTRIES)
                entries = [(e.path, e.cid, plain[e.path] if plain else e.size) async for e in walked if not e.is_dir]
                manifest = build_manifest(prepared, root, entries, sealed=sealed)
            except (ConfigError, DatasetError):  # bad input: nothing half-written stays behind
                await asyncio.to_thread(_remove, staging, sealed_dir, marker, journal)
                self.keys.drop(key)
                raise
            # Interrupted (cancelled, a store error): staging, marker, journal and key stay, so a rerun resumes.
            if encrypt:
                self.keys.commit(key, root)
            await asyncio.to_thread(_remove, staging, sealed_dir, marker, journal)
            cid = await self._store.add(manifest.model_dump_json().encode())
            self._manifests[cid] = manifest
            return cid, manifest

    @property
    def keys(self) -> KeyRing:
        """Sealed datasets' keys (made on first use: a coordinator without private data keeps none)."""
        if self._keys is None:
            self._keys = KeyRing(self._dir() / "keys")
        return self._keys

    async def add_directory(self, path: Path, *, pin: bool = True) -> str:
        return await self._store.add_directory(path, pin=pin)

    async def manifest(self, cid: str) -> DatasetManifest:
        if cid not in self._manifests:
            blob = await self._store.cat(cid, max_bytes=MANIFEST_MAX_BYTES)
            try:
                self._manifests[cid] = DatasetManifest.model_validate_json(blob)
            except ValueError as exc:
                raise DatasetError(f"{cid} is not a dataset manifest: {exc}") from exc
        return self._manifests[cid]

    async def read_file(self, manifest: DatasetManifest, path: str, *, max_bytes: int) -> bytes:
        """One whole file of the dataset (opened, if sealed), refused above ``max_bytes`` before it is fetched."""
        f = manifest.file(path)
        if f.size > max_bytes:
            raise DatasetError(f"{path} of the dataset holds {f.size} bytes, above the limit of {max_bytes}")
        if manifest.sealed is None or f.size == 0:
            return await self._store.cat(f.cid, max_bytes=max_bytes) if f.size else b""
        piece = FileSlice(path=f.path, cid=f.cid, offset=0, length=f.size, file_size=f.size)
        with tempfile.TemporaryDirectory(dir=self._dir()) as scratch:
            out = Path(scratch) / "file"
            await read_sealed_slice(self._store, self.keys.key(manifest.root), piece, manifest.sealed, out)
            return await asyncio.to_thread(out.read_bytes)

    async def shard(self, cid: str) -> ShardData:
        if cid not in self._shards:  # a CID's content never changes: read each record once
            self._shards[cid] = ShardData.model_validate_json(await self._store.cat(cid, max_bytes=MANIFEST_MAX_BYTES))
        return self._shards[cid]

    async def add_shard(self, shard: ShardData) -> str:
        return await self._store.add(shard.model_dump_json().encode())

    async def materialize(self, shard: ShardData, directory: Path) -> Path:
        """Write ``shard``'s parts (each slice fetched by range and verified) and ``shard.json`` under ``directory``.
        Concurrent calls for one directory take turns: the second finds the parts written."""
        async with self._writing.setdefault(directory, asyncio.Lock()):
            return await self._materialize(shard, directory)

    async def _materialize(self, shard: ShardData, directory: Path) -> Path:
        directory.mkdir(parents=True, exist_ok=True)
        key = self.keys.key(shard.dataset) if shard.sealed is not None and shard.dataset is not None else None
        for i, piece in enumerate(shard.data.slices):
            path = directory / part_name(i)
            if path.is_file() and path.stat().st_size == piece.length:
                continue  # content addressed: what is there is what was fetched
            if key is not None and shard.sealed is not None:
                await read_sealed_slice(self._store, key, piece, shard.sealed, path)
                continue
            tmp = path.with_suffix(".tmp")
            with open(tmp, "wb") as out:
                async for chunk in self._store.stream(piece.cid, offset=piece.offset, length=piece.length,
                                                      max_bytes=piece.length):
                    await asyncio.to_thread(out.write, chunk)
            tmp.replace(path)
        (directory / SHARD_INFO).write_text(shard.model_dump_json())
        return directory

    async def load(self, cid: str, shard: ShardData | None = None) -> ShardContent:
        """A shard or test split by the CID of its record, loaded as a task trains on it (kept in memory)."""
        if cid not in self._loaded:
            shard = shard or await self.shard(cid)
            directory = await self.materialize(shard, self._dir() / "parts" / hashlib.sha256(cid.encode()).hexdigest()[:32])
            self._loaded[cid] = await asyncio.to_thread(load_shard, directory, shard)
        return self._loaded[cid]

    async def load_sample(self, manifest: DatasetManifest, spec: TrainingSpec, samples: int) -> ShardContent:
        """About ``samples`` samples of the training split, spread over it (the rehearsal before funding)."""
        plan = plan_split(manifest, num_shards=1, test_fraction=spec.test_fraction, partition="iid",
                          alpha=spec.dirichlet_alpha, seed=spec.seed)
        sample = spread_sample(shard_data(manifest, plan.shards[0]), samples)
        return await self.load(await self.add_shard(sample), sample)

    def _dir(self) -> Path:
        if self._root is None:
            self._root = Path(tempfile.mkdtemp(prefix="aitbc-data-"))
        self._root.mkdir(parents=True, exist_ok=True)
        return self._root


def _prepared(source: str | Path | LabeledData, staging: Path, marker: Path, label_column: str | None,
              kind: DatasetKind | None, target: TargetKind | None = None,
              vocab_size: int | None = None) -> PreparedDataset:
    """Stage ``source`` once: a rerun after an interruption finds the marker and reuses the staged files."""
    if marker.is_file():
        try:
            staged = PreparedDataset.model_validate_json(marker.read_bytes())
            if target is None or staged.arrays is None or staged.arrays.target == target:
                return staged
        except ValueError:
            pass  # a torn marker: stage again
    shutil.rmtree(staging, ignore_errors=True)
    prepared = prepare_dataset(source, staging, label_column=label_column, kind=kind, target=target,
                               vocab_size=vocab_size)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_text(prepared.model_dump_json())
    return prepared


def _remove(*paths: Path) -> None:
    for path in paths:
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


def _staging_key(source: object, *reading: object) -> str:
    """The same source read the same way stages in the same place, so an interrupted import's journal is found
    again; another label column or target kind is another staging (its prepared marker would be stale)."""
    if isinstance(source, (str, Path)) and Path(source).exists():
        path = Path(source).resolve()
        stat = path.stat()
        ident = f"{path}:{stat.st_size}:{stat.st_mtime_ns}"
    else:
        ident = f"memory:{id(source)}"
    return hashlib.sha256(f"{ident}|{reading!r}".encode()).hexdigest()[:24]


async def store_shard(store: ContentStore, data: LabeledData) -> tuple[str, int]:
    """Labelled data in memory stored as one arrays shard (its two files and its record); returns
    (record CID, record bytes), what a job names. For tests and tools that hand a provider a shard directly."""
    x = np.ascontiguousarray(data.features.numpy(), dtype="<f4").tobytes()
    layout, y = data_layout(data), target_bytes(data)
    slices = (FileSlice(path=layout.features, cid=await store.add(x), offset=0, length=len(x)),
              *((FileSlice(path=layout.labels, cid=await store.add(y), offset=0, length=len(y)),)
                if layout.labels else ()))
    record = ShardData(kind="arrays", data=DataSlices(slices=slices, samples=len(data)),
                       arrays=layout).model_dump_json().encode()
    return await store.add(record), len(record)


__all__ = ["DatasetStore", "check_declared_size", "store_shard"]
