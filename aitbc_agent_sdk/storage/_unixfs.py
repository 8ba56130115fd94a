"""UnixFS files as kubo's ``ipfs add`` builds them (CIDs themselves: :mod:`._cid`). Pure: no I/O.

Layout facts this module reproduces (boxo ``importer/balanced`` + go-codec-dagpb):

* fixed-size chunks; each chunk is a leaf. Without raw leaves a leaf is a dag-pb node
  whose Data is UnixFS ``{Type=File, Data=chunk, filesize=len(chunk)}``; with raw
  leaves it is the chunk itself under codec ``raw`` (always a CIDv1, even when the
  parents are CIDv0: that is what kubo's ``V0Builder.WithCodec(raw)`` does).
* internal nodes hold at most 174 links and UnixFS ``{Type=File, filesize, blocksizes}``;
  every link is ``{Hash, Name="", Tsize}`` with all three fields written.
* dag-pb writes Links (field 2) before Data (field 1).
* balanced: all leaves sit at the same depth; a lone leaf under a new level is still
  wrapped in its own internal node. A one-chunk file's root is the leaf itself, and an
  empty file is a single leaf without a Data field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from ..errors import IntegrityError, StorageError
from ._cid import (  # re-exported: the CID helpers lived here first, and importers still read them here
    DAG_PB,
    RAW,
    SHA2_256,
    Buffer,
    InvalidCidError,
    cid_bytes,
    cid_for_block,
    cid_from_str,
    cid_to_str,
    decode_cid_bytes,
    parse_cid,
    read_uvarint,
    uvarint,
)
from ._port import AddOptions

__all__ = [
    "DAG_PB", "MAX_LINKS", "RAW", "SHA2_256", "UNIXFS_DIRECTORY", "UNIXFS_FILE", "UNIXFS_RAW", "Block", "Buffer",
    "FileDagBuilder", "InvalidCidError", "PBLink", "PBNode", "UnixFSData", "cid_bytes", "cid_for_block",
    "cid_from_str", "cid_to_str", "compute_cid", "decode_cid_bytes", "decode_dagpb", "decode_unixfs",
    "encode_file_node", "iter_blocks", "parse_cid", "read_uvarint", "split", "uvarint",
]

MAX_LINKS = 174  # boxo helpers.DefaultLinksPerBlock

UNIXFS_RAW, UNIXFS_DIRECTORY, UNIXFS_FILE = 0, 1, 2

_EMPTY_LEAF = b"\x0a\x04\x08\x02\x18\x00"  # dag-pb{Data: unixfs{Type=File, filesize=0}}

Block = tuple[str, bytes]
"""A finished block: its CID string and its bytes."""


# --- the streaming builder ------------------------------------------------------------

@dataclass(slots=True)
class _Level:
    # Per child: binary CID, Tsize (cumulative block bytes), file bytes under it.
    cids: list[bytes] = field(default_factory=list)
    tsizes: list[int] = field(default_factory=list)
    filesizes: list[int] = field(default_factory=list)


class FileDagBuilder:
    """Feed chunks, get finished blocks back; ``finish()`` returns the last blocks and the root.

    Memory is one pending level per tree depth (<= 174 small entries each), never file data.
    Every chunk but the last must be exactly ``chunk_size`` bytes (use ``write`` to have the
    builder cut them). With ``emit_blocks=False`` only CIDs are computed (``--only-hash``) and
    the returned block lists stay empty, which avoids copying chunk bytes.
    """

    def __init__(self, options: AddOptions | None = None, *, emit_blocks: bool = True) -> None:
        opts = options or AddOptions()
        self.chunk_size = opts.chunk_size
        self._version = opts.cid_version
        self._raw_leaves = opts.use_raw_leaves
        self._emit = emit_blocks
        self._levels: list[_Level] = [_Level()]
        self._short_chunk_seen = False
        self._finished = False
        self._pending = bytearray()  # only used by write()
        self._leaf_heads: dict[int, tuple[bytes, bytes]] = {}
        self.root_tsize = 0  # after finish(): the root's cumulative DAG size (a parent link's Tsize)

    def write(self, data: Buffer) -> list[Block]:
        """Accept bytes of any length; cut them into chunks the way kubo's size splitter does."""
        view = memoryview(data).cast("B")
        out: list[Block] = []
        size = self.chunk_size
        if self._pending:
            take = min(size - len(self._pending), len(view))
            self._pending += view[:take]
            view = view[take:]
            if len(self._pending) < size:
                return out
            out += self.add_chunk(self._pending)
            self._pending = bytearray()
        whole = len(view) - len(view) % size
        for start in range(0, whole, size):
            out += self.add_chunk(view[start:start + size])
        self._pending += view[whole:]
        return out

    def add_chunk(self, chunk: Buffer) -> list[Block]:
        """Add one chunk (not kept: a reused read buffer is fine)."""
        if self._finished:
            raise StorageError("builder already finished")
        n = len(memoryview(chunk))
        if n == 0:
            return []
        if n > self.chunk_size or self._short_chunk_seen:
            raise StorageError("chunks must be chunk_size bytes except the last one")
        self._short_chunk_seen = n < self.chunk_size
        out: list[Block] = []
        raw_cid, tsize = self._leaf(chunk, n, out)
        self._push(0, raw_cid, tsize, n, out)
        return out

    def finish(self) -> tuple[list[Block], str]:
        """Flush what is pending; return (remaining blocks, root CID)."""
        if self._finished:
            raise StorageError("builder already finished")
        out: list[Block] = []
        if self._pending:
            out += self.add_chunk(self._pending)
            self._pending = bytearray()
        self._finished = True
        levels = self._levels
        if not levels[0].cids and len(levels) == 1:  # empty file: one leaf without Data
            if self._raw_leaves:
                return out, cid_to_str(self._block(1, RAW, b"", out))
            self.root_tsize = len(_EMPTY_LEAF)
            return out, cid_to_str(self._block(self._version, DAG_PB, _EMPTY_LEAF, out))
        # Close every partial level below the top: balanced keeps all leaves at one depth.
        for depth in range(len(levels) - 1):
            if levels[depth].cids:
                self._flush(depth, out)
        top = levels[-1]
        if len(top.cids) == 1:  # a single leaf, or a tree that was exactly full
            self.root_tsize = top.tsizes[0]
            return out, cid_to_str(top.cids[0])
        self._flush(len(levels) - 1, out)
        self.root_tsize = levels[-1].tsizes[0]
        return out, cid_to_str(levels[-1].cids[0])

    # internals

    def _leaf(self, chunk: Buffer, n: int, out: list[Block]) -> tuple[bytes, int]:
        if self._raw_leaves:  # raw leaves are CIDv1 even under CIDv0 parents
            return self._block(1, RAW, bytes(chunk) if self._emit else chunk, out), n
        head, tail = self._leaf_heads.get(n) or self._make_leaf_head(n)
        if self._emit:
            return self._block(self._version, DAG_PB, b"".join((head, chunk, tail)), out), len(head) + n + len(tail)
        h = hashlib.sha256(head)  # only-hash: hash the pieces, never copy the chunk
        h.update(chunk)
        h.update(tail)
        return cid_bytes(self._version, DAG_PB, h.digest()), len(head) + n + len(tail)

    def _block(self, version: int, codec: int, block: Buffer, out: list[Block]) -> bytes:
        raw_cid = cid_bytes(version, codec, hashlib.sha256(block).digest())
        if self._emit:
            assert isinstance(block, bytes)
            out.append((cid_to_str(raw_cid), block))
        return raw_cid

    def _make_leaf_head(self, n: int) -> tuple[bytes, bytes]:
        # dag-pb{Data(1): unixfs{Type(1)=File, Data(2)=chunk, filesize(3)=n}}
        size_field = b"\x18" + uvarint(n)
        unixfs_len = 2 + 1 + len(uvarint(n)) + n + len(size_field)
        head = b"\x0a" + uvarint(unixfs_len) + b"\x08\x02\x12" + uvarint(n)
        self._leaf_heads[n] = (head, size_field)
        return head, size_field

    def _push(self, depth: int, raw_cid: bytes, tsize: int, filesize: int, out: list[Block]) -> None:
        level = self._levels[depth]
        level.cids.append(raw_cid)
        level.tsizes.append(tsize)
        level.filesizes.append(filesize)
        if len(level.cids) == MAX_LINKS:
            # A full node is final whatever comes next, so emit it now.
            self._flush(depth, out)

    def _flush(self, depth: int, out: list[Block]) -> None:
        level = self._levels[depth]
        block = encode_file_node(level.cids, level.tsizes, level.filesizes)
        raw_cid = self._block(self._version, DAG_PB, block, out)
        tsize = len(block) + sum(level.tsizes)
        filesize = sum(level.filesizes)
        self._levels[depth] = _Level()
        if depth + 1 == len(self._levels):
            self._levels.append(_Level())
        self._push(depth + 1, raw_cid, tsize, filesize, out)


