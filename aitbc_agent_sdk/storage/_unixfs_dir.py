"""UnixFS directories as kubo's ``ipfs add -r`` writes them, and reading one a stranger made. Pure: no I/O.

Writing (boxo ``ipld/unixfs/io/directory.go`` + go-merkledag, kubo's default settings):

* a basic directory is one dag-pb node: links ``{Hash, Name, Tsize}`` sorted by the name's
  bytes (go's ``strings.Compare``), then Data = UnixFS ``{Type=Directory}``; a link's
  Tsize is the child's cumulative DAG size (its block plus its children's Tsizes);
* it becomes a HAMT (:mod:`._hamt`) when its estimated size, the sum over its links of
  ``len(name) + len(binary CID)``, is *over* ``HAMTShardingSize`` (256 KiB). kubo >= 0.40
  (boxo >= 0.36) compares with ``>``; kubo 0.12 to 0.39 used ``>=``, which differs only for
  a directory exactly at 262,144 bytes of estimate. An import only adds entries, so the
  final set of links alone decides.

Reading: every name is checked (no ``/``, no NUL, not ``.``/``..``, not empty, at most
``MAX_NAME_BYTES``), names are unique, a block holds at most ``MAX_DIR_LINKS`` links, and HAMT
headers must agree with their links (:func:`._hamt.read_shard_links`).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from ..errors import FetchLimitError, IntegrityError, StorageError
from ._cid import DAG_PB, RAW, cid_bytes, cid_to_str, decode_cid_bytes, uvarint
from ._hamt import UNIXFS_HAMT_SHARD, Entry, ShardLink, read_shard_links, shard_blocks
from ._port import HAMT_SHARDING_SIZE
from ._unixfs import UNIXFS_DIRECTORY, UNIXFS_FILE, UNIXFS_RAW, decode_dagpb, decode_unixfs

__all__ = [
    "HAMT_SHARDING_SIZE", "MAX_DIR_DEPTH", "MAX_DIR_LINKS", "MAX_NAME_BYTES", "DirectoryNode", "Entry",
    "check_name", "directory_blocks", "encode_directory", "estimated_size", "name_bytes", "node_kind",
    "read_directory",
]

MAX_NAME_BYTES = 255  # NAME_MAX on Linux and macOS: what a file system can hold anyway
MAX_DIR_LINKS = 65536  # links in one directory block (a 2 MiB block holds about 55,000 at most)
MAX_DIR_DEPTH = 64  # nested directories in one path or walk

_DIRECTORY_DATA = b"\x0a\x02\x08\x01"  # dag-pb Data(1) = unixfs{Type=Directory}


def name_bytes(name: str) -> bytes:
    """A file name as the bytes it has on disk (undecodable bytes survive via surrogateescape)."""
    return name.encode("utf-8", "surrogateescape")


def check_name(name: str) -> None:
    """IntegrityError unless ``name`` is one safe path component."""
    if not name or name in (".", "..") or "/" in name or "\0" in name:
        raise IntegrityError(f"directory entry name {name[:80]!r} is not a single safe path component")
    if len(name_bytes(name)) > MAX_NAME_BYTES:
        raise FetchLimitError(f"directory entry name of {len(name_bytes(name))} bytes is over {MAX_NAME_BYTES}")


def estimated_size(entries: list[Entry]) -> int:
    """boxo's size estimate of a basic directory (``SizeEstimationLinks``)."""
    return sum(len(name) + len(raw_cid) for name, raw_cid, _ in entries)


def encode_directory(entries: list[Entry]) -> bytes:
    """A basic directory block: links sorted by name bytes, then Data = unixfs{Directory}."""
    parts = []
    for name, raw_cid, tsize in sorted(entries, key=lambda entry: entry[0]):
        link = b"\x0a" + uvarint(len(raw_cid)) + raw_cid + b"\x12" + uvarint(len(name)) + name + b"\x18" + uvarint(tsize)
        parts.append(b"\x12" + uvarint(len(link)) + link)
    parts.append(_DIRECTORY_DATA)
    return b"".join(parts)


