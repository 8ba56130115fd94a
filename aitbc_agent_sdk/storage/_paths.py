"""Content paths (``CID/dir/file``) and directory walks, as I/O-free step generators. Pure.

A step generator yields the binary CID of each block it needs and is sent that block back,
already verified against its CID; a walk also yields the :class:`DirEntry` values it finds
(and is sent ``None`` for them). Each store drives the same generator with its own I/O:
:func:`drive` for blocking reads, an ``await`` loop for the Kubo RPC.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from typing import TypeVar

from ..errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from ._bounds import read_file_node
from ._cid import InvalidCidError, cid_from_str, cid_to_str
from ._hamt import find_in_shard, slot_path
from ._port import DirEntry
from ._unixfs_dir import MAX_DIR_DEPTH, DirectoryNode, check_name, name_bytes, node_kind, read_directory

__all__ = ["Steps", "drive", "parse_content_path", "resolve_steps", "walk_steps"]

T = TypeVar("T")
Steps = Generator[bytes, bytes, T]


def parse_content_path(path: str) -> tuple[bytes, list[str]]:
    """``CID/a/b`` or ``/ipfs/CID/a/b`` -> (binary root CID, ["a", "b"]); empty segments are dropped."""
    text = path.strip()
    if text.startswith("/ipfs/"):
        text = text[len("/ipfs/"):]
    root, *rest = text.split("/")
    segments = [segment for segment in rest if segment]
    for segment in segments:
        try:
            check_name(segment)
        except StorageError as exc:
            raise InvalidCidError(f"bad content path {path!r}: {exc}") from exc
    if len(segments) > MAX_DIR_DEPTH:
        raise InvalidCidError(f"content path {path!r} is more than {MAX_DIR_DEPTH} levels deep")
    return cid_from_str(root), segments


def drive(steps: Generator[bytes, bytes, T], get_block: Callable[[bytes], bytes]) -> T:
    """Run a step generator with a blocking, verifying ``get_block``."""
    try:
        need = next(steps)
        while True:
            need = steps.send(get_block(need))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]


def _lookup(raw_cid: bytes, node: DirectoryNode, name: str) -> Generator[bytes, bytes, bytes | None]:
    """The CID ``name`` links in a directory, descending HAMT shards as needed."""
    if not node.sharded:
        return node.find(name)
    depth = 0
    while True:
        link = find_in_shard(list(node.shard), name, depth, node.fanout)
        if link is None or link.name is not None:
            return None if link is None else link.cid
        depth += 1
        block = yield link.cid
        node = read_directory(link.cid, block, depth)
        if not node.sharded:
            raise StorageError(f"{cid_to_str(raw_cid)} links a plain directory as a HAMT shard")


def resolve_steps(root: bytes, segments: list[str]) -> Generator[bytes, bytes, bytes]:
    """Follow ``segments`` from ``root`` through directories and HAMT shards; the binary CID at the end."""
    cid = root
    for i, segment in enumerate(segments):
        block = yield cid
        node = read_directory(cid, block)
        found = yield from _lookup(cid, node, segment)
        if found is None:
            where = "/".join([cid_to_str(root), *segments[:i]])
            raise ContentNotFoundError(f"{where} has no entry {segment!r}")
        cid = found
    return cid


def _directory_entries(raw_cid: bytes, block: bytes, budget: list[int]) -> Generator[bytes, bytes, list[tuple[str, bytes]]]:
    """All (name, CID) entries of one directory, its shards fetched, sorted by name bytes."""
    node = read_directory(raw_cid, block)
    entries: list[tuple[str, bytes]] = list(node.entries)
    pending = [(link, (link.slot,)) for link in node.shard]  # each link with the slots leading to it
    while pending:
        link, slots = pending.pop()
        if link.name is not None:
            # An entry in a shard its name does not hash to: unreachable by a lookup, so refused here too.
            if slot_path(name_bytes(link.name), len(slots), node.fanout) != slots:
                raise IntegrityError(f"HAMT {cid_to_str(raw_cid)} holds {link.name!r} in a slot it does not hash to")
            entries.append((link.name, link.cid))
        else:
            sub = read_directory(link.cid, (yield link.cid), len(slots))
            if sub.fanout != node.fanout:
                raise IntegrityError(f"HAMT {cid_to_str(raw_cid)} mixes fanouts {node.fanout} and {sub.fanout}")
            pending.extend((child, (*slots, child.slot)) for child in sub.shard)
        budget[0] -= 1
        if budget[0] < 0:
            raise FetchLimitError(f"directory {cid_to_str(raw_cid)} lists more entries than the walk allows")
    budget[0] -= len(node.entries)
    if budget[0] < 0:
        raise FetchLimitError(f"directory {cid_to_str(raw_cid)} lists more entries than the walk allows")
    entries.sort(key=lambda entry: entry[0].encode("utf-8", "surrogateescape"))
    for (name, _), (after, _) in zip(entries, entries[1:]):
        if name == after:  # a HAMT can list a name in two shards; a walk must not yield it twice
            raise IntegrityError(f"directory {cid_to_str(raw_cid)} lists the name {name!r} twice")
    return entries


def walk_steps(root: bytes, max_entries: int) -> Generator[bytes | DirEntry, bytes | None, None]:
    """Yield every entry below directory ``root`` (depth first, name order), fetching what it needs."""
    budget = [max_entries]
    block = yield root
    assert isinstance(block, bytes)
    stack = [("", iter((yield from _directory_entries(root, block, budget))))]  # type: ignore[misc]
    while stack:
        prefix, pending = stack[-1]
        nxt = next(pending, None)
        if nxt is None:
            stack.pop()
            continue
        name, cid = nxt
        block = yield cid
        assert isinstance(block, bytes)
        kind = node_kind(cid, block)
        path = f"{prefix}{name}"
        if kind == "file":
            yield DirEntry(path, cid_to_str(cid), read_file_node(cid, block).size, False)
        elif kind in ("directory", "hamt"):
            if len(stack) >= MAX_DIR_DEPTH:
                raise FetchLimitError(f"{cid_to_str(root)} nests directories more than {MAX_DIR_DEPTH} deep")
            yield DirEntry(path, cid_to_str(cid), 0, True)
            entries = yield from _directory_entries(cid, block, budget)  # type: ignore[misc]
            stack.append((path + "/", iter(entries)))
        else:
            raise StorageError(f"{path} in {cid_to_str(root)} is neither a file nor a directory")