def encode_file_node(cids: list[bytes], tsizes: list[int], filesizes: list[int]) -> bytes:
    """An internal dag-pb node: Links first, then Data = unixfs{File, filesize, blocksizes}."""
    parts: list[bytes] = []
    for raw_cid, tsize in zip(cids, tsizes, strict=True):
        link = b"\x0a" + uvarint(len(raw_cid)) + raw_cid + b"\x12\x00\x18" + uvarint(tsize)
        parts.append(b"\x12" + uvarint(len(link)) + link)
    unixfs = b"".join([b"\x08\x02\x18", uvarint(sum(filesizes))] + [b"\x20" + uvarint(s) for s in filesizes])
    parts.append(b"\x0a" + uvarint(len(unixfs)) + unixfs)
    return b"".join(parts)


def split(data: Buffer, chunk_size: int) -> Iterator[memoryview]:
    """Zero-copy fixed-size chunks of in-memory bytes."""
    view = memoryview(data).cast("B")
    return (view[i:i + chunk_size] for i in range(0, len(view), chunk_size))


def compute_cid(data: Buffer, options: AddOptions | None = None) -> str:
    """The CID ``ipfs add --only-hash`` prints for these bytes."""
    builder = FileDagBuilder(options, emit_blocks=False)
    for chunk in split(data, builder.chunk_size):
        builder.add_chunk(chunk)
    return builder.finish()[1]


