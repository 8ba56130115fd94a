"""UnixFS DAG building and CIDs, checked against kubo vectors and hand-assembled blocks."""

from __future__ import annotations

import base64
import hashlib
import os
import random

import base58
import pytest

from aitbc_agent_sdk.errors import IntegrityError, StorageError
from aitbc_agent_sdk.storage import (
    DAG_PB,
    MAX_LINKS,
    RAW,
    AddOptions,
    FileDagBuilder,
    InvalidCidError,
    cid_for_block,
    cid_from_str,
    cid_to_str,
    compute_cid,
    decode_dagpb,
    decode_unixfs,
    iter_blocks,
    parse_cid,
    walk_file,
)
from aitbc_agent_sdk.storage._unixfs import read_uvarint, uvarint

V1 = AddOptions(cid_version=1)
LOREM = (
    b"Lorem ipsum dolor sit amet, sit enim montes aliquam. Cras non lorem, "
    b"rhoncus condimentum, irure et ante. Pulvinar suscipit odio ante, et tellus a enim, "
    b"wisi ipsum, vel rhoncus eget faucibus varius, luctus turpis nibh vel odio nulla pede."
)


def sha(data: bytes) -> bytes:
    return hashlib.sha256(data).digest()


def v0(block: bytes) -> str:
    return base58.b58encode(b"\x12\x20" + sha(block)).decode()


def v1(block: bytes, codec: int) -> str:
    raw = bytes([1, codec, 0x12, 0x20]) + sha(block)
    return "b" + base64.b32encode(raw).decode().lower().rstrip("=")


# --- known vectors -----------------------------------------------------------------

@pytest.mark.parametrize(
    ("data", "options", "expected"),
    [
        # from the task brief (kubo `ipfs add`)
        (b"", AddOptions(), "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"),
        (b"hello world\n", AddOptions(), "QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o"),
        (b"", V1, "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"),
        # `echo hello | ipfs add --cid-version 1`: a single raw leaf
        (b"hello\n", V1, "bafkreicysg23kiwv34eg2d7qweipxwosdo2py4ldv42nbauguluen5v6am"),
        # vectors precomputed with `ipfs add --only-hash --cid-version=0 --chunker=size-262144`
        # (found in a public nushell cid-v0 test suite)
        (b"\x00", AddOptions(), "QmS9JArPwa55ePgDnyg6TzX24mYTS1b1vLqWNebyVotKxQ"),
        (b"\xff", AddOptions(), "QmarNgpyJHwcrLfjPzFsLiPmLukU3uYqqofHoYHbnUfErn"),
        (b"hello world", AddOptions(), "Qmf412jQZiuVUtdgnB36FXFX7xg5V6KEbSJ4dpQuhkLyfD"),
        (bytes(262144), AddOptions(), "QmRk1rduJvo5DfEYAaLobS2za9tDszk35hzaNSDCJ74DA7"),
        # rust-ipfs unixfs adder tests (cross-checked there against go-ipfs)
        (b"foobar\n", AddOptions(), "QmRgutAxd8t7oGkSm4wmeuByG6M51wcTso6cubDdQtuEfL"),
        (b"foobar\n", AddOptions(chunk_size=2), "QmRJHYTNvC3hmd9gJQARxLR1QMEincccBV53bBw524yyq6"),
        # "go-ipfs 0.5 result": 237 one-byte leaves -> root over (174-link node, 63-link node)
        (LOREM, AddOptions(chunk_size=1), "QmRQ6NZNUs4JrCT2y7tmCC1wUhjqYuTssB8VXbbN3rMffg"),
        (LOREM, AddOptions(chunk_size=32), "QmYSLcVQqxKygiq7x9w1XGYxU29EShB8ZemiaQ8GAAw17h"),
        # 174 full 2-byte chunks + 1 byte: the lone last leaf is wrapped in its own node
        (bytes(349), AddOptions(chunk_size=2), "QmcHNWF1d56uCDSfJPA7t9fadZRV9we5HGSTGSmwuqmMP9"),
    ],
)
def test_known_vectors(data: bytes, options: AddOptions, expected: str) -> None:
    assert compute_cid(data, options) == expected
    assert list(iter_blocks(data, options))[-1][0] == expected


