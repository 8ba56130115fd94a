"""Whole-file reads as one verified CAR stream (storage.car + the kubo adapter), and pack imports.

The crafted-input tests build hostile CARs by hand and feed them to the pure reader; the
daemon tests use the session's real js-ipfs daemon (tests/plugins/ipfs.py).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import aitbc_agent_sdk.storage._local as local_module
from aitbc_agent_sdk.errors import ContentNotFoundError, FetchLimitError, IntegrityError
from aitbc_agent_sdk.storage import AddOptions, LocalContentStore, cid_from_str, compute_cid, decode_dagpb, iter_blocks
from aitbc_agent_sdk.storage._bounds import DagBudget
from aitbc_agent_sdk.storage._car import CarFileReader, IncompleteCarError, read_car_header
from aitbc_agent_sdk.storage._cid import uvarint
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.storage._packs import read_index

SMALL = AddOptions(chunk_size=1024)
LAYOUTS = [AddOptions(chunk_size=1024), AddOptions(cid_version=1, chunk_size=1024),
           AddOptions(raw_leaves=True, chunk_size=1024)]


# --- building CARs the way dag/export does ------------------------------------------------------

def header(*roots: bytes) -> bytes:
    """dag-cbor {roots: [CID...], version: 1}, length-prefixed."""
    body = b"\xa2\x65roots" + bytes([0x80 + len(roots)])
    for root in roots:
        link = b"\x00" + root
        body += b"\xd8\x2a\x58" + bytes([len(link)]) + link
    body += b"\x67version\x01"
    return uvarint(len(body)) + body


def section(cid: bytes, block: bytes) -> bytes:
    return uvarint(len(cid) + len(block)) + cid + block


def dfs_sections(data: bytes, options: AddOptions = SMALL) -> tuple[bytes, list[tuple[bytes, bytes]]]:
    """(root, blocks in dag/export order: depth first, links in order, each CID once)."""
    blocks = {cid_from_str(cid): block for cid, block in iter_blocks(data, options)}
    root = cid_from_str(compute_cid(data, options))
    out, seen, todo = [], set(), [root]
    while todo:
        cid = todo.pop()
        if cid in seen:
            continue
        seen.add(cid)
        out.append((cid, blocks[cid]))
        if cid[:1] != b"\x01" or cid[1] == 0x70:  # dag-pb: follow links
            todo += reversed([link.cid for link in decode_dagpb(blocks[cid]).links])
    return root, out


def car(root: bytes, sections: list[tuple[bytes, bytes]]) -> bytes:
    return header(root) + b"".join(section(c, b) for c, b in sections)


def read(root: bytes, stream: bytes, *, max_bytes: int | None = None, piece: int = 700,
         held_bytes: int = 1 << 26) -> bytes:
    """Feed ``stream`` in pieces, serving blocks the reader wants from the stream's own sections."""
    reader = CarFileReader(root, DagBudget(root, max_bytes, None), held_bytes=held_bytes)
    out = []
    for at in range(0, len(stream), piece):
        got = reader.feed(stream[at:at + piece])
        while True:
            out += got
            if reader.wants is None:
                break
            got = reader.supply(reader.wants, BLOCKS[reader.wants])
    reader.finish()
    return b"".join(out)


BLOCKS: dict[bytes, bytes] = {}  # what the "block/get" of read() serves


@pytest.fixture(autouse=True)
def _blocks() -> None:
    BLOCKS.clear()


# --- the pure reader: honest streams --------------------------------------------------------------

@pytest.mark.parametrize("options", LAYOUTS)
@pytest.mark.parametrize("size", [0, 1, 1024, 5 * 1024 + 3, 180 * 1024 + 7])
def test_a_good_car_verifies_and_equals_the_bytes(options: AddOptions, size: int) -> None:
    data = os.urandom(size)
    root, sections = dfs_sections(data, options)
    for piece in (1, 700, 1 << 20):  # split anywhere, even inside varints
        assert read(root, car(root, sections), piece=piece) == data


def test_repeated_blocks_sent_once_are_replayed_from_what_is_held() -> None:
    data = bytes(200 * 1024)  # every leaf the same, and both internal nodes but one the same
    root, sections = dfs_sections(data)
    assert len(sections) < 5  # the exporter sent each CID once
    assert read(root, car(root, sections)) == data


