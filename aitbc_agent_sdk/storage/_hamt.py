"""UnixFS HAMT shards (sharded directories) as boxo's ``ipld/unixfs/hamt`` writes them. Pure: no I/O.

Layout facts this module reproduces:

* the key of an entry is the murmur3 x64 hash of its name, first 64 bits, big-endian
  (spaolacci ``murmur3.New64``, multicodec ``0x22``); each level takes the next
  log2(fanout) bits (8 for the default fanout of 256), so a 256-wide trie is at most 8 deep;
* a slot holding one entry links it as ``"%02X" % slot + name``; a slot where several
  entries collide links a child shard named just ``"%02X" % slot``. The trie is canonical:
  its shape depends only on the set of names, not on the insertion order;
* Data = UnixFS ``{Type=HAMTShard(5), Data=bitfield, hashType=0x22, fanout}``, the
  bitfield a big-endian integer with bit ``slot`` set per used slot, leading zero bytes
  dropped (go-bitfield ``Bytes()``).
"""

from __future__ import annotations

import hashlib
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import FetchLimitError, IntegrityError, StorageError
from ._cid import DAG_PB, cid_bytes, cid_to_str, uvarint

__all__ = [
    "DEFAULT_FANOUT", "MURMUR3_X64_64", "UNIXFS_HAMT_SHARD", "Entry", "ShardLink", "encode_shard", "find_in_shard",
    "max_shard_depth", "murmur3_x64_64", "read_shard_links", "shard_blocks", "slot_of", "slot_path",
]

DEFAULT_FANOUT = 256  # boxo DefaultShardWidth
MURMUR3_X64_64 = 0x22
UNIXFS_HAMT_SHARD = 5
MAX_FANOUT = 1024  # boxo maximumHamtWidth

_M64 = (1 << 64) - 1
_C1, _C2 = 0x87C37B91114253D5, 0x4CF5AD432745937F


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (64 - r))) & _M64


def _fmix(k: int) -> int:
    k ^= k >> 33
    k = (k * 0xFF51AFD7ED558CCD) & _M64
    k ^= k >> 33
    k = (k * 0xC4CEB9FE1A85EC53) & _M64
    return k ^ (k >> 33)


def _mix_k1(k1: int) -> int:
    return (_rotl((k1 * _C1) & _M64, 31) * _C2) & _M64


def _mix_k2(k2: int) -> int:
    return (_rotl((k2 * _C2) & _M64, 33) * _C1) & _M64


def murmur3_x64_64(data: bytes) -> bytes:
    """The first 64 bits of MurmurHash3 x64_128 (seed 0), big-endian: what boxo's HAMT hashes names with."""
    h1 = h2 = 0
    n = len(data)
    whole = n - n % 16
    for i in range(0, whole, 16):
        h1 ^= _mix_k1(int.from_bytes(data[i:i + 8], "little"))
        h1 = (_rotl(h1, 27) + h2) & _M64
        h1 = (h1 * 5 + 0x52DCE729) & _M64
        h2 ^= _mix_k2(int.from_bytes(data[i + 8:i + 16], "little"))
        h2 = (_rotl(h2, 31) + h1) & _M64
        h2 = (h2 * 5 + 0x38495AB5) & _M64
    tail = data[whole:]
    if len(tail) > 8:
        h2 ^= _mix_k2(int.from_bytes(tail[8:], "little"))
    if tail:
        h1 ^= _mix_k1(int.from_bytes(tail[:8], "little"))
    h1 ^= n
    h2 ^= n
    h1 = (h1 + h2) & _M64
    h2 = (h2 + h1) & _M64
    h1, h2 = _fmix(h1), _fmix(h2)
    h1 = (h1 + h2) & _M64
    return h1.to_bytes(8, "big")


def _bits_per_level(fanout: int) -> int:
    if fanout < 8 or fanout > MAX_FANOUT or fanout & (fanout - 1) or fanout % 8:
        raise IntegrityError(f"HAMT fanout {fanout} is not a power of two between 8 and {MAX_FANOUT}")
    return fanout.bit_length() - 1


def max_shard_depth(fanout: int) -> int:
    """Levels a 64-bit hash can index: deeper shards cannot be reached by any name."""
    return 64 // _bits_per_level(fanout)


def slot_of(name: bytes, depth: int, fanout: int = DEFAULT_FANOUT) -> int:
    """The slot of ``name`` in a shard ``depth`` levels below the root (boxo ``hashBits.Next``)."""
    bits = _bits_per_level(fanout)
    if (depth + 1) * bits > 64:
        raise StorageError("sharded directory too deep")
    key = int.from_bytes(murmur3_x64_64(name), "big")
    return (key >> (64 - (depth + 1) * bits)) & (fanout - 1)


def slot_path(name: bytes, levels: int, fanout: int = DEFAULT_FANOUT) -> tuple[int, ...]:
    """The slots of ``name`` in the shards from the root down ``levels`` levels."""
    bits = _bits_per_level(fanout)
    if levels * bits > 64:
        raise StorageError("sharded directory too deep")
    key = int.from_bytes(murmur3_x64_64(name), "big")
    return tuple((key >> (64 - (depth + 1) * bits)) & (fanout - 1) for depth in range(levels))


def _prefix_len(fanout: int) -> int:
    return len(f"{fanout - 1:X}")


# --- writing -------------------------------------------------------------------------------

Entry = tuple[bytes, bytes, int]
"""A directory entry to link: (name bytes, binary CID, Tsize)."""


