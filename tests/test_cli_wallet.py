"""``aitbc wallet`` end to end, in a subprocess: create, import, list, balance and send against anvil."""

from __future__ import annotations

import asyncio
import json
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from eth_account import Account
from eth_account.signers.local import LocalAccount
from typer.testing import CliRunner
from web3 import AsyncWeb3

from aitbc_agent_sdk.chain import TransactionSender
from aitbc_agent_sdk.chain._deployment import fund_accounts
from aitbc_agent_sdk.errors import ChainError, ConfigError

ETH = 10**18
PASSWORD = "correct horse battery staple"
KEY = "0x" + "4c" * 32  # a fixed key, so the test can grep every output for it


WALLET = [sys.executable, "-m", "aitbc_cli.app", "wallet"]


class Cli:
    """Runs ``aitbc wallet ...`` and remembers every output, to check that no secret leaked."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env
        self.outputs: list[str] = []

    def __call__(self, *args: str, input: str | None = None, env: dict[str, str] | None = None,
                 ok: bool = True) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run([*WALLET, *args], env=env or self.env, input=input,
                              capture_output=True, text=True, timeout=120)
        self.outputs += [proc.stdout, proc.stderr]
        if ok:
            assert proc.returncode == 0, proc.stderr
        return proc

    async def run(self, *args: str, **kwargs: object) -> subprocess.CompletedProcess[str]:
        return await asyncio.to_thread(self, *args, **kwargs)  # type: ignore[arg-type]

    def assert_no_secrets(self) -> None:
        text = "\n".join(self.outputs).lower()
        assert KEY[2:].lower() not in text
        assert PASSWORD.lower() not in text


@pytest.fixture
def cli(cli_env: dict[str, str]) -> Cli:
    env = {k: v for k, v in cli_env.items() if k not in ("AITBC_RPC_URL", "ETH_RPC_URL", "AITBC_CONFIG")}
    env["AITBC_WALLET_PASSWORD"] = PASSWORD
    return Cli(env)


# Each `aitbc` start costs seconds (app.py imports every sub-app, torch included), so the
# subprocess tests keep to the main paths and run independent calls concurrently; rarer
# input errors are checked in-process on the sub-app below.


async def test_create_list_import(cli: Cli, aitbc_home: Path, tmp_path: Path) -> None:
    key_file = tmp_path / "key.txt"
    key_file.write_text(KEY + "\n")
    created, imported, piped = await asyncio.gather(
        cli.run("create", "alice", "--json"),
        cli.run("import", "bob", "--private-key-file", str(key_file), "--json"),
        # '-' reads the key from stdin (a pipe), still never from argv.
        cli.run("import", "carol", "--private-key-file", "-", "--json", input=KEY),
    )
    alice, bob, carol = (json.loads(p.stdout) for p in (created, imported, piped))
    path = aitbc_home / "wallets" / "alice.json"
    assert alice == {"name": "alice", "address": alice["address"], "path": str(path)}
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert bob["address"] == carol["address"] == Account.from_key(KEY).address

    listed = json.loads((await cli.run("list", "--json")).stdout)
    assert [(w["name"], w["address"]) for w in listed["wallets"]] == [
        ("alice", alice["address"]), ("bob", bob["address"]), ("carol", bob["address"])]
    cli.assert_no_secrets()


async def test_duplicate_name_and_missing_rpc_exit_2(cli: Cli) -> None:
    await cli.run("create", "alice")
    dup, no_rpc = await asyncio.gather(cli.run("create", "alice", ok=False), cli.run("balance", "alice", ok=False))
    assert dup.returncode == 2 and "wallet 'alice' already exists" in dup.stderr
    assert no_rpc.returncode == 2 and "pass --rpc-url URL" in " ".join(no_rpc.stderr.split())
    assert "Traceback" not in dup.stderr + no_rpc.stderr
    cli.assert_no_secrets()


async def test_balance_and_send_against_anvil(cli: Cli, tmp_path: Path, anvil_w3: AsyncWeb3,
                                              anvil_dev_accounts: list[LocalAccount]) -> None:
    url = str(anvil_w3.provider.endpoint_uri)  # type: ignore[attr-defined]
    key_file = tmp_path / "key"
    key_file.write_text(KEY)
    # A random wallet rather than KEY: the session's anvil is shared and KEY's balance may carry over.
    created, _ = await asyncio.gather(cli.run("create", "rich", "--json"),
                                      cli.run("import", "fixed", "--private-key-file", str(key_file)))
    wallet = json.loads(created.stdout)

    funder = TransactionSender(anvil_w3, anvil_dev_accounts[2])
    await fund_accounts(funder, [wallet["address"]], 3 * ETH // 2)
    as_json, text = await asyncio.gather(
        cli.run("balance", "rich", "--rpc", url, "--json"),
        # $ETH_RPC_URL (Foundry's) works as well as --rpc, and the human output shows both units.
        cli.run("balance", "rich", env={**cli.env, "ETH_RPC_URL": url}),
    )
    assert json.loads(as_json.stdout) == {"name": "rich", "address": wallet["address"], "chain_id": 31337,
                                          "wei": str(3 * ETH // 2), "eth": "1.5"}
    assert "1.5 ETH" in text.stdout and str(3 * ETH // 2) in text.stdout

    to = Account.create().address
    wrong, poor = await asyncio.gather(
        cli.run("send", "rich", "--to", to, "--eth", "0.25", "--rpc", url,
                env={**cli.env, "AITBC_WALLET_PASSWORD": "wrong"}, ok=False),
        cli.run("send", "fixed", "--to", to, "--eth", "1", "--rpc", url, ok=False),
    )
    assert wrong.returncode == 2 and "wrong password for wallet 'rich'" in wrong.stderr
    assert poor.returncode == 5 and "insufficient funds" in poor.stderr  # a payment failure, not a usage error
    # --amount is the name (--eth its alias) and takes a unit: 250000000 gwei = 0.25 ETH.
    sent = json.loads((await cli.run("send", "rich", "--to", to, "--amount", "250000000gwei", "--rpc-url", url,
                                     "--json")).stdout)
    assert sent["to"] == to and sent["tx_hash"].startswith("0x")
    assert await anvil_w3.eth.get_balance(to) == ETH // 4
    cli.assert_no_secrets()


def test_input_errors_and_prompts_in_process(aitbc_home: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The sub-app raises the SDK's errors (app.main turns them into exit 2, tested above)."""
    from aitbc_cli import wallet

    monkeypatch.delenv("AITBC_WALLET_PASSWORD", raising=False)
    monkeypatch.delenv("AITBC_RPC_URL", raising=False)
    runner = CliRunner()
    # No $AITBC_WALLET_PASSWORD: a hidden prompt, asked twice; a mismatch is asked again (--json never prompts).
    made = runner.invoke(wallet.app, ["create", "alice"], input=f"{PASSWORD}\nother\n{PASSWORD}\n{PASSWORD}\n")
    assert made.exit_code == 0, made.output
    assert "do not match" in made.output and PASSWORD not in made.output
    # A key piped on stdin takes one line; the password prompt reads the lines after it.
    piped = runner.invoke(wallet.app, ["import", "dave", "--private-key-file", "-"],
                          input=f"{KEY}\n{PASSWORD}\n{PASSWORD}\n")
    assert piped.exit_code == 0, piped.output
    assert KEY[2:] not in piped.output and PASSWORD not in piped.output
    table = runner.invoke(wallet.app, ["list"])
    assert "alice" in table.stdout and re.search(r"0x[0-9a-fA-F]{40}", made.stdout)[0] in table.stdout

    junk = tmp_path / "junk"
    junk.write_text("not a key")
    cases: list[tuple[list[str], type[Exception], str]] = [
        (["create", "../evil"], ConfigError, "invalid wallet name"),
        (["import", "x", "--private-key-file", str(tmp_path / "absent")], ConfigError, "cannot read private key file"),
        (["import", "x", "--private-key-file", str(junk)], ConfigError, "invalid private key"),
        (["balance", "nobody", "--rpc", "http://127.0.0.1:9"], ConfigError, "no wallet named 'nobody'"),
        (["balance", "alice", "--rpc", "http://127.0.0.1:9"], ChainError, "unreachable"),
        (["send", "alice", "--to", "0x1", "--eth", "0.1", "--rpc", "http://127.0.0.1:9"], ConfigError, "wrong password"),
    ]
    for args, error, message in cases:
        result = runner.invoke(wallet.app, args, input="wrong\n")
        assert isinstance(result.exception, error), (args, result.output)
        assert message in str(result.exception), args
    # An amount finer than a wei is a usage error, found before any password prompt.
    tiny = runner.invoke(wallet.app, ["send", "alice", "--to", "0x1", "--eth", "0.0000000000000000001", "--rpc", "x"])
    assert tiny.exit_code == 2 and "fraction of a wei" in tiny.output and "Password" not in tiny.output
    assert sorted(p.name for p in (aitbc_home / "wallets").iterdir()) == ["alice.json", "dave.json"]