def test_a_repeat_that_is_not_held_is_asked_for() -> None:
    data = bytes(200 * 1024)
    root, sections = dfs_sections(data)
    BLOCKS.update(sections)
    assert read(root, car(root, sections), held_bytes=0) == data


# --- the pure reader: crafted hostile streams -------------------------------------------------------

def test_crafted_a_flipped_byte_in_a_block_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    cid, block = sections[3]
    sections[3] = (cid, block[:100] + bytes([block[100] ^ 1]) + block[101:])
    with pytest.raises(IntegrityError, match="does not match its hash"):
        read(root, car(root, sections))


def test_crafted_an_extra_block_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    other = dfs_sections(b"other")[1]
    with pytest.raises(IntegrityError, match="after the whole file"):
        read(root, car(root, sections + other))
    # ... also when it is a block of the file sent twice
    with pytest.raises(IntegrityError, match="after the whole file"):
        read(root, car(root, sections + sections[-1:]))


def test_crafted_a_block_out_of_dfs_order_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    sections[2], sections[3] = sections[3], sections[2]  # two leaves swapped
    with pytest.raises(IntegrityError, match="where the walk needs"):
        read(root, car(root, sections))


def test_crafted_a_block_no_parent_links_to_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    stranger = dfs_sections(b"x" * 1024)[1][0]  # hashes fine, but nothing verified links to it
    sections.insert(2, stranger)
    with pytest.raises(IntegrityError, match="where the walk needs"):
        read(root, car(root, sections))


def test_crafted_a_missing_block_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    with pytest.raises(IntegrityError, match="where the walk needs"):
        read(root, car(root, sections[:2] + sections[3:]))  # a leaf in the middle
    with pytest.raises(IncompleteCarError, match="ended before block"):
        read(root, car(root, sections[:-1]))  # the last leaf: the stream just stops


def test_crafted_a_stream_cut_inside_a_section_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    with pytest.raises(IncompleteCarError, match="inside a section"):
        read(root, car(root, sections)[:-10])


def test_crafted_oversize_varints_and_sections_are_refused_before_buffering() -> None:
    root, sections = dfs_sections(os.urandom(5 * 1024))
    start = header(root) + section(*sections[0])
    reader = CarFileReader(root, DagBudget(root, None, None))
    reader.feed(start)
    with pytest.raises(FetchLimitError, match="varint"):
        reader.feed(b"\x80" * 12)  # a length that never ends
    reader = CarFileReader(root, DagBudget(root, None, None))
    reader.feed(header(root))
    with pytest.raises(FetchLimitError, match="section of"):
        reader.feed(uvarint(3 << 20))  # 3 MiB: over the block cap; only the varint was sent
    with pytest.raises(FetchLimitError, match="header of"):
        CarFileReader(root, DagBudget(root, None, None)).feed(uvarint(1 << 20))


def test_crafted_a_total_above_the_callers_bound_is_refused() -> None:
    data = os.urandom(5 * 1024)
    root, sections = dfs_sections(data)
    with pytest.raises(FetchLimitError, match="declares"):  # the root's size against max_bytes
        read(root, car(root, sections), max_bytes=len(data) - 1)
    # A section that fits the block cap but not what a 5 KiB file may take: refused at its length.
    reader = CarFileReader(root, DagBudget(root, len(data), None))
    reader.feed(header(root) + section(*sections[0]))
    with pytest.raises(FetchLimitError, match="over its limit"):
        reader.feed(uvarint(2 << 20))


def test_crafted_a_header_for_another_root_or_version_is_refused() -> None:
    data = os.urandom(3000)
    root, sections = dfs_sections(data)
    other = cid_from_str(compute_cid(b"other"))
    with pytest.raises(IntegrityError, match="roots"):
        read(root, header(other) + b"".join(section(c, b) for c, b in sections))
    assert read_car_header(header(root)[1:]) == [root]
    with pytest.raises(IntegrityError, match="version"):
        read_car_header(header(root)[1:-1] + b"\x02")


# --- the kubo adapter against the real daemon ---------------------------------------------------------

