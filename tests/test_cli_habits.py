"""The CLI's habits through the real entry point: --version, errors as JSON objects, an exit code per
kind of failure, the password prompt on stderr, --home on a regular file, and no files left behind
by a read-only or failed command. Each `aitbc` start costs seconds of imports, so the calls of a test
run side by side."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from typer.testing import CliRunner

from aitbc_agent_sdk.devnet._network import wallet_store
from aitbc_agent_sdk.devnet._service import free_port
from aitbc_agent_sdk.storage import compute_cid
from aitbc_cli import ipfs

PASSWORD = "correct horse battery staple"
Call = tuple[Sequence[str], dict[str, str] | None, str | None]  # args, env (None: the test's), stdin


def run_all(aitbc_cmd: list[str], env: dict[str, str], *calls: Sequence[str] | Call
            ) -> list[subprocess.CompletedProcess[str]]:
    def one(call: Sequence[str] | Call) -> subprocess.CompletedProcess[str]:
        args, call_env, stdin = call if isinstance(call, tuple) else (call, None, None)
        return subprocess.run([*aitbc_cmd, *args], env=call_env or env, input=stdin, capture_output=True, text=True,
                              timeout=180)
    with ThreadPoolExecutor(max_workers=4) as pool:
        return list(pool.map(one, calls))


@pytest.fixture
def env(cli_env: dict[str, str], tmp_path: Path) -> dict[str, str]:
    """The caller's shell settings out of the way: no endpoint variables, no user config file."""
    clean = {k: v for k, v in cli_env.items() if not k.startswith(("AITBC_", "XDG_")) and k != "ETH_RPC_URL"}
    # Wide enough that rich's error box never wraps a message mid-phrase.
    return {**clean, "AITBC_HOME": cli_env["AITBC_HOME"], "HOME": str(tmp_path / "user"), "COLUMNS": "400"}


def files_under(path: Path) -> list[str]:
    return sorted(str(p.relative_to(path)) for p in path.rglob("*")) if path.exists() else []


def test_version_and_the_exit_codes_in_help(aitbc_cmd: list[str], env: dict[str, str]) -> None:
    shown, helped = run_all(aitbc_cmd, env, ["--version"], ["--help"])
    assert shown.returncode == 0 and shown.stdout.strip() == f"aitbc {version('aitbc-agent-sdk')}"
    text = " ".join(helped.stdout.split())
    assert helped.returncode == 0
    for line in ("Exit codes:", "2 usage error", "3 a service is unreachable", "4 not enough suitable providers",
                 "5 payment or chain failure", '{"error": ..., "code": ...'):
        assert line in text


def test_errors_are_json_objects_with_their_own_exit_codes(aitbc_cmd: list[str], env: dict[str, str],
                                                           aitbc_home: Path, tmp_path: Path) -> None:
    asyncio.run(wallet_store(aitbc_home).create("alice", PASSWORD))
    dead = f"127.0.0.1:{free_port()}"  # nothing listens there
    sample = tmp_path / "sample.bin"
    sample.write_bytes(os.urandom(1000))
    usage, rpc_down, ipfs_down, bad_multiaddr, bad_amount, human = run_all(
        aitbc_cmd, env,
        ["wallet", "list", "--bogus", "--json"],
        ["wallet", "balance", "alice", "--rpc-url", f"http://{dead}", "--json"],
        ["ipfs", "add", "--api", f"/ip4/127.0.0.1/tcp/{dead.split(':')[1]}", "--timeout", "5", str(sample), "--json"],
        ["ipfs", "add", "--api", "/ip4/127.0.0.1/udp/5001", str(sample), "--json"],
        ["wallet", "send", "alice", "--to", "0x" + "22" * 20, "--amount", "1.5wei", "--json"],
        ["wallet", "balance", "alice", "--rpc", f"http://{dead}"],
    )
    expected = [(usage, 2, "NoSuchOption", "--bogus"), (rpc_down, 3, "ChainUnreachableError", "unreachable"),
                (ipfs_down, 3, "StoreUnreachableError", "not reachable"),
                (bad_multiaddr, 2, "BadParameter", "multiaddr"), (bad_amount, 2, "BadParameter", "fraction of a wei")]
    for proc, code, kind, words in expected:
        assert proc.returncode == code, (proc.args, proc.stdout, proc.stderr)
        error = json.loads(proc.stdout)  # the whole of stdout is one JSON object
        assert (error["code"], error["type"]) == (code, kind) and words in error["error"], error
        assert "Traceback" not in proc.stderr
    # Without --json: the message on stderr, nothing on stdout, the same code.
    assert human.returncode == 3 and human.stdout == "" and "unreachable" in human.stderr
    assert not (aitbc_home / "store").exists()  # --api was used, not the local store


