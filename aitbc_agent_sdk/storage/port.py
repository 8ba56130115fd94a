"""The content-store port: content goes in, a CID comes out, reads are verified."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

DEFAULT_CHUNK_SIZE = 256 * 1024  # kubo's default fixed-size chunker
DEFAULT_MAX_BYTES = 1024**3  # a read that names no limit holds at most this much (1 GiB)
DEFAULT_TIMEOUT_S = 600.0  # ... and takes at most this long


class AddOptions(BaseModel):
    """The subset of ``ipfs add`` options that change the resulting CID."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cid_version: Literal[0, 1] = 0
    raw_leaves: bool | None = Field(default=None, description="None follows kubo: on for CIDv1")
    chunk_size: int = Field(default=DEFAULT_CHUNK_SIZE, ge=1, le=1024 * 1024)

    @property
    def use_raw_leaves(self) -> bool:
        return self.cid_version == 1 if self.raw_leaves is None else self.raw_leaves


@runtime_checkable
class ContentStore(Protocol):
    async def add(self, data: bytes | Path, *, pin: bool = True, options: AddOptions | None = None) -> str:
        """Store bytes (or a file, streamed) and return the CID ``ipfs add`` would give."""
        ...

    async def cat(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
                  timeout_s: float | None = DEFAULT_TIMEOUT_S) -> bytes:
        """Return the whole content; raises ContentNotFoundError / IntegrityError.

        Reads of content from strangers name ``max_bytes`` (what the job declared) and a timeout.
        A breach of either, or of the DAG shape limits in ``storage.bounds``, is a FetchLimitError
        (an IntegrityError), raised as soon as a block shows it. ``None`` lifts that limit only.
        """
        ...

    def stream(self, cid: str, *, max_bytes: int | None = DEFAULT_MAX_BYTES,
               timeout_s: float | None = DEFAULT_TIMEOUT_S) -> AsyncIterator[bytes]:
        """Yield the content chunk by chunk, each block verified before it is yielded; same limits as cat."""
        ...

    async def size(self, cid: str) -> int:
        """The file size the root block declares (reads that one block only)."""
        ...

    async def pin(self, cid: str) -> None:
        ...
