"""LocalContentStore: round trips, verified reads, pins, only-hash, on-disk layout."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import ContentNotFoundError, IntegrityError, StorageError
from aitbc_agent_sdk.storage import (
    AddOptions,
    ContentStore,
    InvalidCidError,
    LocalContentStore,
    compute_cid,
    compute_file_cid,
    parse_cid,
)

SMALL = AddOptions(chunk_size=1024)
HELLO_CID = "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o"


@pytest.fixture
def store(tmp_path: Path) -> LocalContentStore:
    return LocalContentStore(tmp_path / "store")


def block_files(store: LocalContentStore) -> list[Path]:
    return sorted(p for p in (store.root / "blocks").rglob("*") if p.is_file())


async def collect(store: LocalContentStore, cid: str) -> list[bytes]:
    return [chunk async for chunk in store.stream(cid)]


def test_implements_the_port(store: LocalContentStore) -> None:
    assert isinstance(store, ContentStore)


async def test_add_gives_kubo_cid_and_cat_round_trips(store: LocalContentStore) -> None:
    assert await store.add(b"hello world\n") == HELLO_CID
    assert await store.cat(HELLO_CID) == b"hello world\n"
    assert await store.has(HELLO_CID)


@pytest.mark.parametrize("options", [SMALL, AddOptions(cid_version=1, chunk_size=1024),
                                     AddOptions(raw_leaves=True, chunk_size=1024)])
@pytest.mark.parametrize("size", [0, 1, 1024, 1025, 174 * 1024, 175 * 1024 + 7])
async def test_round_trips(store: LocalContentStore, options: AddOptions, size: int) -> None:
    data = os.urandom(size)
    cid = await store.add(data, options=options)
    assert cid == compute_cid(data, options)
    assert await store.cat(cid) == data
    assert b"".join(await collect(store, cid)) == data


async def test_add_path_streams_the_file(store: LocalContentStore, tmp_path: Path) -> None:
    data = os.urandom(300 * 1024 + 5)
    path = tmp_path / "input.bin"
    path.write_bytes(data)
    cid = await store.add(path, options=SMALL)
    assert cid == compute_cid(data, SMALL) == compute_file_cid(path, SMALL)
    assert await store.cat(cid) == data
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert await store.add(empty) == "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"


async def test_blocks_are_stored_under_their_own_hash(store: LocalContentStore) -> None:
    await store.add(os.urandom(5000), options=SMALL)
    files = block_files(store)
    assert len(files) == 5 + 1  # 5 leaves + the root
    for path in files:
        assert path.parent.name == path.name[-3:-1]  # sharded by next-to-last two chars
    assert not list(store.root.rglob("*.tmp"))  # atomic writes leave no temp files


async def test_stream_yields_in_order_and_batches_thread_hops(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = LocalContentStore(tmp_path / "s", read_batch_bytes=10 * 1024)
    data = os.urandom(40 * 1024)
    cid = await store.add(data, options=SMALL)
    hops = 0
    real = asyncio.to_thread

    async def counting(fn, /, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal hops
        hops += 1
        return await real(fn, *args, **kwargs)

    monkeypatch.setattr(asyncio, "to_thread", counting)
    chunks = await collect(store, cid)
    assert chunks == [data[i:i + 1024] for i in range(0, len(data), 1024)]
    assert hops == 5  # 4 batches of 10 KiB + the empty one that ends the stream


async def test_only_hash_stores_nothing(store: LocalContentStore, tmp_path: Path) -> None:
    data = os.urandom(3000)
    cid = await store.add(data, options=SMALL, only_hash=True)
    assert cid == compute_cid(data, SMALL)
    assert not await store.has(cid)
    assert block_files(store) == [] and await store.pins() == []
    path = tmp_path / "f"
    path.write_bytes(data)
    assert await store.add(path, options=SMALL, only_hash=True) == cid


async def test_pins(store: LocalContentStore) -> None:
    pinned = await store.add(b"pinned")
    loose = await store.add(b"loose", pin=False)
    v1 = await store.add(b"v1", options=AddOptions(cid_version=1))
    assert await store.pins() == sorted([pinned, v1])
    await store.pin(loose)
    await store.pin(loose)  # idempotent
    assert await store.pins() == sorted([pinned, loose, v1])
    await store.unpin(pinned)
    await store.unpin(pinned)  # idempotent
    assert await store.pins() == sorted([loose, v1])
    assert await store.cat(pinned) == b"pinned"  # unpinning does not delete


async def test_pin_of_unknown_content_fails(store: LocalContentStore) -> None:
    with pytest.raises(ContentNotFoundError):
        await store.pin(compute_cid(b"never added"))


async def test_missing_content(store: LocalContentStore) -> None:
    cid = compute_cid(b"never added")
    assert not await store.has(cid)
    with pytest.raises(ContentNotFoundError):
        await store.cat(cid)
    with pytest.raises(ContentNotFoundError):
        await collect(store, cid)


async def test_missing_child_block(store: LocalContentStore) -> None:
    data = os.urandom(3 * 1024)
    cid = await store.add(data, options=SMALL)
    leaf = next(p for p in block_files(store) if p.stat().st_size > 1024 and p.read_bytes().find(data[2048:2100]) >= 0)
    leaf.unlink()
    with pytest.raises(ContentNotFoundError):
        await store.cat(cid)
    got: list[bytes] = []
    with pytest.raises(ContentNotFoundError):
        async for chunk in store.stream(cid):
            got.append(chunk)
    assert got == [data[:1024], data[1024:2048]]


def flip_byte_in_block_holding(store: LocalContentStore, needle: bytes) -> None:
    for path in block_files(store):
        block = bytearray(path.read_bytes())
        at = block.find(needle)
        if at >= 0:
            block[at] ^= 0x01
            path.write_bytes(bytes(block))
            return
    raise AssertionError("needle not found in any block")


@pytest.mark.parametrize("options", [SMALL, AddOptions(cid_version=1, chunk_size=1024)])
async def test_corruption_is_detected_before_yielding(store: LocalContentStore, options: AddOptions) -> None:
    data = os.urandom(3 * 1024)
    cid = await store.add(data, options=options)
    flip_byte_in_block_holding(store, data[2500:2540])  # the last leaf
    with pytest.raises(IntegrityError):
        await store.cat(cid)
    got: list[bytes] = []
    with pytest.raises(IntegrityError):
        async for chunk in store.stream(cid):
            got.append(chunk)
    assert got == [data[:1024], data[1024:2048]]  # the bad block never came out


async def test_corrupt_root_block(store: LocalContentStore) -> None:
    await store.add(b"hello world\n")
    flip_byte_in_block_holding(store, b"hello")
    with pytest.raises(IntegrityError):
        await store.cat(HELLO_CID)


async def test_add_again_after_corruption_does_not_heal_silently(store: LocalContentStore) -> None:
    # Existing block files are trusted on add (content addressing); reads still catch rot.
    await store.add(b"hello world\n")
    flip_byte_in_block_holding(store, b"hello")
    assert await store.add(b"hello world\n") == HELLO_CID
    with pytest.raises(IntegrityError):
        await store.cat(HELLO_CID)


async def test_invalid_cid_is_a_storage_error(store: LocalContentStore) -> None:
    for call in (store.cat("not-a-cid"), store.has("Qm123"), store.pin("bogus")):
        with pytest.raises(InvalidCidError) as info:
            await call
        assert isinstance(info.value, StorageError)


async def test_dedup_and_shared_blocks(store: LocalContentStore) -> None:
    data = bytes(4096)  # four identical 1 KiB leaves -> one leaf block
    cid = await store.add(data, options=SMALL)
    assert len(block_files(store)) == 2
    assert await store.add(data, options=SMALL) == cid
    assert await store.cat(cid) == data


async def test_root_digest_matches_the_root_file(store: LocalContentStore) -> None:
    cid = await store.add(os.urandom(2048), options=SMALL)
    digest = parse_cid(cid)[2]
    assert any(hashlib.sha256(p.read_bytes()).digest() == digest for p in block_files(store))
