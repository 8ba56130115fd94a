"""Pack files: many blocks in one file, found through an index that is published last.

``<id>.pack`` holds blocks back to back; ``<id>.idx`` is ``AITBCPK1``, then per block a 1-byte
CID length, the binary CID, offset and length (u64, u32 little-endian), then the sha256 of all
that. Both are written under temporary names and renamed, pack first, so an index names only a
whole pack, and a torn or half-written index is refused whole. Blocks read back are still
checked against their CIDs by the store.
"""

from __future__ import annotations

import hashlib
import os
import struct
import threading
import uuid
from pathlib import Path

__all__ = ["PackIndex", "PackWriter", "read_index"]

_IDX_MAGIC = b"AITBCPK1"
_IDX_ENTRY = struct.Struct("<QI")  # offset, length; after a 1-byte CID length and the CID


class PackWriter:
    """One pack being written: blocks appended to a temp file, published by ``commit`` (index last)."""

    def __init__(self, packs: Path) -> None:
        packs.mkdir(parents=True, exist_ok=True)
        self.name = uuid.uuid4().hex
        self._packs = packs
        self._tmp = packs / f".{self.name}.pack.tmp"
        self._file = open(self._tmp, "wb", buffering=0)
        self._offset = 0
        self.entries: dict[bytes, tuple[int, int]] = {}

    def put(self, raw_cid: bytes, block: bytes) -> None:
        if raw_cid in self.entries:
            return
        view = memoryview(block)
        while view:  # raw writes may be short
            view = view[self._file.write(view):]
        self.entries[raw_cid] = (self._offset, len(block))
        self._offset += len(block)

    def commit(self) -> None:
        self._file.close()
        os.replace(self._tmp, self._packs / f"{self.name}.pack")
        index = bytearray(_IDX_MAGIC)
        for raw_cid, (offset, length) in self.entries.items():
            index += bytes((len(raw_cid),)) + raw_cid + _IDX_ENTRY.pack(offset, length)
        index += hashlib.sha256(index).digest()  # a torn index is seen as torn, never half-read
        tmp = self._packs / f".{self.name}.idx.tmp"
        tmp.write_bytes(index)
        os.replace(tmp, self._packs / f"{self.name}.idx")

    def abort(self) -> None:
        self._file.close()
        self._tmp.unlink(missing_ok=True)


def read_index(path: Path) -> dict[bytes, tuple[int, int]] | None:
    """A pack index, or None if it is not a whole one."""
    data = path.read_bytes()
    body, digest = data[:-32], data[-32:]
    if len(data) < len(_IDX_MAGIC) + 32 or not body.startswith(_IDX_MAGIC) or hashlib.sha256(body).digest() != digest:
        return None
    entries: dict[bytes, tuple[int, int]] = {}
    pos = len(_IDX_MAGIC)
    while pos < len(body):
        n = body[pos]
        raw_cid = body[pos + 1:pos + 1 + n]
        entries[raw_cid] = _IDX_ENTRY.unpack_from(body, pos + 1 + n)
        pos += 1 + n + _IDX_ENTRY.size
    return entries


class PackIndex:
    """The published packs of one folder: which pack holds a block, and where.

    Indexes are read once; ``find`` looks for newly published ones (by this store or another)
    only when a block is not known yet.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._where: dict[bytes, tuple[str, int, int]] = {}  # CID -> (pack id, offset, length)
        self._read: set[str] = set()
        self._lock = threading.Lock()

    def add(self, name: str, entries: dict[bytes, tuple[int, int]]) -> None:
        with self._lock:
            self._read.add(name)
            for raw_cid, (offset, length) in entries.items():
                self._where[raw_cid] = (name, offset, length)

    def find(self, raw_cid: bytes, *, refresh: bool = True) -> tuple[str, int, int] | None:
        where = self._where.get(raw_cid)
        if where is None and refresh:
            self._refresh()
            where = self._where.get(raw_cid)
        return where

    def read(self, raw_cid: bytes, max_bytes: int) -> bytes:
        """A packed block's bytes (at most ``max_bytes``; unchecked); FileNotFoundError if not packed."""
        where = self.find(raw_cid)
        if where is None:
            raise FileNotFoundError(f"no pack holds {raw_cid.hex()}")
        name, offset, length = where
        with open(self.folder / f"{name}.pack", "rb", buffering=0) as f:
            return os.pread(f.fileno(), min(length, max_bytes), offset)

    def _refresh(self) -> None:
        try:
            names = [p.stem for p in self.folder.iterdir() if p.suffix == ".idx" and not p.name.startswith(".")]
        except FileNotFoundError:
            return
        for name in names:
            if name not in self._read:
                entries = read_index(self.folder / f"{name}.idx")
                if entries is not None:
                    self.add(name, entries)