def test_rust_ipfs_block_order_vector() -> None:
    # rust-ipfs: "fo", "ob", "ar", "\n", then the root, in emission order
    assert [cid for cid, _ in iter_blocks(b"foobar\n", AddOptions(chunk_size=2))] == [
        "QmfVyMoStzTvdnUR7Uotzh82gmL427q9z3xW5Y8fUoszi4",
        "QmdPyW4CWE3QBkgjWfjM5f7Tjb3HukxVuBXZtkqAGwsMnm",
        "QmNhDQpphvMWhdCzP74taRzXDaEfPGq8vWfFRzD7mEgePM",
        "Qmc5m94Gu7z62RC8waSKkZUrCCBJPyHbkpmGzEePxy2oXJ",
        "QmRJHYTNvC3hmd9gJQARxLR1QMEincccBV53bBw524yyq6",
    ]


# --- hand-assembled blocks ------------------------------------------------------------

def test_empty_file_block_bytes() -> None:
    [(cid, block)] = list(iter_blocks(b""))
    assert block == bytes.fromhex("0a 04 08 02 18 00")  # no UnixFS Data field
    assert cid == v0(block)
    [(cid1, block1)] = list(iter_blocks(b"", V1))
    assert block1 == b"" and cid1 == v1(b"", RAW)


def test_single_leaf_bytes() -> None:
    [(cid, block)] = list(iter_blocks(b"hello world\n"))
    assert block == b"\x0a\x12\x08\x02\x12\x0chello world\n\x18\x0c"
    assert cid == v0(block)


def test_two_chunk_root_bytes_v0() -> None:
    leaf1 = b"\x0a\x09\x08\x02\x12\x03abc\x18\x03"
    leaf2 = b"\x0a\x07\x08\x02\x12\x01d\x18\x01"

    def link(block: bytes, tsize: int) -> bytes:  # Hash, Name="" (present), Tsize
        body = b"\x0a\x22\x12\x20" + sha(block) + b"\x12\x00\x18" + bytes([tsize])
        return b"\x12" + bytes([len(body)]) + body

    unixfs = b"\x08\x02\x18\x04\x20\x03\x20\x01"  # File, filesize 4, blocksizes [3, 1]
    root = link(leaf1, 11) + link(leaf2, 9) + b"\x0a" + bytes([len(unixfs)]) + unixfs
    blocks = list(iter_blocks(b"abcd", AddOptions(chunk_size=3)))
    assert [b for _, b in blocks] == [leaf1, leaf2, root]
    assert [c for c, _ in blocks] == [v0(leaf1), v0(leaf2), v0(root)]


def test_two_chunk_root_bytes_v1_raw_leaves() -> None:
    def link(data: bytes) -> bytes:
        body = b"\x0a\x24\x01\x55\x12\x20" + sha(data) + b"\x12\x00\x18" + bytes([len(data)])
        return b"\x12" + bytes([len(body)]) + body

    unixfs = b"\x08\x02\x18\x04\x20\x03\x20\x01"
    root = link(b"abc") + link(b"d") + b"\x0a\x08" + unixfs
    blocks = list(iter_blocks(b"abcd", AddOptions(cid_version=1, chunk_size=3)))
    assert blocks == [(v1(b"abc", RAW), b"abc"), (v1(b"d", RAW), b"d"), (v1(root, DAG_PB), root)]
    assert blocks[-1][0].startswith("bafybei")


def test_v1_without_raw_leaves_wraps_leaves_in_dag_pb() -> None:
    cid = compute_cid(b"hello world\n", AddOptions(cid_version=1, raw_leaves=False))
    assert cid.startswith("bafybei")
    assert parse_cid(cid) == (1, DAG_PB, parse_cid("QmT78zSuBmuS4z925WZfrqQ1qHaJ56DQaTfyMUF7F8ff5o")[2])


def test_v0_with_raw_leaves_follows_kubo() -> None:
    # kubo: raw leaves are CIDv1 (V0Builder.WithCodec(raw)); parents stay CIDv0
    opts = AddOptions(cid_version=0, raw_leaves=True, chunk_size=3)
    assert compute_cid(b"ab", opts) == v1(b"ab", RAW)
    blocks = list(iter_blocks(b"abcd", opts))
    assert blocks[0][0] == v1(b"abc", RAW)
    assert blocks[-1][0].startswith("Qm")
    assert decode_dagpb(blocks[-1][1]).links[0].cid == cid_from_str(v1(b"abc", RAW))