def encode_shard(links: list[Entry], bitfield: int, fanout: int) -> bytes:
    """One shard block: its links (sorted by name bytes, as go-merkledag encodes) then its UnixFS Data."""
    parts = []
    for name, raw_cid, tsize in sorted(links, key=lambda link: link[0]):
        link = b"\x0a" + uvarint(len(raw_cid)) + raw_cid + b"\x12" + uvarint(len(name)) + name + b"\x18" + uvarint(tsize)
        parts.append(b"\x12" + uvarint(len(link)) + link)
    field = bitfield.to_bytes((bitfield.bit_length() + 7) // 8, "big")
    unixfs = b"\x08\x05" + (b"\x12" + uvarint(len(field)) + field if field else b"")
    unixfs += b"\x28" + uvarint(MURMUR3_X64_64) + b"\x30" + uvarint(fanout)
    parts.append(b"\x0a" + uvarint(len(unixfs)) + unixfs)
    return b"".join(parts)


def shard_blocks(entries: list[Entry], version: int, fanout: int = DEFAULT_FANOUT
                 ) -> tuple[list[tuple[str, bytes]], bytes, int]:
    """Every block of the HAMT over ``entries`` (root last), the root's binary CID and its Tsize."""
    blocks: list[tuple[str, bytes]] = []
    hashed = [(int.from_bytes(murmur3_x64_64(name), "big"), name, raw_cid, tsize) for name, raw_cid, tsize in entries]
    raw_cid, tsize = _build(hashed, 0, version, fanout, blocks)
    return blocks, raw_cid, tsize


def _build(entries: list[tuple[int, bytes, bytes, int]], depth: int, version: int, fanout: int,
           blocks: list[tuple[str, bytes]]) -> tuple[bytes, int]:
    bits = _bits_per_level(fanout)
    if (depth + 1) * bits > 64:
        raise StorageError("sharded directory too deep: names with the same 64-bit hash")
    shift = 64 - (depth + 1) * bits
    slots: dict[int, list[tuple[int, bytes, bytes, int]]] = defaultdict(list)
    for entry in entries:
        slots[(entry[0] >> shift) & (fanout - 1)].append(entry)
    width = _prefix_len(fanout)
    links: list[Entry] = []
    bitfield = 0
    for slot, group in slots.items():
        bitfield |= 1 << slot
        prefix = f"{slot:0{width}X}".encode()
        if len(group) == 1:
            _, name, raw_cid, tsize = group[0]
            links.append((prefix + name, raw_cid, tsize))
        else:  # a collision: the slot becomes a child shard one level down
            links.append((prefix, *_build(group, depth + 1, version, fanout, blocks)))
    block = encode_shard(links, bitfield, fanout)
    raw_cid = cid_bytes(version, DAG_PB, hashlib.sha256(block).digest())
    blocks.append((cid_to_str(raw_cid), block))
    return raw_cid, len(block) + sum(link[2] for link in links)


# --- reading -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class ShardLink:
    """One checked link of a shard: a directory entry (``name`` set) or a child shard (``name`` None)."""

    slot: int
    name: str | None
    cid: bytes


def read_shard_links(links: list[tuple[str | None, bytes]], bitfield: bytes, fanout: int,
                     hash_type: int | None, depth: int, *,
                     check_name: Callable[[str], None] | None = None) -> list[ShardLink]:
    """Check a shard's links against its own header; IntegrityError/FetchLimitError on anything off.

    ``links`` are (name, binary CID) in block order; ``check_name`` validates an entry name
    (the caller's rules for directory names).
    """
    if hash_type != MURMUR3_X64_64:
        raise IntegrityError(f"HAMT shard uses hash function {hash_type}; only murmur3 (0x22) is supported")
    _bits_per_level(fanout)
    if depth >= max_shard_depth(fanout):
        raise FetchLimitError(f"HAMT shards nest deeper than a 64-bit hash can index ({max_shard_depth(fanout)})")
    if len(bitfield) > fanout // 8:
        raise IntegrityError(f"HAMT bitfield of {len(bitfield)} bytes is larger than a {fanout}-wide shard's")
    used = int.from_bytes(bitfield, "big")
    if len(links) != used.bit_count():
        raise IntegrityError(f"HAMT shard has {len(links)} links but {used.bit_count()} used slots")
    width = _prefix_len(fanout)
    out: list[ShardLink] = []
    last = -1
    for name, raw_cid in links:
        prefix = (name or "")[:width]
        if len(prefix) != width or any(c not in "0123456789ABCDEF" for c in prefix):
            raise IntegrityError(f"HAMT link name {name!r} does not start with a {width}-digit slot")
        slot = int(prefix, 16)
        if slot >= fanout or not used >> slot & 1 or slot <= last:
            raise IntegrityError(f"HAMT link {name!r} names a slot the bitfield does not hold (or twice)")
        last = slot
        entry = (name or "")[width:]
        if entry and check_name is not None:
            check_name(entry)
        out.append(ShardLink(slot, entry or None, raw_cid))
    return out


def find_in_shard(links: list[ShardLink], name: str, depth: int, fanout: int) -> ShardLink | None:
    """The link that holds ``name`` at this level: the entry itself, a child shard to descend, or None."""
    slot = slot_of(name.encode("utf-8", "surrogateescape"), depth, fanout)
    for link in links:
        if link.slot == slot:
            return link if link.name is None or link.name == name else None
    return None
