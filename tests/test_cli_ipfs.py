"""``aitbc ipfs`` against the local store and a real daemon.

A few runs go through a subprocess and the real entry point (exit codes, stdout bytes);
each costs seconds of imports, so the wider matrix drives the sub-app in-process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from aitbc_agent_sdk.errors import ConfigError, ContentNotFoundError, StorageError
from aitbc_agent_sdk.storage import AddOptions, InvalidCidError, compute_cid
from aitbc_cli import ipfs

Run = Callable[..., subprocess.CompletedProcess[bytes]]
Invoke = Callable[..., Result]


@pytest.fixture
def run(aitbc_cmd: list[str], cli_env: dict[str, str]) -> Run:
    cmd = aitbc_cmd + ["ipfs"]
    env = {k: v for k, v in cli_env.items() if k != ipfs.API_ENV}  # the local store unless asked

    def go(*args: str, extra_env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([*cmd, *args], env={**env, **(extra_env or {})}, capture_output=True,
                              timeout=120, check=False)
    return go


@pytest.fixture
def invoke(aitbc_home: Path, monkeypatch: pytest.MonkeyPatch) -> Invoke:
    monkeypatch.delenv(ipfs.API_ENV, raising=False)
    runner = CliRunner()
    return lambda *args: runner.invoke(ipfs.app, list(args))


@pytest.fixture
def sample(tmp_path: Path) -> Path:
    path = tmp_path / "sample.bin"
    path.write_bytes(os.urandom(300_000))  # two chunks
    return path


# --- through the real entry point --------------------------------------------------------------

def test_only_hash_equals_daemon_cid(run: Run, ipfs_daemon: str, sample: Path) -> None:
    local = run("add", "--only-hash", "--json", str(sample))
    daemon = run("add", "--json", str(sample), extra_env={ipfs.API_ENV: ipfs_daemon})  # env selects the daemon
    assert local.returncode == 0 and daemon.returncode == 0, (local.stderr, daemon.stderr)
    assert json.loads(local.stdout) == json.loads(daemon.stdout) == {
        "cid": compute_cid(sample.read_bytes()), "size": 300_000}


def test_local_add_cat_round_trip(run: Run, aitbc_home: Path, sample: Path) -> None:
    added = run("add", str(sample))
    assert added.returncode == 0, added.stderr
    cid = added.stdout.decode().strip()
    assert (aitbc_home / "store" / "blocks").is_dir()
    out = run("cat", cid)
    assert out.returncode == 0 and out.stdout == sample.read_bytes()


def test_bad_cid_exits_2(run: Run) -> None:
    bad = run("cat", "not-a-cid")
    assert bad.returncode == 2
    assert b"malformed CID" in bad.stderr or b"unsupported CID" in bad.stderr
    assert b"Traceback" not in bad.stderr


# --- the sub-app in-process (SDK errors surface as exceptions; main maps them to exit 2) ------

@pytest.mark.parametrize("flags", [
    ["--cid-version", "1"],
    ["--cid-version", "1", "--no-raw-leaves"],
    ["--raw-leaves", "--chunker", "size-1024"],
    ["--chunker", "size-1024"],
])
def test_only_hash_matches_daemon_for_options(invoke: Invoke, ipfs_daemon: str, sample: Path,
                                               flags: list[str]) -> None:
    local = invoke("add", "--only-hash", *flags, str(sample))
    daemon = invoke("add", "--no-pin", "--api", ipfs_daemon, *flags, str(sample))
    assert local.exit_code == 0 and daemon.exit_code == 0, (local.output, daemon.output)
    assert local.stdout == daemon.stdout


def test_daemon_cat_and_pins(invoke: Invoke, ipfs_daemon: str, tmp_path: Path) -> None:
    data = os.urandom(5000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    api = ["--api", ipfs_daemon]
    cid = invoke("add", "--no-pin", "--cid-version", "1", *api, str(path)).stdout.strip()
    assert cid == compute_cid(data, AddOptions(cid_version=1))
    assert invoke("cat", *api, cid).stdout_bytes == data
    assert cid not in json.loads(invoke("pin", "ls", "--json", *api).stdout)["pins"]
    assert invoke("pin", "add", *api, cid).exit_code == 0
    assert cid in invoke("pin", "ls", *api).stdout.split()
    assert invoke("pin", "rm", *api, cid).exit_code == 0
    assert cid not in json.loads(invoke("pin", "ls", "--json", *api).stdout)["pins"]


def test_local_pins(invoke: Invoke, tmp_path: Path) -> None:
    path = tmp_path / "f.bin"
    path.write_bytes(b"pin me")
    cid = invoke("add", "--no-pin", str(path)).stdout.strip()
    assert json.loads(invoke("pin", "ls", "--json").stdout) == {"pins": []}
    invoke("pin", "add", cid)
    assert invoke("pin", "ls").stdout.split() == [cid]
    invoke("pin", "rm", cid)
    assert json.loads(invoke("pin", "ls", "--json").stdout) == {"pins": []}


def test_errors_propagate(invoke: Invoke, sample: Path) -> None:
    cases: list[tuple[list[str], type[Exception], str]] = [
        (["cat", "Qm-nonsense"], InvalidCidError, "CID"),
        (["cat", compute_cid(b"never stored")], ContentNotFoundError, "not in"),
        (["add", "--api", "http://127.0.0.1:9", "--timeout", "2", str(sample)], StorageError, "not reachable"),
        (["add", "--chunker", "rabin", str(sample)], ConfigError, "unsupported chunker"),
    ]
    for args, error, message in cases:
        result = invoke(*args)
        assert isinstance(result.exception, error), (args, result.exception)
        assert message in str(result.exception)
