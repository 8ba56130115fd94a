"""Reading a file DAG that a stranger made: the limits, and the bounded walk. Pure: no I/O.

A CID commits to its blocks, not to how much there is: a root with 4,000 links to one
256 KiB block is 1 GB of content from 0.45 MB stored, and one more level is terabytes. So
a read is held to what the blocks themselves declare, checked before a child is fetched:

* the root's UnixFS ``filesize`` must fit ``max_bytes`` (the caller's limit);
* every node's ``filesize`` is its own data plus its ``blocksizes``, one per link, and each
  child must hold exactly the size its parent gave it: the content can never outgrow
  what the root declared;
* at most ``MAX_NODE_LINKS`` links per node, ``MAX_DAG_DEPTH`` levels, blocks of at most
  ``MAX_BLOCK_BYTES``, no empty children, and a block count that an honest balanced tree
  never reaches; plus a deadline checked at every block.

Every breach is a :class:`FetchLimitError` (an ``IntegrityError``). The walk is a loop over
an explicit stack, so depth costs no recursion.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from ..errors import FetchLimitError, IntegrityError, StorageError
from ._port import DEFAULT_MAX_BYTES
from ._unixfs import DAG_PB, RAW, UNIXFS_FILE, UNIXFS_RAW, cid_to_str, decode_cid_bytes, decode_dagpb, decode_unixfs

MAX_BLOCK_BYTES = 2 * 1024 * 1024  # what bitswap moves at most; kubo's chunks are at most 1 MiB
MAX_NODE_LINKS = 1024  # kubo and js-ipfs write 174; other importers up to 1024
MAX_DAG_DEPTH = 16  # a balanced tree of 174-link nodes over 1-byte chunks holds 174**16 bytes
FETCH_BASE_S = 30.0
FETCH_MIN_RATE = 1024 * 1024  # bytes per second a fetch may not fall below, on top of FETCH_BASE_S


def fetch_timeout_s(nbytes: int) -> float:
    """A total deadline for fetching ``nbytes``: a fixed allowance plus 1 MiB/s."""
    return FETCH_BASE_S + max(0, nbytes) / FETCH_MIN_RATE


@dataclass(frozen=True, slots=True)
class FileNode:
    """One verified block of a file DAG, its sizes checked for consistency."""

    data: bytes  # the file bytes this node holds itself
    children: tuple[tuple[bytes, int], ...]  # (binary CID, file bytes the child must hold), in order
    size: int  # file bytes under this node, as its block declares


def read_file_node(cid: bytes, block: bytes) -> FileNode:
    """Interpret one block (already checked against ``cid``); IntegrityError if its sizes do not add up."""
    name = cid_to_str(cid)
    if len(block) > MAX_BLOCK_BYTES:
        raise FetchLimitError(f"block {name} is {len(block)} bytes, over the {MAX_BLOCK_BYTES}-byte block limit")
    _, codec, _ = decode_cid_bytes(cid)
    if codec == RAW:
        return FileNode(block, (), len(block))
    if codec != DAG_PB:
        raise StorageError(f"unsupported codec 0x{codec:x} in a file DAG")
    node = decode_dagpb(block)
    if node.data is None:
        raise IntegrityError(f"{name} is not a UnixFS node")
    unixfs = decode_unixfs(node.data)
    if unixfs.type not in (UNIXFS_FILE, UNIXFS_RAW):
        raise StorageError(f"{name} is not a file (UnixFS type {unixfs.type})")
    data = unixfs.data or b""
    if len(node.links) > MAX_NODE_LINKS:
        raise FetchLimitError(f"{name} has {len(node.links)} links; at most {MAX_NODE_LINKS} are allowed")
    if node.links and len(unixfs.blocksizes) != len(node.links):
        raise IntegrityError(f"{name} has {len(node.links)} links but {len(unixfs.blocksizes)} block sizes")
    if any(size == 0 for size in unixfs.blocksizes[:len(node.links)]):
        raise IntegrityError(f"{name} links an empty child")
    size = len(data) + (sum(unixfs.blocksizes) if node.links else 0)
    if unixfs.filesize is not None and unixfs.filesize != size:
        raise IntegrityError(f"{name} declares a size of {unixfs.filesize} bytes but holds {size}")
    children = tuple(zip((link.cid for link in node.links), unixfs.blocksizes, strict=False))
    return FileNode(data, children, size)


Child = tuple[bytes, int, int]
"""A child to fetch: (binary CID, file bytes it must hold, file offset where its bytes start)."""


def check_range(offset: int, length: int | None) -> None:
    if offset < 0 or (length is not None and length < 0):
        raise StorageError(f"a read range needs offset >= 0 and length >= 0 (got {offset}, {length})")


def node_parts(node: FileNode, start: int, lo: int, hi: int) -> tuple[bytes, list[Child]]:
    """The part of a node's own data inside [lo, hi) and the children that overlap it.

    ``start`` is the file offset of the node's first byte: its data comes first, then its children.
    """
    end = start + len(node.data)
    if lo <= start and end <= hi:
        data = node.data
    else:
        data = node.data[max(0, lo - start):max(0, min(hi, end) - start)]
    children: list[Child] = []
    at = end
    for cid, size in node.children:
        if at < hi and at + size > lo:
            children.append((cid, size, at))
        at += size
    return data, children


class DagBudget:
    """What one read may still spend; every block of the read passes through :meth:`accept`.

    After the root is accepted, ``lo``/``hi`` are the file range the read returns.
    """

    def __init__(self, root: bytes, max_bytes: int | None, deadline: float | None, offset: int = 0,
                 length: int | None = None) -> None:
        check_range(offset, length)
        self.root = cid_to_str(root)
        self.max_bytes = max_bytes
        self.deadline = deadline  # time.monotonic() value, or None
        self.blocks = 0
        self.max_blocks = 1
        self.offset, self.length = offset, length
        self.lo = self.hi = 0

    def check_time(self) -> None:
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise FetchLimitError(f"reading {self.root} timed out")

    def accept(self, cid: bytes, block: bytes, expected: int | None, depth: int) -> FileNode:
        """Check one fetched block; ``expected`` is None for the root, else what its parent declared."""
        self.check_time()
        node = read_file_node(cid, block)
        if expected is None:
            self.lo = min(self.offset, node.size)
            self.hi = node.size if self.length is None else min(node.size, self.lo + self.length)
            if self.max_bytes is not None and self.hi - self.lo > self.max_bytes:
                whole = self.hi - self.lo == node.size
                what = f"declares {node.size} bytes" if whole else f"has {self.hi - self.lo} bytes in the range read"
                raise FetchLimitError(f"{self.root} {what}, over the limit of {self.max_bytes}")
            # Balanced trees have fewer internal nodes than leaves (plus one chain per level),
            # and every leaf holds at least one byte.
            self.max_blocks = 2 * node.size + MAX_DAG_DEPTH + 1
        elif node.size != expected:
            raise FetchLimitError(f"{cid_to_str(cid)} holds {node.size} bytes, but its parent declares a size"
                                  f" of {expected} for it")
        self.blocks += 1
        if self.blocks > self.max_blocks:
            raise FetchLimitError(f"{self.root} has more blocks than {self.max_blocks}")
        if node.children and depth >= MAX_DAG_DEPTH:
            raise FetchLimitError(f"{self.root} is more than {MAX_DAG_DEPTH} levels deep")
        return node


def deadline_after(timeout_s: float | None) -> float | None:
    return None if timeout_s is None else time.monotonic() + timeout_s


def walk_file(root: bytes, get_block: Callable[[bytes], bytes], *, max_bytes: int | None = DEFAULT_MAX_BYTES,
              deadline: float | None = None, offset: int = 0, length: int | None = None) -> Iterator[bytes]:
    """Yield a file's bytes in order from binary CID ``root``, within the limits above.

    With ``offset``/``length`` only that range is yielded, and only the blocks that overlap it
    are fetched. ``get_block`` does the (blocking) I/O and must verify each block against its CID.
    """
    budget = DagBudget(root, max_bytes, deadline, offset, length)
    node = budget.accept(root, get_block(root), None, 0)
    data, children = node_parts(node, 0, budget.lo, budget.hi)
    if data:
        yield data
    stack = [iter(children)]
    while stack:
        nxt = next(stack[-1], None)
        if nxt is None:
            stack.pop()
            continue
        budget.check_time()
        cid, size, start = nxt
        node = budget.accept(cid, get_block(cid), size, len(stack))
        data, children = node_parts(node, start, budget.lo, budget.hi)
        if data:
            yield data
        if children:
            stack.append(iter(children))