def test_the_password_prompt_goes_to_stderr(aitbc_cmd: list[str], env: dict[str, str], aitbc_home: Path) -> None:
    """Unlocking a wallet with no password set asks on stderr, stdout stays for the command's output; under
    --json it never asks (tests/test_first_hour_cli.py)."""
    asyncio.run(wallet_store(aitbc_home).create("prov", PASSWORD))
    before = files_under(aitbc_home)
    asked, = run_all(aitbc_cmd, env, (["provider", "register", "--wallet", "prov", "--stake", "0.1"], None,
                                      PASSWORD + "\n"))
    # The password unlocked the wallet; the command then fails for want of a devnet: a usage error.
    assert asked.returncode == 2, asked.stderr
    assert "no devnet profile" in asked.stderr and "wallet password" in asked.stderr and not asked.stdout.strip()
    assert PASSWORD not in asked.stdout + asked.stderr
    assert files_under(aitbc_home) == before  # the failed command left nothing


def test_a_home_that_is_a_regular_file_is_a_usage_error(aitbc_cmd: list[str], env: dict[str, str],
                                                        tmp_path: Path) -> None:
    file = tmp_path / "home-file"
    file.write_text("not a directory")
    flag, variable, as_json, below = run_all(
        aitbc_cmd, env,
        ["wallet", "list", "--home", str(file)],
        (["wallet", "balance", "alice", "--rpc-url", "http://127.0.0.1:9"], {**env, "AITBC_HOME": str(file)}, None),
        ["ipfs", "pin", "ls", "--home", str(file), "--json"],
        ["devnet", "status", "--home", str(file / "below")],
    )
    for proc in (flag, variable, below):
        assert proc.returncode == 2, proc.stderr
        assert "is a file, not a directory" in " ".join(proc.stderr.split()), proc.stderr
        assert "Traceback" not in proc.stderr
    assert as_json.returncode == 2 and "is a file, not a directory" in json.loads(as_json.stdout)["error"]
    assert file.read_text() == "not a directory"


def test_read_only_and_failed_commands_leave_no_files(aitbc_cmd: list[str], env: dict[str, str],
                                                      aitbc_home: Path) -> None:
    dead = f"http://127.0.0.1:{free_port()}"
    done = run_all(
        aitbc_cmd, env,
        ["wallet", "list", "--json"],
        ["ipfs", "pin", "ls", "--json"],
        ["distributed-training", "list", "--json"],
        ["distributed-training", "monitor", "--training-id", "training-nope", "--json"],
        ["wallet", "balance", "nobody", "--rpc-url", dead, "--json"],
        ["provider", "status", "--wallet", "nobody", "--json"],
        ["market", "list", "--network", "mainnet", "--json"],
    )
    codes = [p.returncode for p in done]
    assert codes[:3] == [0, 0, 0] and all(c != 0 for c in codes[3:]), [(p.args, p.stderr) for p in done]
    assert [json.loads(p.stdout)["code"] for p in done[3:]] == codes[3:]  # every failure a JSON object too
    assert files_under(aitbc_home) == [] and not aitbc_home.exists()


def test_the_api_option_takes_a_multiaddr(ipfs_daemon: str, aitbc_home: Path, tmp_path: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """--api and $AITBC_IPFS_API reach the real daemon by kubo's multiaddr (in-process: one start is enough)."""
    monkeypatch.delenv(ipfs.API_ENV, raising=False)
    address = f"/ip4/127.0.0.1/tcp/{urlsplit(ipfs_daemon).port}"
    data = os.urandom(5000)
    path = tmp_path / "f.bin"
    path.write_bytes(data)
    runner = CliRunner()
    added = runner.invoke(ipfs.app, ["add", "--no-pin", "--api", address, "--json", str(path)])
    assert added.exit_code == 0, added.output
    cid = json.loads(added.stdout)["cid"]
    assert cid == compute_cid(data)
    assert runner.invoke(ipfs.app, ["cat", "--ipfs-api", address, cid]).stdout_bytes == data
    monkeypatch.setenv(ipfs.API_ENV, address)
    pinned = runner.invoke(ipfs.app, ["pin", "add", cid])
    assert pinned.exit_code == 0, pinned.output
    assert cid in json.loads(runner.invoke(ipfs.app, ["pin", "ls", "--json"]).stdout)["pins"]
    assert not (aitbc_home / "store").exists()  # all of it went to the daemon


def test_too_few_providers_has_its_own_exit_code(aitbc_cmd: list[str], env: dict[str, str],
                                                 aitbc_home: Path) -> None:
    """The embedded stack with one provider for three workers: exit 4, before anything is paid or stored."""
    short, = run_all(aitbc_cmd, env, ["distributed-training", "run", "--target-workers", "3", "--providers", "1",
                                      "--rounds", "1", "--yes", "--json"])
    assert short.returncode == 4, short.stderr
    error = json.loads(short.stdout)
    assert (error["code"], error["type"]) == (4, "NotEnoughWorkersError") and "only 1" in error["error"]
    assert not (aitbc_home / "aitbc.db").exists()  # the training store is made by its first write: none came
