"""``aitbc wallet``: create, import, list and inspect keystore wallets in ``$AITBC_HOME/wallets``.

Keys never pass through argv (shell history, ``ps``): ``import`` reads them from a file
or stdin. Passwords come from ``--password-file``, ``$AITBC_PASSWORD`` (or the older
``$AITBC_WALLET_PASSWORD``) or a hidden prompt, never a prompt under ``--json``. Nothing
here ever prints a key or a password. SDK errors propagate to ``app.main`` (see ``exits``).
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.profile import load_profile, profile_path
from aitbc_agent_sdk.settings import BUILTIN_NETWORKS

from .common import (
    HomeOption, JsonOption, NetworkOption, PasswordFileOption, PasswordSource, RpcUrlOption, eth_amount_option,
    given_password, network_or_default, no_prompt, print_json, resolve_home, user_settings,
)
from .params import format_eth

if TYPE_CHECKING:  # eth-account and web3 are imported when a command runs, not for --help
    from eth_account.signers.local import LocalAccount
    from web3.types import TxReceipt

    from aitbc_agent_sdk.chain import Wallet, WalletStore

app = typer.Typer(help="Manage local wallets (encrypted keystore v3 files in $AITBC_HOME/wallets).",
                  no_args_is_help=True)

RPC_ENV = "AITBC_RPC_URL"

NameArgument = Annotated[str, typer.Argument(help="wallet name (1-64 letters, digits, '.', '_', '-')")]


def _store(home: Path | None) -> WalletStore:
    from aitbc_agent_sdk.chain import WalletStore

    return WalletStore(resolve_home(home) / "wallets")


def _new_wallet_store(name: str, home: Path | None) -> WalletStore:
    """The store, once NAME is known to be valid and free: fail before asking for a password."""
    store = _store(home)
    path = store._path(name)  # the store's own name check (raises ConfigError)
    if path.exists():
        raise ConfigError(f"wallet {name!r} already exists at {path}")
    return store


def _password(name: str, *, confirm: bool, source: PasswordSource) -> str:
    if (given := given_password(source)) is not None:
        return given
    if not source.interactive:
        raise no_prompt(name)
    # Hidden, on stderr (stdout may carry JSON), and asked twice on create/import: a typo here locks the key away.
    password: str = typer.prompt(f"Password for wallet {name!r}", hide_input=True,
                                 confirmation_prompt=confirm, err=True)
    if not password:
        raise ConfigError("the password must not be empty")
    return password


def _rpc_url(rpc: str | None, home: Path | None, network: str | None) -> str:
    """--rpc-url; else a configured --network's node; else $AITBC_RPC_URL / $ETH_RPC_URL / the config
    file's rpc_url; else the chain of the devnet whose profile is in the home."""
    if rpc:
        return rpc
    name = network_or_default(network, fallback="embedded")
    settings = user_settings()
    if name not in BUILTIN_NETWORKS:
        return str(settings.network_settings(name).rpc_url)
    if name != "devnet" and settings.rpc_url:
        return settings.rpc_url
    root = resolve_home(home)
    if profile_path(root).is_file():
        return load_profile(root).chain.rpc_url
    raise ConfigError(f"no RPC node given: pass --rpc-url URL or --network NAME, set ${RPC_ENV} or $ETH_RPC_URL, "
                      f"or start a devnet in {root} ('aitbc devnet up')")


def _eth(wei: int) -> str:
    return format_eth(wei)


def _wallet_json(wallet: Wallet) -> dict[str, Any]:
    return {"name": wallet.name, "address": wallet.address, "path": str(wallet.path)}


def _emit(as_json: bool, data: dict[str, Any], text: str) -> None:
    if as_json:
        print_json(data)
    else:
        Console().print(text, highlight=False)


@app.command()
def create(name: NameArgument, password_file: PasswordFileOption = None, home: HomeOption = None,
           as_json: JsonOption = False) -> None:
    """Generate a new key and store it encrypted under NAME.

    Example: aitbc wallet create alice --json
    """
    store = _new_wallet_store(name, home)
    wallet = asyncio.run(store.create(name, _password(name, confirm=True,
                                                      source=PasswordSource(password_file, not as_json))))
    _emit(as_json, _wallet_json(wallet),
          f"created wallet [bold]{wallet.name}[/] {wallet.address}\n  {escape(str(wallet.path))}")