def iter_blocks(data: Buffer, options: AddOptions | None = None) -> Iterator[Block]:
    """Every block of the DAG for ``data``, root last."""
    builder = FileDagBuilder(options)
    for chunk in split(data, builder.chunk_size):
        yield from builder.add_chunk(chunk)
    yield from builder.finish()[0]


# --- decoding ---------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class PBLink:
    cid: bytes  # binary CID
    name: str | None
    tsize: int | None


@dataclass(frozen=True, slots=True)
class PBNode:
    links: list[PBLink]
    data: bytes | None


@dataclass(frozen=True, slots=True)
class UnixFSData:
    type: int
    data: bytes | None
    filesize: int | None
    blocksizes: list[int]
    hash_type: int | None = None  # HAMT shards only
    fanout: int | None = None  # HAMT shards only


def _fields(buf: bytes) -> Iterator[tuple[int, int, int | bytes]]:
    """Protobuf (field number, wire type, value) triples; dag-pb/UnixFS use only varint and bytes."""
    pos, end = 0, len(buf)
    while pos < end:
        key, pos = read_uvarint(buf, pos)
        num, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = read_uvarint(buf, pos)
            yield num, wire, value
        elif wire == 2:
            length, pos = read_uvarint(buf, pos)
            if pos + length > end:
                raise ValueError("length-delimited field overruns the message")
            yield num, wire, buf[pos:pos + length]
            pos += length
        else:
            raise ValueError(f"unsupported protobuf wire type {wire}")


def decode_dagpb(block: bytes) -> PBNode:
    """Split a dag-pb block into its links and its (UnixFS) data."""
    links: list[PBLink] = []
    data: bytes | None = None
    try:
        for num, wire, value in _fields(block):
            if wire != 2 or num not in (1, 2):
                raise ValueError(f"unexpected dag-pb field {num}")
            assert isinstance(value, bytes)
            if num == 1:
                data = value
            else:
                links.append(_decode_link(value))
    except ValueError as exc:  # UnicodeDecodeError included
        raise IntegrityError(f"malformed dag-pb block: {exc}") from exc
    return PBNode(links, data)


def _decode_link(buf: bytes) -> PBLink:
    found: dict[int, int | bytes] = {}
    for num, wire, value in _fields(buf):
        if (num, wire) not in ((1, 2), (2, 2), (3, 0)):
            raise ValueError(f"unexpected dag-pb link field {num}")
        found[num] = value
    raw_cid, name, tsize = found.get(1), found.get(2), found.get(3)
    if not isinstance(raw_cid, bytes):
        raise ValueError("dag-pb link without Hash")
    return PBLink(raw_cid, name.decode() if isinstance(name, bytes) else None, tsize if isinstance(tsize, int) else None)


def decode_unixfs(data: bytes) -> UnixFSData:
    """Decode UnixFS ``Data``; mode and mtime are skipped."""
    found: dict[int, int | bytes] = {}
    blocksizes: list[int] = []
    try:
        for num, _, value in _fields(data):
            if num == 4 and isinstance(value, int):
                blocksizes.append(value)
            elif num == 4 and isinstance(value, bytes):  # tolerate packed encoding on read
                pos = 0
                while pos < len(value):
                    size, pos = read_uvarint(value, pos)
                    blocksizes.append(size)
            else:
                found[num] = value
    except ValueError as exc:
        raise IntegrityError(f"malformed UnixFS data: {exc}") from exc
    typ, payload, filesize = found.get(1), found.get(2), found.get(3)
    hash_type, fanout = found.get(5), found.get(6)
    if not isinstance(typ, int) or isinstance(payload, int) or isinstance(filesize, bytes):
        raise IntegrityError("UnixFS data without a valid Type, Data or filesize")
    if isinstance(hash_type, bytes) or isinstance(fanout, bytes):
        raise IntegrityError("UnixFS data with a malformed hashType or fanout")
    return UnixFSData(typ, payload, filesize, blocksizes, hash_type, fanout)