def directory_blocks(entries: list[Entry], version: int, threshold: int = HAMT_SHARDING_SIZE
                     ) -> tuple[list[tuple[str, bytes]], bytes, int]:
    """The blocks of one directory (root last), its binary CID and Tsize; a HAMT over ``threshold``."""
    if threshold > 0 and estimated_size(entries) > threshold:
        return shard_blocks(entries, version)
    block = encode_directory(entries)
    raw_cid = cid_bytes(version, DAG_PB, hashlib.sha256(block).digest())
    return [(cid_to_str(raw_cid), block)], raw_cid, len(block) + sum(tsize for _, _, tsize in entries)


# --- reading -------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class DirectoryNode:
    """One verified directory block: a basic directory's entries, or one HAMT shard's links."""

    sharded: bool
    entries: tuple[tuple[str, bytes], ...] = ()  # basic: (name, binary CID), in block order
    shard: tuple[ShardLink, ...] = ()  # HAMT: the shard's links, in slot order
    fanout: int = 0

    def find(self, name: str) -> bytes | None:
        """A basic directory's entry by name."""
        for entry, raw_cid in self.entries:
            if entry == name:
                return raw_cid
        return None


def node_kind(raw_cid: bytes, block: bytes) -> str:
    """'file', 'directory', 'hamt' or 'other' (symlink, metadata): what a verified block is."""
    _, codec, _ = decode_cid_bytes(raw_cid)
    if codec == RAW:
        return "file"
    if codec != DAG_PB:
        return "other"
    node = decode_dagpb(block)
    if node.data is None:
        raise IntegrityError(f"{cid_to_str(raw_cid)} is not a UnixFS node")
    kind = decode_unixfs(node.data).type
    return {UNIXFS_RAW: "file", UNIXFS_FILE: "file", UNIXFS_DIRECTORY: "directory",
            UNIXFS_HAMT_SHARD: "hamt"}.get(kind, "other")


def read_directory(raw_cid: bytes, block: bytes, shard_depth: int = 0) -> DirectoryNode:
    """Interpret a verified block as a directory or a HAMT shard ``shard_depth`` levels deep.

    StorageError if it is not a directory; IntegrityError/FetchLimitError if it is malformed.
    """
    name = cid_to_str(raw_cid)
    _, codec, _ = decode_cid_bytes(raw_cid)
    if codec != DAG_PB:
        raise StorageError(f"{name} is not a directory")
    node = decode_dagpb(block)
    if node.data is None:
        raise IntegrityError(f"{name} is not a UnixFS node")
    unixfs = decode_unixfs(node.data)
    if unixfs.type not in (UNIXFS_DIRECTORY, UNIXFS_HAMT_SHARD):
        raise StorageError(f"{name} is not a directory (UnixFS type {unixfs.type})")
    if len(node.links) > MAX_DIR_LINKS:
        raise FetchLimitError(f"directory {name} has {len(node.links)} links; at most {MAX_DIR_LINKS} are allowed")
    if unixfs.type == UNIXFS_HAMT_SHARD:
        fanout = unixfs.fanout or 0
        links = read_shard_links([(link.name, link.cid) for link in node.links], unixfs.data or b"", fanout,
                                 unixfs.hash_type, shard_depth, check_name=check_name)
        return DirectoryNode(True, shard=tuple(links), fanout=fanout)
    if shard_depth:
        raise IntegrityError(f"{name} is a plain directory where a HAMT shard was linked")
    seen: set[str] = set()
    entries = []
    for link in node.links:
        entry = link.name or ""
        check_name(entry)
        if entry in seen:
            raise IntegrityError(f"directory {name} links the name {entry!r} twice")
        seen.add(entry)
        entries.append((entry, link.cid))
    return DirectoryNode(False, entries=tuple(entries))
