"""The content-store port: content goes in, a CID comes out, reads are verified."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CHUNK_SIZE = 256 * 1024  # kubo's default fixed-size chunker
DEFAULT_MAX_BYTES = 1024**3  # a read that names no limit holds at most this much (1 GiB)
DEFAULT_TIMEOUT_S = 600.0  # ... and takes at most this long
DEFAULT_MAX_ENTRIES = 1_000_000  # entries one directory walk may list
HAMT_SHARDING_SIZE = 256 * 1024  # kubo's Import.UnixFSHAMTDirectorySizeThreshold


class AddOptions(BaseModel):
    """The subset of ``ipfs add`` options that change the resulting CID."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cid_version: Literal[0, 1] = 0
    raw_leaves: bool | None = Field(default=None, description="None follows kubo: on for CIDv1")
    chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, ge=1, le=1024 * 1024)
    hamt_threshold: int = Field(default=HAMT_SHARDING_SIZE, ge=0, description=(
        "directories: shard into a HAMT over this estimated size (kubo's"
        " Import.UnixFSHAMTDirectorySizeThreshold); 0 never shards"))

    @property
    def use_raw_leaves(self) -> bool:
        return self.cid_version == 1 if self.raw_leaves is None else self.raw_leaves


@runtime_checkable
class ContentStore(Protocol):
    async def add(self, data: bytes | Path, *, pin: bool = True, options: AddOptions | None = None) -> str:
        """Store bytes (or a file, streamed) and return the CID ``ipfs add`` would give."""
        ...

    async def cat(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S, offset: int = 0, length: int | None = None) -> bytes:
        """Return the content (or ``length`` bytes from ``offset``); raises ContentNotFoundError / IntegrityError.

        ``cid`` may be a path through directories, ``CID/dir/file`` (the adapters that serve
        directories resolve it); a range fetches only the blocks it overlaps.
        Reads of content from strangers name ``max_bytes`` (what the job declared) and a timeout.
        ``max_bytes`` bounds the bytes returned. A breach of either, or of the DAG shape limits in
        ``storage.bounds``, is a FetchLimitError (an IntegrityError), raised as soon as a block
        shows it. ``None`` lifts that limit only.
        """
        ...

    def stream(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
               timeout_s: float | None = DEFAULT_TIMEOUT_S, offset: int = 0,
               length: int | None = None) -> AsyncIterator[bytes]:
        """Yield the content chunk by chunk, each block verified before it is yielded; same limits as cat."""
        ...

    async def size(self, cid: str) -> int:
        """The file size the root block declares (reads that one block only)."""
        ...

    async def pin(self, cid: str) -> None:
        ...

    async def unpin(self, cid: str) -> None:
        """Drop the pin (a no-op when there is none); the blocks go at the node's next garbage collection."""
        ...


@dataclass(frozen=True, slots=True)
class DirEntry:
    """One entry of a directory walk: its path below the walked directory ('/'-separated)."""

    path: str
    cid: str
    size: int  # file bytes its root block declares; 0 for a directory
    is_dir: bool


@runtime_checkable
class DirectoryStore(ContentStore, Protocol):
    """A content store that also holds directories, with the CIDs ``ipfs add -r`` gives."""

    async def add_directory(self, path: Path, *, pin: bool = True, options: AddOptions | None = None,
                            only_hash: bool = False, hidden: bool = False, journal: Path | None = None,
                            progress: Callable[[int], None] | None = None) -> str:
        """Import a directory tree, streamed; a ``journal`` makes an interrupted import resumable."""
        ...

    async def resolve(self, path: str, *, timeout_s: float | None = DEFAULT_TIMEOUT_S) -> str:
        """``CID/a/b`` -> the CID of what the path names (file or directory), each block verified."""
        ...

    def walk_directory(self, cid: str, *, max_entries: int = DEFAULT_MAX_ENTRIES,
                       timeout_s: float | None = DEFAULT_TIMEOUT_S) -> AsyncIterator[DirEntry]:
        """Every file and directory below ``cid``, recursively, in name order per directory."""
        ...