# --- structure at the edge sizes -------------------------------------------------------

def check_dag(data: bytes, options: AddOptions) -> tuple[str, list[int], dict[str, bytes]]:
    """Validate every invariant kubo's balanced layout has; return (root, leaf depths, blocks)."""
    blocks = dict(iter_blocks(data, options))
    root = compute_cid(data, options)
    assert root in blocks
    depths: list[int] = []

    def visit(cid: str, depth: int) -> tuple[int, int]:  # (tsize, filesize)
        block = blocks[cid]
        version, codec, digest = parse_cid(cid)
        assert sha(block) == digest
        assert codec == RAW or version == options.cid_version
        if codec == RAW:
            depths.append(depth)
            return len(block), len(block)
        node = decode_dagpb(block)
        unixfs = decode_unixfs(node.data or b"")
        assert unixfs.type == 2
        if not node.links:
            depths.append(depth)
            assert unixfs.filesize == len(unixfs.data or b"")
            return len(block), unixfs.filesize
        assert len(node.links) <= MAX_LINKS and unixfs.data is None
        sizes = [visit(cid_to_str(link.cid), depth + 1) for link in node.links]
        assert [link.tsize for link in node.links] == [t for t, _ in sizes]
        assert all(link.name == "" for link in node.links)
        assert unixfs.blocksizes == [f for _, f in sizes]
        assert unixfs.filesize == sum(unixfs.blocksizes)
        return len(block) + sum(t for t, _ in sizes), unixfs.filesize

    _, filesize = visit(root, 0)
    assert filesize == len(data)
    assert b"".join(walk_file(cid_from_str(root), lambda raw: blocks[cid_to_str(raw)])) == data
    return root, depths, blocks


_SMALL_EDGES = [
    (0, 1, 0, 0),            # 1 byte: root is the leaf
    (1, 0, 0, 0),            # exactly one chunk: root is the leaf
    (1, 1, 1, 2),            # one chunk + 1 byte
    (174, 0, 1, 174),        # one full node
    (175, 0, 2, 2),          # two levels: (174) + (1)
]
_ONE_BYTE_V0, _ONE_BYTE_V1 = AddOptions(chunk_size=1), AddOptions(cid_version=1, chunk_size=1)


@pytest.mark.parametrize(
    ("chunks", "extra", "depth", "root_links", "options"),
    [(*case, opts) for case in _SMALL_EDGES for opts in (_ONE_BYTE_V0, _ONE_BYTE_V1)]
    + [
        # 30k blocks each: CIDv1 only, as pure-Python base58 makes CIDv0 walks slow; the v0
        # multi-level shape is pinned by the go-ipfs vectors above.
        (174 * 174, 0, 2, 174, _ONE_BYTE_V1),    # exactly full at two levels
        (174 * 174 + 1, 0, 3, 2, _ONE_BYTE_V1),  # three levels
    ],
)
def test_edge_sizes(chunks: int, extra: int, depth: int, root_links: int, options: AddOptions) -> None:
    data = random.Random(chunks).randbytes(chunks + extra)
    root, depths, blocks = check_dag(data, options)
    assert set(depths) == {depth}  # balanced: every leaf at the same depth
    assert len(depths) == chunks + extra
    assert len(decode_dagpb(blocks[root]).links if parse_cid(root)[1] == DAG_PB else []) == root_links


def test_175_real_chunks_two_levels() -> None:
    """How fast is for bench/bench_cid.py; here only the shape of a real 44 MiB file's DAG."""
    data = os.urandom(175 * 262144)
    _, depths, _ = check_dag(data, AddOptions())
    assert depths == [2] * 175


# --- streaming API -------------------------------------------------------------------