@app.command("import")
def import_(name: NameArgument,
            private_key_file: Annotated[Path, typer.Option(
                "--private-key-file", help="file holding the hex private key; '-' reads one line of stdin")],
            password_file: PasswordFileOption = None, home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Encrypt an existing private key under NAME (the key is read from a file, never argv).

    Example: aitbc wallet import bob --private-key-file key.txt
    """
    store = _new_wallet_store(name, home)
    key = _read_key(private_key_file)
    wallet = asyncio.run(store.import_key(name, key, _password(name, confirm=True,
                                                               source=PasswordSource(password_file, not as_json))))
    _emit(as_json, _wallet_json(wallet),
          f"imported wallet [bold]{wallet.name}[/] {wallet.address}\n  {escape(str(wallet.path))}")


@app.command("list")
def list_(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """List wallets and their addresses (no password needed).

    Example: aitbc wallet list --json
    """
    store = _store(home)
    wallets = asyncio.run(store.list())
    if as_json:
        print_json({"wallets": [_wallet_json(w) for w in wallets]})
        return
    if not wallets:
        Console().print(f"no wallets in {escape(str(store.root))}; create one with `aitbc wallet create NAME`")
        return
    table = Table(title=f"Wallets in {store.root}")
    table.add_column("name")
    table.add_column("address")
    for w in wallets:
        table.add_row(w.name, w.address)
    Console().print(table)


@app.command()
def balance(name: NameArgument, rpc: RpcUrlOption = None, network: NetworkOption = None, home: HomeOption = None,
            as_json: JsonOption = False) -> None:
    """Show a wallet's balance in wei and ETH (no password needed).

    The chain is --rpc-url, else --network's node, else $AITBC_RPC_URL / $ETH_RPC_URL / the config
    file's rpc_url, else the devnet whose profile is in the home.

    Example: aitbc wallet balance dev --json
    """
    url = _rpc_url(rpc, home, network)
    wallet = asyncio.run(_store(home).get(name))
    chain_id, wei = asyncio.run(_balance(url, wallet.address))
    data = {"name": wallet.name, "address": wallet.address, "chain_id": chain_id, "wei": wei, "eth": _eth(wei)}
    _emit(as_json, data, f"{wallet.name} {wallet.address}: {_eth(wei)} ETH ({wei} wei) on chain {chain_id}")


@app.command()
def send(name: Annotated[str, typer.Argument(help="wallet to pay from")],
         to: Annotated[str, typer.Option("--to", help="recipient address (0x...)")],
         amount: Annotated[int, eth_amount_option("--amount", "--eth", help="amount to send")],
         rpc: RpcUrlOption = None, network: NetworkOption = None, password_file: PasswordFileOption = None,
         home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Send ETH from a wallet (unlocks it with its password); the chain as for `balance`.

    Example: aitbc wallet send dev --to 0xRecipient --amount 0.25 --json
    """
    url = _rpc_url(rpc, home, network)
    store = _store(home)
    asyncio.run(store.get(name))  # a missing wallet fails before the password prompt
    account = asyncio.run(store.unlock(name, _password(name, confirm=False,
                                                       source=PasswordSource(password_file, not as_json))))
    receipt = asyncio.run(_send(url, account, to, amount))
    tx_hash = receipt["transactionHash"].to_0x_hex()
    data = {"name": name, "from": account.address, "to": receipt["to"], "wei": amount, "tx_hash": tx_hash,
            "block": int(receipt["blockNumber"])}
    _emit(as_json, data, f"sent {_eth(amount)} ETH from {name} to {receipt['to']}: tx {tx_hash}")


def _read_key(path: Path) -> str:
    try:
        # One line from stdin, so a password prompt can still read the lines after it.
        text = sys.stdin.readline() if str(path) == "-" else path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read private key file {path}: {exc.strerror}") from exc
    key = text.strip()
    if not key:
        raise ConfigError(f"private key file {path} is empty")
    from eth_account import Account

    try:  # check before the password prompt; the message must not echo the key
        Account.from_key(key)
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"invalid private key in {path}: expected 32 bytes of hex") from exc
    return key


async def _balance(url: str, address: str) -> tuple[int, int]:
    from aitbc_agent_sdk.chain import connect_rpc
    from aitbc_agent_sdk.chain import CHAIN_EXCEPTIONS, map_chain_error

    w3 = await connect_rpc(url)
    try:
        return int(await w3.eth.chain_id), int(await w3.eth.get_balance(w3.to_checksum_address(address)))
    except CHAIN_EXCEPTIONS as exc:
        raise map_chain_error(exc, action=f"balance of {address}") from exc
    finally:
        await w3.provider.disconnect()


async def _send(url: str, account: LocalAccount, to: str, wei: int) -> TxReceipt:
    from aitbc_agent_sdk.chain import TransactionSender, connect_rpc

    w3 = await connect_rpc(url)
    try:
        try:
            recipient = w3.to_checksum_address(to)
        except ValueError as exc:
            raise ConfigError(f"invalid recipient address {to!r}") from exc
        return await TransactionSender(w3, account).send({"to": recipient, "value": wei}, label=f"send to {recipient}")
    finally:
        await w3.provider.disconnect()
