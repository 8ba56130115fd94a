"""UnixFS directories and HAMT shards: kubo's own CIDs, range reads, hostile directory blocks (no store).

The ground truth is kubo's sharness suite (independent of the js-ipfs daemon the other tests use):
* t0260-sharding.sh: ``file1..file2000``, each holding ``echo $i``, added with sharding forced off
  (threshold 1G), forced on (1B), and forced on with ``--cid-version=1``; and ``file100``'s CID;
* t0250-files-api.sh: ``file000001..file005960`` at the default 256 KiB threshold (just over it:
  a HAMT) and the same directory less its first five entries (just under it: a basic directory);
* t0040-add-and-cat.sh: small nested trees (planets, moons, ``add -r .``) under four option sets.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from aitbc_agent_sdk.errors import ContentNotFoundError, FetchLimitError, IntegrityError, StorageError
from aitbc_agent_sdk.storage import (
    AddOptions,
    DirEntry,
    FileDagBuilder,
    InvalidCidError,
    cid_from_str,
    cid_to_str,
    compute_directory_cid,
    walk_file,
)
from aitbc_agent_sdk.storage._cid import DAG_PB, cid_bytes, uvarint
from aitbc_agent_sdk.storage._hamt import encode_shard, murmur3_x64_64, shard_blocks, slot_of
from aitbc_agent_sdk.storage._paths import drive, parse_content_path, resolve_steps, walk_steps
from aitbc_agent_sdk.storage._unixfs_dir import (
    HAMT_SHARDING_SIZE,
    Entry,
    directory_blocks,
    encode_directory,
    read_directory,
)

UNSHARDED = "QmavrTrQG4VhoJmantURAYuw3bowq3E2WcvP36NRQDAC1N"
SHARDED = "QmSCJD1KYLhVVHqBK3YyXuoEqHt7vggyJhzoFYbT8v1XYL"
SHARDED_V1 = "bafybeibiemewfzzdyhq2l74wrd6qj2oz42usjlktgnlqv4yfawgouaqn4u"
FILE100 = "QmZ3RfWk1u5LEGYLHA633B5TNJy3Du27K6Fny9wcxpowGS"
LARGE_SHARDED = "QmWfjnRWRvdvYezQWnfbvrvY7JjrpevsE9cato1x76UqGr"
LARGE_MINUS_5_UNSHARDED = "QmbVxi5zDdzytrjdufUejM92JsWj8wGVmukk6tiPce3p1m"


def file_entry(name: str, data: bytes, options: AddOptions) -> Entry:
    builder = FileDagBuilder(options, emit_blocks=False)
    builder.write(data)
    _, root = builder.finish()
    return name.encode(), cid_from_str(root), builder.root_tsize


def echo_files(names: Callable[[int], str], count: int, options: AddOptions) -> list[Entry]:
    return [file_entry(names(i), f"{i}\n".encode(), options) for i in range(1, count + 1)]


def root_of(entries: list[Entry], options: AddOptions, threshold: int = HAMT_SHARDING_SIZE) -> str:
    return cid_to_str(directory_blocks(entries, options.cid_version, threshold)[1])


def test_murmur3_matches_the_reference_vectors() -> None:
    # MurmurHash3_x64_128 (seed 0), first 64 bits: the published values for these inputs.
    assert murmur3_x64_64(b"").hex() == "0000000000000000"
    assert murmur3_x64_64(b"hello").hex() == "cbd8a7b341bd9b02"
    assert murmur3_x64_64(b"The quick brown fox jumps over the lazy dog").hex() == "e34bbc7bbc071b6c"


def test_kubo_sharness_directories() -> None:
    v0, v1 = AddOptions(), AddOptions(cid_version=1)
    files = echo_files(lambda i: f"file{i}", 2000, v0)
    assert cid_to_str(files[99][1]) == FILE100
    assert root_of(files, v0, threshold=1024**3) == UNSHARDED
    assert root_of(files, v0, threshold=1) == SHARDED
    assert root_of(echo_files(lambda i: f"file{i}", 2000, v1), v1, threshold=1) == SHARDED_V1


def test_kubo_shards_just_over_256_kib_and_not_just_under() -> None:
    v0 = AddOptions()
    files = echo_files(lambda i: f"file{i:06d}", 5960, v0)  # 5960 * (10 + 34) = 262,240 bytes of estimate
    assert root_of(files, v0) == LARGE_SHARDED
    assert root_of(files[5:], v0) == LARGE_MINUS_5_UNSHARDED  # 262,020: stays one block


def _write(root: Path, files: dict[str, bytes]) -> Path:
    for rel, data in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
    return root


@pytest.mark.parametrize("options,planets", [  # t0040-add-and-cat.sh, add_directory with each EXTRA_ARGS
    (AddOptions(), "QmWSgS32xQEcXMeqd3YPJLrNBLSdsfYCep2U7CFkyrjXwY"),
    (AddOptions(raw_leaves=True), "QmfWfQfKCY5Ukv9peBbxM5vqWM9BzmqUSXvdCgjT2wsiBT"),
    (AddOptions(cid_version=1), "bafybeih7e5dmkyk25up5vxug4q3hrg2fxbzf23dfrac2fns5h7z4aa7ioi"),
    (AddOptions(cid_version=1, raw_leaves=False), "bafybeif5tuep5ap2d7zyhbktucey75aoacxufgt6i3v4gebmixyipnyp7y"),
])
def test_kubo_sharness_nested_trees(tmp_path: Path, options: AddOptions, planets: str) -> None:
    tree = _write(tmp_path / "planets", {"mars.txt": b"Hello Mars!\n", "venus.txt": b"Hello Venus!\n"})
    assert compute_directory_cid(tree, options) == planets
    if options == AddOptions():
        moons = _write(tmp_path / "moons", {"jupiter/europa.txt": b"Hello Europa!\n",
                                            "saturn/titan.txt": b"Hello Titan!\n",
                                            "mercury.txt": b"hey you are no moon!\n"})
        assert compute_directory_cid(moons) == "QmbGoaQZm8kjYfCiN1aBsgwhqfUBGDYTrDb91Mz7Dvq81B"
        assert compute_directory_cid(moons / "jupiter") == "QmS5mZddhFPLWFX3w6FzAy9QxyYkaxvUpsWCtZ3r7jub9J"
        here = _write(tmp_path / "here", {"hey": b"Hey\n", "hello/world": b"World\n"})
        assert compute_directory_cid(here) == "QmZQWnfcqJ6hNkkPvrY9Q5X39GP3jUnUbAV4AbmbbR3Cb1"


def test_the_threshold_is_exclusive() -> None:
    # boxo >= 0.36 / kubo >= 0.40: exactly at the threshold stays basic, one byte over is a HAMT.
    cid = cid_bytes(0, DAG_PB, hashlib.sha256(b"x").digest())
    entries = [(b"a" * 10, cid, 1), (b"b" * 10, cid, 1)]  # 2 * (10 + 34) = 88
    assert not read_directory(*_root(entries, 88)).sharded
    assert read_directory(*_root(entries, 87)).sharded


def _root(entries: list[Entry], threshold: int) -> tuple[bytes, bytes]:
    blocks, raw_cid, _ = directory_blocks(entries, 0, threshold)
    return raw_cid, blocks[-1][1]


# --- resolving and walking, over an in-memory block map -----------------------------------------

class Blocks(dict[bytes, bytes]):
    """Blocks by binary CID, counting reads."""

    reads = 0

    def add(self, blocks: list[tuple[str, bytes]]) -> None:
        for cid, block in blocks:
            self[cid_from_str(cid)] = block

    def get_block(self, raw_cid: bytes) -> bytes:
        self.reads += 1
        return self[raw_cid]


def _file(store: Blocks, data: bytes, options: AddOptions) -> Entry:
    builder = FileDagBuilder(options)
    store.add(builder.write(data))
    last, root = builder.finish()
    store.add(last)
    return b"", cid_from_str(root), builder.root_tsize


def _tree(store: Blocks, threshold: int) -> bytes:
    """/a.txt, /sub/b{0..39}.bin, /sub/deep/c.txt: every directory a HAMT when threshold is 1."""
    opts = AddOptions()
    deep = [(b"c.txt",) + _file(store, b"see", opts)[1:]]
    blocks, deep_cid, deep_tsize = directory_blocks(deep, 0, threshold)
    store.add(blocks)
    sub = [(f"b{i}.bin".encode(),) + _file(store, bytes([i]) * (i + 1), opts)[1:] for i in range(40)]
    sub.append((b"deep", deep_cid, deep_tsize))
    blocks, sub_cid, sub_tsize = directory_blocks(sub, 0, threshold)
    store.add(blocks)
    top = [(b"a.txt",) + _file(store, b"alpha", opts)[1:], (b"sub", sub_cid, sub_tsize)]
    blocks, root, _ = directory_blocks(top, 0, threshold)
    store.add(blocks)
    return root


@pytest.mark.parametrize("threshold", [1, HAMT_SHARDING_SIZE])
def test_resolve_and_walk_through_basic_and_sharded_directories(threshold: int) -> None:
    store = Blocks()
    root = _tree(store, threshold)
    assert read_directory(root, store[root]).sharded == (threshold == 1)
    path = cid_to_str(root) + "/sub/deep/c.txt"
    raw, segments = parse_content_path(path)
    leaf = drive(resolve_steps(raw, segments), store.get_block)
    assert b"".join(walk_file(leaf, store.get_block)) == b"see"
    with pytest.raises(ContentNotFoundError, match="no entry 'nope'"):
        drive(resolve_steps(root, ["sub", "nope"]), store.get_block)
    with pytest.raises(StorageError, match="not a directory"):
        drive(resolve_steps(root, ["a.txt", "x"]), store.get_block)
    entries = _walk(store, root, 1000)
    assert [e.path for e in entries] == (["a.txt", "sub"] + sorted(f"sub/b{i}.bin" for i in range(40))
                                         + ["sub/deep", "sub/deep/c.txt"])
    sizes = {e.path: e.size for e in entries}
    assert sizes["sub/b9.bin"] == 10 and sizes["a.txt"] == 5 and sizes["sub"] == 0
    with pytest.raises(FetchLimitError, match="more entries"):
        _walk(store, root, 20)


def _walk(store: Blocks, root: bytes, max_entries: int) -> list[DirEntry]:
    steps = walk_steps(root, max_entries)
    out: list[DirEntry] = []
    sent: Any = None
    while True:
        try:
            step = steps.send(sent)
        except StopIteration:
            return out
        if isinstance(step, DirEntry):
            out.append(step)
            sent = None
        else:
            sent = store.get_block(step)


def test_content_paths_are_checked_before_any_read() -> None:
    for bad in ["QmNot/a", f"{FILE100}/../etc", f"{FILE100}/a/./b"]:
        with pytest.raises(InvalidCidError):
            parse_content_path(bad)
    assert parse_content_path(f"/ipfs/{FILE100}//a/") == (parse_content_path(FILE100)[0], ["a"])


# --- range reads ------------------------------------------------------------------------------

def test_a_range_reads_only_the_blocks_it_overlaps() -> None:
    store = Blocks()
    data = bytes(range(256)) * 800  # 204,800 bytes in 1 KiB chunks: 200 leaves under two levels
    _, root, _ = _file(store, data, AddOptions(chunk_size=1024))
    store.reads = 0
    assert b"".join(walk_file(root, store.get_block, offset=5000, length=1500)) == data[5000:6500]
    assert store.reads == 1 + 1 + 3  # the root, one internal node, the three leaves holding the range
    store.reads = 0
    assert b"".join(walk_file(root, store.get_block, offset=len(data) - 10)) == data[-10:]
    assert store.reads == 3
    assert b"".join(walk_file(root, store.get_block, offset=len(data) + 5)) == b""
    with pytest.raises(FetchLimitError, match="range"):
        list(walk_file(root, store.get_block, offset=0, length=4096, max_bytes=4095))
    assert b"".join(walk_file(root, store.get_block, offset=100, length=4096, max_bytes=4096)) == data[100:4196]
    with pytest.raises(StorageError, match="offset"):
        list(walk_file(root, store.get_block, offset=-1))


# --- hostile directory blocks -----------------------------------------------------------------

def _raw_dir(links: list[tuple[bytes, bytes, int]], data: bytes = b"\x08\x01") -> tuple[bytes, bytes]:
    parts = []
    for name, raw_cid, tsize in links:  # in the order given: a hostile block need not be sorted
        link = b"\x0a" + uvarint(len(raw_cid)) + raw_cid + b"\x12" + uvarint(len(name)) + name + b"\x18" + uvarint(tsize)
        parts.append(b"\x12" + uvarint(len(link)) + link)
    block = b"".join(parts) + b"\x0a" + uvarint(len(data)) + data
    return cid_bytes(0, DAG_PB, hashlib.sha256(block).digest()), block


CHILD = cid_bytes(0, DAG_PB, hashlib.sha256(b"child").digest())


@pytest.mark.parametrize("name", [b"..", b".", b"a/b", b"a\x00b", b"", b"x" * 256])
def test_bad_entry_names_are_refused(name: bytes) -> None:
    with pytest.raises(IntegrityError):
        read_directory(*_raw_dir([(name, CHILD, 1)]))


def test_a_name_listed_twice_is_refused() -> None:
    with pytest.raises(IntegrityError, match="twice"):
        read_directory(*_raw_dir([(b"a", CHILD, 1), (b"a", CHILD, 1)]))


def _shard_data(bitfield: bytes, hash_type: int = 0x22, fanout: int = 256) -> bytes:
    return b"\x08\x05\x12" + uvarint(len(bitfield)) + bitfield + b"\x28" + uvarint(hash_type) + b"\x30" + uvarint(fanout)


@pytest.mark.parametrize("links,data,message", [
    ([(b"05a", CHILD, 1)], _shard_data(bytes(33) + b"\x20"), "larger"),  # a 264-bit field in a 256-wide shard
    ([(b"05a", CHILD, 1)], _shard_data(b"\x01"), "bitfield does not hold"),  # slot 5 not set
    ([(b"05a", CHILD, 1), (b"06b", CHILD, 1)], _shard_data(b"\x20"), "used slots"),
    ([(b"zza", CHILD, 1)], _shard_data(b"\x20"), "slot"),
    ([(b"05a", CHILD, 1)], _shard_data(b"\x20", hash_type=0x12), "murmur3"),
    ([(b"05a", CHILD, 1)], _shard_data(b"\x20", fanout=100), "power of two"),
    ([(b"05..", CHILD, 1)], _shard_data(b"\x20"), "safe path"),
])
def test_malformed_shards_are_refused(links: list[tuple[bytes, bytes, int]], data: bytes, message: str) -> None:
    with pytest.raises(IntegrityError, match=message):
        read_directory(*_raw_dir(links, data))


def test_shards_nested_deeper_than_the_hash_are_refused() -> None:
    # Eight one-child shards on the slots of "x", then a ninth: a 64-bit hash indexes only eight levels.
    store = Blocks()
    leaf = cid_bytes(0, DAG_PB, hashlib.sha256(b"leaf").digest())
    block = encode_shard([(b"00x", leaf, 1)], 1, 256)
    cid = _raw_dir_from(block)[0]
    store[cid] = block
    for depth in range(7, -1, -1):
        slot = slot_of(b"x", depth)
        block = encode_shard([(f"{slot:02X}".encode(), cid, 1)], 1 << slot, 256)
        cid = _raw_dir_from(block)[0]
        store[cid] = block
    with pytest.raises(FetchLimitError, match="deeper"):
        drive(resolve_steps(cid, ["x"]), store.get_block)


def test_a_shard_entry_in_the_wrong_slot_is_refused_by_the_walk() -> None:
    # "dup" listed under its own slot and under a second one: a lookup finds one, a walk would list two.
    store = Blocks()
    file_cid = _file(store, b"x", AddOptions())[1]
    right = slot_of(b"dup", 0)
    wrong = (right + 1) % 256
    block = encode_shard([(f"{right:02X}dup".encode(), file_cid, 1), (f"{wrong:02X}dup".encode(), file_cid, 1)],
                         (1 << right) | (1 << wrong), 256)
    root = _raw_dir_from(block)[0]
    store[root] = block
    assert drive(resolve_steps(root, ["dup"]), store.get_block) == file_cid
    with pytest.raises(IntegrityError, match="does not hash to"):
        _walk(store, root, 100)


def test_directories_nested_too_deep_are_refused_by_the_walk() -> None:
    store = Blocks()
    cid, block = _raw_dir([])
    store[cid] = block
    for _ in range(70):
        cid, block = _raw_dir([(b"d", cid, 1)])
        store[cid] = block
    with pytest.raises(FetchLimitError, match="deep"):
        _walk(store, cid, 10_000)


def test_a_directory_bomb_is_stopped_by_the_entry_bound() -> None:
    # One block linking the same 100-entry directory 100 times: 10,000 entries from 2 blocks.
    store = Blocks()
    file_cid = _file(store, b"x", AddOptions())[1]
    inner, block = _raw_dir([(f"f{i}".encode(), file_cid, 1) for i in range(100)])
    store[inner] = block
    outer, block = _raw_dir([(f"d{i}".encode(), inner, 1) for i in range(100)])
    store[outer] = block
    with pytest.raises(FetchLimitError, match="more entries"):
        _walk(store, outer, 1000)


def test_a_file_is_not_a_directory() -> None:
    store = Blocks()
    _, raw, _ = _file(store, b"data", AddOptions())
    with pytest.raises(StorageError, match="not a directory"):
        read_directory(raw, store[raw])


def test_encoding_sorts_links_by_name_bytes() -> None:
    entries: list[Entry] = [("é".encode(), CHILD, 1), (b"Z", CHILD, 1), (b"a", CHILD, 1)]
    names = [name for name, _ in read_directory(*_raw_dir_from(encode_directory(entries))).entries]
    assert names == ["Z", "a", "é"]
    assert shard_blocks(entries, 0)[1] == shard_blocks(list(reversed(entries)), 0)[1]  # order-free


def _raw_dir_from(block: bytes) -> tuple[bytes, bytes]:
    return cid_bytes(0, DAG_PB, hashlib.sha256(block).digest()), block