def test_write_in_odd_pieces_matches_compute_cid() -> None:
    data = random.Random(7).randbytes(10_000)
    opts = AddOptions(chunk_size=64)
    builder = FileDagBuilder(opts)
    rng = random.Random(8)
    blocks, pos = [], 0
    while pos < len(data):
        step = rng.randint(0, 200)
        blocks += builder.write(data[pos:pos + step])
        pos += step
    last, root = builder.finish()
    assert root == compute_cid(data, opts)
    assert blocks + last == list(iter_blocks(data, opts))


def test_blocks_emitted_as_they_finish() -> None:
    builder = FileDagBuilder(AddOptions(chunk_size=1))
    emitted = [len(builder.add_chunk(b"x")) for _ in range(174 * 3 + 5)]
    assert all(n >= 1 for n in emitted)  # each leaf comes back at once
    assert emitted[173] == 2  # leaf 174 completes a link node, emitted right away
    last, _ = builder.finish()
    assert len(last) == 2  # only the partial node and the root are left


def test_only_hash_builder_matches_emitting_builder() -> None:
    data = os.urandom(5000)
    for opts in (AddOptions(chunk_size=100), AddOptions(cid_version=1, chunk_size=100)):
        quiet = FileDagBuilder(opts, emit_blocks=False)
        assert quiet.write(data) == []
        out, root = quiet.finish()
        assert out == [] and root == list(iter_blocks(data, opts))[-1][0]


def test_builder_rejects_misuse() -> None:
    builder = FileDagBuilder(AddOptions(chunk_size=4))
    with pytest.raises(StorageError):
        builder.add_chunk(b"12345")
    builder.add_chunk(b"12")
    with pytest.raises(StorageError):  # a short chunk must be the last one
        builder.add_chunk(b"1234")
    builder.finish()
    with pytest.raises(StorageError):
        builder.finish()


# --- CIDs, varints, decoding ------------------------------------------------------------

def test_parse_cid_and_round_trips() -> None:
    digest = parse_cid("QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH")[2]
    assert parse_cid("QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH") == (0, DAG_PB, digest)
    assert digest == sha(bytes.fromhex("0a0408021800"))
    empty_raw = "bafkreihdwdcefgh4dqkjv67uzcmw7ojee6xedzdetojuzjevtenxquvyku"
    assert parse_cid(empty_raw) == (1, RAW, sha(b""))
    assert parse_cid(empty_raw.upper()) == parse_cid(empty_raw)
    raw = cid_from_str(empty_raw)
    assert parse_cid("z" + base58.b58encode(raw).decode()) == (1, RAW, sha(b""))
    assert parse_cid("f" + raw.hex()) == (1, RAW, sha(b""))
    assert cid_to_str(raw) == empty_raw
    assert cid_for_block(b"", RAW, 1) == empty_raw
    assert cid_for_block(bytes.fromhex("0a0408021800")) == "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQH"


@pytest.mark.parametrize("bad", ["", "Qm", "hello", "QmbFMke1KXqnYyBBWxB74N4c5SBnJMVAiMNRcGu6x1AwQ0", "b!!!", "bafk"])
def test_parse_cid_rejects_garbage(bad: str) -> None:
    with pytest.raises(InvalidCidError):
        parse_cid(bad)


def test_cid_v0_must_be_dag_pb() -> None:
    with pytest.raises(InvalidCidError):
        cid_for_block(b"x", RAW, 0)


def test_varints() -> None:
    assert uvarint(0) == b"\x00" and uvarint(127) == b"\x7f" and uvarint(300) == b"\xac\x02"
    for n in (0, 1, 127, 128, 16383, 16384, 2**35 + 3, 2**63 - 1):
        assert read_uvarint(uvarint(n), 0) == (n, len(uvarint(n)))
    with pytest.raises(ValueError):
        read_uvarint(b"\x80", 0)


def test_decode_leaf_and_reject_garbage() -> None:
    node = decode_dagpb(b"\x0a\x12\x08\x02\x12\x0chello world\n\x18\x0c")
    assert node.links == []
    unixfs = decode_unixfs(node.data or b"")
    assert (unixfs.type, unixfs.data, unixfs.filesize, unixfs.blocksizes) == (2, b"hello world\n", 12, [])
    with pytest.raises(IntegrityError):
        decode_dagpb(b"\x0a\x50\x08")  # length overruns the block
    with pytest.raises(IntegrityError):
        decode_unixfs(b"\x18\x00")  # no Type
