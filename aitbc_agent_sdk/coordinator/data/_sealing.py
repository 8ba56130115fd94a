"""Private datasets on the coordinator: sealing files before import, the keys, and reading sealed slices back.

Every file of the dataset's directory is sealed (AES-256-GCM chunks, ``storage.sealed``) under a
key drawn for that import; the store and every IPFS peer hold only ciphertext, and CIDs are over
the ciphertext. The key stays in ``keys/`` under the coordinator's data directory (mode 0600),
named by the sealed directory's CID; each hired provider gets it wrapped for its public key,
which the coordinator recovers from the provider's signed escrow consent (``chain.keywrap``).
"""

from __future__ import annotations

import asyncio
import os
import secrets
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from ...chain._keywrap import data_key_info, signer_public_key, wrap_key
from ...errors import ConfigError, MessagingError
from ...records import JobAssignment
from ...records._datasets import FileSlice, SealedLayout, ShardData
from ...storage import ContentStore
from ...storage._sealed import DEFAULT_CHUNK_SIZE, seal_file, sealed_size
from ...storage._sealed import HEADER_SIZE, open_slice, slice_span
from ...data._dataset_dirs import visible_files

if TYPE_CHECKING:
    from ..money._settlement import EscrowAccount
    from .._training_db import TrainingDatabase

KEY_BYTES = 32
SEALED_LAYOUT = SealedLayout(chunk_size=DEFAULT_CHUNK_SIZE)


class KeyRing:
    """Dataset keys on disk: pending ones by staging name (a resumed import seals with the same key),
    final ones by the sealed directory's CID."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def pending(self, name: str) -> bytes:
        return self._read_or_make(self.root / f"{name}.pending")

    def commit(self, name: str, root_cid: str) -> None:
        os.replace(self.root / f"{name}.pending", self.root / f"{root_cid}.key")

    def drop(self, name: str) -> None:
        (self.root / f"{name}.pending").unlink(missing_ok=True)

    def key(self, root_cid: str) -> bytes:
        path = self.root / f"{root_cid}.key"
        try:
            key = path.read_bytes()
        except OSError as exc:
            raise ConfigError(f"the dataset {root_cid} is sealed and this coordinator has no key for it") from exc
        if len(key) != KEY_BYTES:
            raise ConfigError(f"{path} is not a dataset key")
        return key

    def _read_or_make(self, path: Path) -> bytes:
        if path.is_file() and len(key := path.read_bytes()) == KEY_BYTES:
            return key
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        key = secrets.token_bytes(KEY_BYTES)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as f:
            f.write(key)
        return key


def seal_tree(key: bytes, source: Path, target: Path, layout: SealedLayout = SEALED_LAYOUT) -> dict[str, int]:
    """Seal every visible file under ``source`` into ``target`` (same relative paths); returns plaintext sizes.
    Blocking. A file already sealed there (a resumed import, same key) is kept, so its CID is unchanged."""
    sizes = {}
    for path in visible_files(source):
        rel = path.relative_to(source).as_posix()
        size = path.stat().st_size
        dst = target / rel
        sizes[rel] = size
        if dst.is_file() and dst.stat().st_size == sealed_size(size, layout.chunk_size):
            continue
        dst.parent.mkdir(parents=True, exist_ok=True)
        seal_file(key, path, dst, context=layout.file_context(rel), chunk_size=layout.chunk_size)
    return sizes


async def read_sealed_slice(store: ContentStore, key: bytes, piece: FileSlice, layout: SealedLayout,
                            out: Path) -> None:
    """Plaintext of ``piece`` into ``out``: the sealed header and covering chunks fetched by range, then opened."""
    assert piece.file_size is not None  # ShardData checks it for sealed shards
    start, length = slice_span(piece.offset, piece.length, chunk_size=layout.chunk_size, file_size=piece.file_size)
    header, span = out.with_name(out.name + ".head"), out.with_name(out.name + ".span")
    try:
        header.write_bytes(await store.cat(piece.cid, offset=0, length=HEADER_SIZE, max_bytes=HEADER_SIZE))
        with open(span, "wb") as f:
            async for chunk in store.stream(piece.cid, offset=start, length=length, max_bytes=length):
                f.write(chunk)
        await asyncio.to_thread(open_slice, key, header, span, start, out, offset=piece.offset, length=piece.length,
                                file_size=piece.file_size, context=layout.file_context(piece.path),
                                chunk_size=layout.chunk_size)
    finally:
        header.unlink(missing_ok=True)
        span.unlink(missing_ok=True)


def wrapped_key_for(key: bytes, consent_digest: bytes, consent: str, training: bytes, worker: str) -> str:
    """``key`` wrapped for the worker whose EIP-191 consent signature ``consent`` is over ``consent_digest``."""
    from eth_account.messages import encode_defunct  # noqa: PLC0415

    public = signer_public_key(encode_defunct(primitive=consent_digest), consent, worker)
    return wrap_key(key, public, info=data_key_info(training, worker)).hex()


class SealedShards(Protocol):
    """What :class:`JobKeys` reads of the datasets (``datasets.DatasetStore`` is one): shard records by CID,
    and the keys. A protocol, so the datasets module depends on this one and not the other way round."""

    @property
    def keys(self) -> KeyRing: ...

    async def shard(self, cid: str) -> ShardData: ...


class JobKeys:
    """Puts the wrapped dataset key into each job of a sealed training (once per training and worker)."""

    def __init__(self, db: TrainingDatabase, data: SealedShards, escrow: EscrowAccount) -> None:
        self._db, self._data, self._escrow = db, data, escrow
        self._wrapped: dict[tuple[str, str], str] = {}

    async def attach(self, job: JobAssignment) -> JobAssignment:
        shard = await self._data.shard(job.shard_cid)  # cached by CID: no read per job
        if shard.sealed is None or shard.dataset is None:
            return job
        slot = (job.training_id, job.worker_id)
        if slot not in self._wrapped:
            contract = next((c for c in await self._db.contracts(job.training_id)
                             if c.contract_id == job.contract_id), None)
            if contract is None or contract.consent is None:
                raise MessagingError(f"worker {job.worker_id} has no signed consent to wrap the dataset key for")
            digest = await self._escrow.consent_digest(job.training_id, job.worker_id)
            self._wrapped[slot] = wrapped_key_for(self._data.keys.key(shard.dataset), digest, contract.consent,
                                                  self._escrow.key(job.training_id), job.worker_id)
        return job.model_copy(update={"data_key": self._wrapped[slot]})
