"""Directories in both stores: ``ipfs add -r`` CIDs, HAMT round trips, resume, paths and ranges, the CLI.

The daemon is the real js-ipfs one; the CIDs both stores give are checked against each other and
against ``compute_directory_cid`` (whose encoding tests/test_unixfs_directories.py checks against
kubo's own sharness CIDs). The daemon's own ``cat`` of a path through our HAMT is an independent
reader of what we wrote.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from typer.testing import CliRunner

from aitbc_agent_sdk.errors import ConfigError, StorageError
from aitbc_agent_sdk.storage import (
    AddOptions,
    DirectoryStore,
    LocalContentStore,
    cid_from_str,
    compute_directory_cid,
    compute_file_cid,
    scan_directory,
)
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_cli import ipfs

SHARD_ALL = AddOptions(hamt_threshold=1)  # every directory a HAMT (kubo's sharness forces it the same way)
BIG = 600_000  # three chunks: a file with an internal node


def make_tree(root: Path) -> Path:
    (root / "sub" / "deep").mkdir(parents=True)
    (root / "empty").mkdir()
    (root / "a.txt").write_bytes(b"alpha\n")
    for i in range(24):
        (root / "sub" / f"b{i:02d}.bin").write_bytes(bytes([i]) * (i * 37 + 1))
    (root / "sub" / "deep" / "c.txt").write_bytes(b"see\n")
    (root / "big.bin").write_bytes(os.urandom(BIG))
    (root / ".hidden").write_bytes(b"secret")
    (root / "sub" / ".git").mkdir()
    (root / "sub" / ".git" / "HEAD").write_bytes(b"ref")
    return root


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    return make_tree(tmp_path / "data")


class CountingLocalStore(LocalContentStore):
    """Instrumentation, not a mock: the real store, counting the blocks it reads."""

    reads = 0

    def _get_block(self, raw_cid: bytes) -> bytes:
        self.reads += 1
        return super()._get_block(raw_cid)


class CountingClient(KuboClient):
    """Instrumentation, not a mock: the real RPC client, counting file adds and block reads."""

    adds = 0
    block_reads = 0

    async def add(self, data: bytes | Path, **kwargs: object) -> str:  # type: ignore[override]
        self.adds += 1
        return await super().add(data, **kwargs)  # type: ignore[arg-type]

    async def block_get(self, cid: str, **kwargs: object) -> bytes:  # type: ignore[override]
        self.block_reads += 1
        return await super().block_get(cid, **kwargs)  # type: ignore[arg-type]


class Interrupted(Exception):
    pass


def stop_after(files: int) -> object:
    """Fault injection (labelled): a progress callback that kills the import after ``files`` files,
    as a crash or Ctrl-C would; no real part can be made to fail at an exact file."""
    seen = [0]

    def progress(_: int) -> None:
        seen[0] += 1
        if seen[0] == files:
            raise Interrupted
    return progress


async def test_local_store_directories(tree: Path, tmp_path: Path) -> None:
    store = CountingLocalStore(tmp_path / "store")
    assert isinstance(store, DirectoryStore)
    plain = await store.add_directory(tree)
    assert plain == compute_directory_cid(tree) and plain in await store.pins()
    sharded = await store.add_directory(tree, options=SHARD_ALL)
    assert sharded == compute_directory_cid(tree, SHARD_ALL) != plain
    with_hidden = await store.add_directory(tree, hidden=True)
    assert with_hidden == compute_directory_cid(tree, hidden=True) != plain
    for root in (plain, sharded):
        assert await store.cat(f"{root}/sub/deep/c.txt") == b"see\n"
        assert await store.resolve(f"{root}/big.bin") == compute_file_cid(tree / "big.bin")
        entries = [entry async for entry in store.walk_directory(root)]
        assert [e.path for e in entries if not e.is_dir] == (
            ["a.txt", "big.bin"] + [f"sub/b{i:02d}.bin" for i in range(24)] + ["sub/deep/c.txt"])
        assert {e.path for e in entries if e.is_dir} == {"empty", "sub", "sub/deep"}
        assert next(e.size for e in entries if e.path == "big.bin") == BIG
    assert ".hidden" in [e.path async for e in store.walk_directory(with_hidden)]
    # A range reads only the blocks it overlaps.
    data = (tree / "big.bin").read_bytes()
    store.reads = 0
    assert await store.cat(f"{plain}/big.bin", offset=300_000, length=1000) == data[300_000:301_000]
    assert store.reads == 1 + 2  # the directory, the file's root, the one chunk holding the range
    got = b"".join([c async for c in store.stream(f"{plain}/big.bin", offset=BIG - 5, length=100)])
    assert got == data[-5:]


async def test_local_import_resumes_from_its_journal(tree: Path, tmp_path: Path) -> None:
    store = LocalContentStore(tmp_path / "store")
    journal = tmp_path / "import.jsonl"
    expected = compute_directory_cid(tree)
    with pytest.raises(Interrupted):
        await store.add_directory(tree, journal=journal, progress=stop_after(4))  # type: ignore[arg-type]
    assert len(journal.read_text().splitlines()) == 1 + 4  # the header and the four finished files
    # Change a journalled file behind the journal's back (same size and mtime): a resumed import
    # trusts the journal, which shows that the file was skipped, not read again.
    first = tree / "a.txt"
    st = first.stat()
    first.write_bytes(b"ALPHA\n")
    os.utime(first, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert await store.add_directory(tree, journal=journal) == expected
    assert compute_directory_cid(tree) != expected
    # A journalled file whose blocks are gone from the store is added again.
    journal.unlink()
    with pytest.raises(Interrupted):
        await store.add_directory(tree, journal=journal, progress=stop_after(1))  # type: ignore[arg-type]
    store._block_path(cid_from_str(compute_file_cid(first))).unlink()
    assert await store.add_directory(tree, journal=journal) == compute_directory_cid(tree)
    assert await store.cat(compute_file_cid(first)) == b"ALPHA\n"


async def test_links_and_special_files_are_refused(tree: Path, tmp_path: Path) -> None:
    (tree / "sub" / "link").symlink_to(tree / "a.txt")
    with pytest.raises(StorageError, match="symbolic link"):
        await LocalContentStore(tmp_path / "store").add_directory(tree)
    (tree / "sub" / "link").unlink()
    os.mkfifo(tree / "pipe")
    with pytest.raises(StorageError, match="neither a regular file"):
        compute_directory_cid(tree)


async def test_daemon_store_hamt_round_trip_and_resume(ipfs_daemon: str, tree: Path, tmp_path: Path) -> None:
    expected = compute_directory_cid(tree, SHARD_ALL)
    async with CountingClient(ipfs_daemon, timeout=60.0, find_timeout=5.0) as client:
        store = KuboContentStore(client)
        journal = tmp_path / "import.jsonl"
        with pytest.raises(Interrupted):
            await store.add_directory(tree, options=SHARD_ALL, journal=journal,
                                      progress=stop_after(5))  # type: ignore[arg-type]
        client.adds = 0
        root = await store.add_directory(tree, options=SHARD_ALL, journal=journal)
        assert root == expected
        assert client.adds == scan_directory(tree)[0] - 5  # the five journalled files were not sent again
        assert root in await store.pins()
        # Our reader through the shards, and the daemon's own (js-ipfs) reader of our HAMT blocks.
        assert await store.cat(f"{root}/sub/deep/c.txt") == b"see\n"
        assert b"".join([c async for c in client.cat(f"/ipfs/{root}/sub/b03.bin")]) == bytes([3]) * 112
        walked = [e.path async for e in store.walk_directory(root) if not e.is_dir]
        assert len(walked) == 27 and walked[0] == "a.txt"
        data = (tree / "big.bin").read_bytes()
        file_cid = await store.resolve(f"{root}/big.bin")
        client.block_reads = 0
        assert await store.cat(file_cid, offset=262_000, length=1000) == data[262_000:263_000]
        assert client.block_reads == 1 + 2  # the root and the two chunks the range straddles


def test_cli_add_recursive_and_cat_a_path(tree: Path, aitbc_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ipfs.API_ENV, raising=False)
    runner = CliRunner()
    added = runner.invoke(ipfs.app, ["add", "-r", "--json", str(tree)])
    assert added.exit_code == 0, added.output
    files, total = scan_directory(tree)
    assert json.loads(added.stdout) == {"cid": compute_directory_cid(tree), "size": total, "files": files}
    assert not list((aitbc_home / "imports").glob("*"))  # the implied journal is gone once done
    root = json.loads(added.stdout)["cid"]
    piece = runner.invoke(ipfs.app, ["cat", f"{root}/big.bin", "--offset", "10", "--length", "20"])
    assert piece.stdout_bytes == (tree / "big.bin").read_bytes()[10:30]
    refused = runner.invoke(ipfs.app, ["add", str(tree)])
    assert isinstance(refused.exception, ConfigError) and "-r" in str(refused.exception)