@pytest.mark.parametrize("options", [*LAYOUTS, AddOptions(), AddOptions(cid_version=1)])
async def test_daemon_cat_comes_from_one_verified_car(kubo_client: KuboClient, options: AddOptions,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    store = KuboContentStore(kubo_client)
    data = os.urandom(300 * 1024 + 9)
    cid = await store.add(data, options=options, pin=False)

    async def no_block_get(*args: object, **kwargs: object) -> bytes:
        raise AssertionError("a whole-file read went block by block")
    monkeypatch.setattr(kubo_client, "block_get", no_block_get)
    assert await store.cat(cid, max_bytes=len(data)) == data
    assert b"".join([c async for c in store.stream(cid)]) == data
    with pytest.raises(FetchLimitError, match="declares"):
        await store.cat(cid, max_bytes=len(data) - 1)


async def test_daemon_car_with_repeated_blocks(kubo_client: KuboClient) -> None:
    store = KuboContentStore(kubo_client)
    data = bytes(3 << 20) + b"tail"  # the exporter sends the zero leaf and zero subtree once
    cid = await store.add(data, pin=False)
    assert await store.cat(cid, max_bytes=len(data)) == data


async def test_daemon_ranges_still_read_block_by_block(kubo_client: KuboClient) -> None:
    store = KuboContentStore(kubo_client)
    data = os.urandom(40 * 1024)
    cid = await store.add(data, options=SMALL, pin=False)
    assert await store.cat(cid, offset=5000, length=7000) == data[5000:12000]


# --- the local store: packs ------------------------------------------------------------------------

@pytest.mark.parametrize("options", [AddOptions(), AddOptions(cid_version=1), SMALL])
async def test_packed_import_gives_the_daemons_cids(kubo_client: KuboClient, tmp_path: Path,
                                                    options: AddOptions) -> None:
    store = LocalContentStore(tmp_path / "store", pack_min_bytes=0)
    data = os.urandom(700 * 1024 + 3)
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    daemon = await kubo_client.add(data, cid_version=options.cid_version, raw_leaves=options.use_raw_leaves,
                                   chunker=f"size-{options.chunk_size}", pin=False, only_hash=True)
    for source in (data, path):
        cid = await store.add(source, options=options)
        assert cid_from_str(cid) == cid_from_str(daemon)
        assert await store.cat(cid) == data
    assert list((store.root / "packs").glob("*.idx")) and not (store.root / "blocks").exists()
    assert await LocalContentStore(tmp_path / "store").cat(cid) == data  # another store finds the pack


async def test_an_interrupted_packed_import_leaves_nothing_readable(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    data = os.urandom(2 << 20)
    path = tmp_path / "model.bin"
    path.write_bytes(data)
    real = local_module.read_chunks

    def failing(source: Path, chunk_size: int):  # type: ignore[no-untyped-def]
        for n, chunk in enumerate(real(source, chunk_size)):
            if n == 5:
                raise OSError("disk went away")
            yield chunk
    monkeypatch.setattr(local_module, "read_chunks", failing)
    store = LocalContentStore(tmp_path / "store", pack_min_bytes=0)
    with pytest.raises(Exception, match="disk went away"):
        await store.add(path)
    leftovers = list((tmp_path / "store").rglob("*"))
    assert [p for p in leftovers if p.is_file()] == []  # no pack, no index, no temp file
    first_leaf = next(iter(iter_blocks(data)))[0]
    for reader in (store, LocalContentStore(tmp_path / "store")):
        assert not await reader.has(first_leaf)  # written before the failure, never published
        with pytest.raises(ContentNotFoundError):
            await reader.cat(compute_cid(data))


async def test_a_torn_index_is_ignored_whole(tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path / "store", pack_min_bytes=0)
    data = os.urandom(600 * 1024)
    cid = await store.add(data)
    index = next((tmp_path / "store" / "packs").glob("*.idx"))
    assert read_index(index)
    index.write_bytes(index.read_bytes()[:-40])  # as if cut off mid-write
    assert read_index(index) is None
    with pytest.raises(ContentNotFoundError):
        await LocalContentStore(tmp_path / "store").cat(cid)


async def test_stores_in_the_old_layout_still_read_and_mix(tmp_path: Path) -> None:
    old = LocalContentStore(tmp_path / "store", pack_min_bytes=1 << 60)  # one file per block
    small = os.urandom(20 * 1024)
    old_cid = await old.add(small)
    assert list((tmp_path / "store" / "blocks").rglob("*"))
    new = LocalContentStore(tmp_path / "store")
    big = os.urandom(9 << 20)  # over the default pack threshold
    big_cid = await new.add(big)
    assert await new.cat(old_cid) == small and await new.cat(big_cid, max_bytes=None) == big
    assert sorted(await new.pins()) == sorted([old_cid, big_cid])
