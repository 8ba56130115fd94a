"""The Kubo RPC adapter against a real js-ipfs daemon (and a fake one for corrupted replies)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx
import pytest

from aitbc_agent_sdk.devnet._service import free_port
from aitbc_agent_sdk.errors import ContentNotFoundError, IntegrityError, StorageError
from aitbc_agent_sdk.storage import (
    AddOptions,
    ContentStore,
    InvalidCidError,
    LocalContentStore,
    cid_from_str,
    cid_to_str,
    compute_cid,
    compute_file_cid,
    decode_dagpb,
    iter_blocks,
)
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore

CHUNK = 262144
SIZES = [0, 1, CHUNK, CHUNK + 1]
LAYOUTS = [  # (cid_version, raw_leaves): the two defaults and the two overrides
    (0, None), (1, None), (0, True), (1, False),
]
BIG = 175 * CHUNK  # 175 chunks: one more than a node can link, so the tree has two levels


def _same(a: str, b: str) -> bool:
    return cid_from_str(a) == cid_from_str(b)


def _options(cid_version: int, raw_leaves: bool | None, chunk_size: int = CHUNK) -> AddOptions:
    return AddOptions(cid_version=cid_version, raw_leaves=raw_leaves, chunk_size=chunk_size)  # type: ignore[arg-type]


@pytest.mark.parametrize("cid_version,raw_leaves", LAYOUTS)
@pytest.mark.parametrize("size", SIZES)
async def test_daemon_cid_equals_local_cid(kubo_client: KuboClient, size: int, cid_version: int,
                                           raw_leaves: bool | None) -> None:
    data = os.urandom(size)
    got = await kubo_client.add(data, cid_version=cid_version, raw_leaves=raw_leaves)
    assert _same(got, compute_cid(data, _options(cid_version, raw_leaves)))


@pytest.mark.parametrize("cid_version", [0, 1])
async def test_two_level_tree_with_small_chunks(kubo_client: KuboClient, cid_version: int) -> None:
    data = os.urandom(180 * 1024)  # 180 chunks of 1 KiB
    got = await kubo_client.add(data, cid_version=cid_version, chunker="size-1024")
    assert _same(got, compute_cid(data, _options(cid_version, None, 1024)))


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("big") / "big.bin"
    path.write_bytes(os.urandom(BIG + 12345))
    return path


@pytest.mark.parametrize("cid_version", [0, 1])
async def test_two_level_tree_with_default_chunks(kubo_client: KuboClient, big_file: Path,
                                                  cid_version: int) -> None:
    got = await kubo_client.add(big_file, cid_version=cid_version)  # streamed from disk
    assert _same(got, compute_file_cid(big_file, _options(cid_version, None)))


async def test_store_streams_a_big_file_verified(kubo_client: KuboClient, big_file: Path) -> None:
    store = KuboContentStore(kubo_client)
    cid = await store.add(big_file, pin=False)
    size = 0
    pieces = 0
    with open(big_file, "rb") as expected:
        async for chunk in store.stream(cid):
            assert chunk == expected.read(len(chunk))
            size += len(chunk)
            pieces += 1
    assert size == big_file.stat().st_size and pieces == 176


async def test_raw_cat_streams_in_pieces(kubo_client: KuboClient) -> None:
    data = os.urandom(3 * CHUNK + 7)
    cid = await kubo_client.add(data, pin=False)
    pieces = [piece async for piece in kubo_client.cat(cid)]
    assert b"".join(pieces) == data and len(pieces) > 1


@pytest.mark.parametrize("cid_version,raw_leaves", LAYOUTS)
async def test_store_round_trip(kubo_client: KuboClient, cid_version: int, raw_leaves: bool | None) -> None:
    store = KuboContentStore(kubo_client)
    data = os.urandom(5 * 1024 + 3)
    options = _options(cid_version, raw_leaves, 1024)
    cid = await store.add(data, options=options)
    assert cid == compute_cid(data, options)  # canonical string, whatever base the daemon printed
    assert await store.cat(cid) == data


async def test_local_store_and_daemon_agree_both_ways(kubo_client: KuboClient, tmp_path: Path) -> None:
    local = LocalContentStore(tmp_path / "store")
    remote = KuboContentStore(kubo_client)
    options = AddOptions(chunk_size=1024)
    data = os.urandom(200 * 1024)  # two levels with 1 KiB chunks

    # local -> daemon: push the local store's own blocks, then read them back from the daemon
    cid = await local.add(data, options=options)
    pushed = await remote.put_blocks(_local_blocks(local, cid))
    assert pushed == 200 + 2 + 1  # leaves, two internal nodes, the root
    assert await remote.cat(cid) == data
    assert b"".join([p async for p in kubo_client.cat(cid)]) == data
    assert await remote.add(data, options=options, only_hash=True) == cid

    # daemon -> local: the daemon's CID for other bytes names the same content locally
    other = os.urandom(3000)
    cid_d = await remote.add(other, options=_options(1, None))
    assert await local.add(other, options=_options(1, None)) == cid_d
    assert await local.cat(cid_d) == other


def _local_blocks(store: LocalContentStore, cid: str) -> list[tuple[str, bytes]]:
    """Every block of a stored DAG, read (and verified) from the local store."""
    out: list[tuple[str, bytes]] = []
    todo = [cid_from_str(cid)]
    while todo:
        raw = todo.pop()
        block = store._get_block(raw)  # the store's verified block read
        out.append((cid_to_str(raw), block))
        if raw[:1] != b"\x01" or raw[1] == 0x70:  # dag-pb: follow the links
            todo += [link.cid for link in decode_dagpb(block).links]
    return out


async def test_pin_add_rm_ls(kubo_client: KuboClient) -> None:
    store = KuboContentStore(kubo_client)
    cid = await store.add(os.urandom(100), pin=False)
    assert cid not in await store.pins()
    await store.pin(cid)
    assert cid in await kubo_client.pin_ls()
    await store.unpin(cid)
    assert cid not in await store.pins()
    await store.unpin(cid)  # like the local store: a no-op
    with pytest.raises(StorageError, match="not pinned"):
        await kubo_client.pin_rm(cid)


async def test_pins_are_listed_canonically(kubo_client: KuboClient) -> None:
    cid = await KuboContentStore(kubo_client).add(os.urandom(50), options=_options(1, None))
    assert cid.startswith("bafk") and cid in await kubo_client.pin_ls()


async def test_unknown_cid_is_not_found(ipfs_daemon: str) -> None:
    missing = compute_cid(os.urandom(64))  # never added anywhere
    # An offline daemon would look forever; find_timeout makes it give up and say so.
    async with KuboClient(ipfs_daemon, find_timeout=0.5) as client:
        with pytest.raises(ContentNotFoundError, match=f"{missing}: content not found"):
            await KuboContentStore(client).cat(missing)
        with pytest.raises(ContentNotFoundError):
            async for _ in client.cat(missing):
                pass


async def test_bad_cid_fails_before_any_request(kubo_client: KuboClient) -> None:
    with pytest.raises(InvalidCidError):
        await KuboContentStore(kubo_client).cat("not-a-cid")


async def test_health(kubo_client: KuboClient) -> None:
    assert (await kubo_client.id())["ID"]
    assert (await kubo_client.version())["Version"]


async def test_dead_daemon_is_a_storage_error() -> None:
    url = f"http://127.0.0.1:{free_port()}"
    async with KuboClient(url, timeout=5.0) as client:
        with pytest.raises(StorageError, match=f"{url}.*not reachable"):
            await client.id()
        with pytest.raises(StorageError, match="not reachable"):
            await KuboContentStore(client).add(b"x")


async def test_closed_client_is_refused(ipfs_daemon: str) -> None:
    client = KuboClient(ipfs_daemon)
    async with client:
        pass
    with pytest.raises(StorageError, match="closed"):
        await client.id()
    with pytest.raises(StorageError, match="closed"):
        async with client:
            pass


# --- a daemon that lies (a real one will not, so this one is faked) --------------------------

def _fake_daemon(blocks: dict[str, bytes], add_reply: str | None = None) -> httpx.MockTransport:
    def handle(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/api/v0/block/get":
            raw = cid_from_str(request.url.params["arg"])
            for cid, block in blocks.items():
                if cid_from_str(cid) == raw:
                    return httpx.Response(200, content=block)
            return httpx.Response(500, json={"Message": "request timed out", "Code": 0, "Type": "error"})
        if request.url.path == "/api/v0/add" and add_reply is not None:
            return httpx.Response(200, content=json.dumps({"Name": "data", "Hash": add_reply, "Size": 1}) + "\n")
        return httpx.Response(404, json={"Message": "unknown endpoint", "Code": 0, "Type": "error"})
    return httpx.MockTransport(handle)


@pytest.mark.parametrize("victim", ["leaf", "root"])
async def test_tampered_block_is_detected(victim: str) -> None:
    data = os.urandom(10 * 1024)
    options = AddOptions(chunk_size=1024)
    blocks = dict(iter_blocks(data, options))
    root = compute_cid(data, options)
    target = root if victim == "root" else list(blocks)[3]
    blocks[target] = blocks[target][:-1] + bytes([blocks[target][-1] ^ 1])
    async with KuboClient("http://fake", transport=_fake_daemon(blocks)) as client:
        store = KuboContentStore(client, prefetch=1)
        received = b""
        with pytest.raises(IntegrityError, match=target):
            async for chunk in store.stream(root):
                received += chunk
    assert received == data[:len(received)]  # only verified bytes came out, in order
    assert len(received) == (0 if victim == "root" else 3 * 1024)


async def test_honest_fake_daemon_streams() -> None:
    data = os.urandom(10 * 1024)
    options = AddOptions(chunk_size=1024)
    async with KuboClient("http://fake", transport=_fake_daemon(dict(iter_blocks(data, options)))) as client:
        store = KuboContentStore(client)
        assert isinstance(store, ContentStore)
        assert await store.cat(compute_cid(data, options)) == data


async def test_wrong_cid_from_add_is_detected() -> None:
    liar = compute_cid(b"something else")
    async with KuboClient("http://fake", transport=_fake_daemon({}, add_reply=liar)) as client:
        with pytest.raises(IntegrityError, match=liar):
            await KuboContentStore(client).add(b"the real content")


async def test_a_big_add_gets_time_for_the_daemon_to_store_it_before_it_answers(tmp_path) -> None:
    # The daemon answers an add once the whole file is stored: a 1 GB boundary state took js-ipfs over a
    # minute beside another upload, past the 60 s read timeout, and a spot check's opening was lost.
    seen: dict[int, dict] = {}

    def handle(request: httpx.Request) -> httpx.Response:  # records the timeouts httpx would enforce
        body = request.read()
        seen[len(body)] = request.extensions["timeout"]
        cid = compute_cid(body[body.index(b"\r\n\r\n") + 4:body.rindex(b"\r\n--")], AddOptions())
        return httpx.Response(200, content=json.dumps({"Name": "f", "Hash": cid, "Size": 1}) + "\n")

    big = tmp_path / "big"
    big.write_bytes(os.urandom(16 << 20))
    async with KuboClient("http://fake", timeout=60.0, transport=httpx.MockTransport(handle)) as client:
        await client.add(b"small")
        await client.add(big)
    small, large = (seen[k] for k in sorted(seen))
    assert small["read"] == pytest.approx(60.0, abs=0.01)
    assert large["read"] >= 60.0 + 3.9  # 16 MB at no less than 4 MB/s
