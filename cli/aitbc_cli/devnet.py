"""``aitbc devnet up|down|status|join``: every server on 127.0.0.1 (or ``--host``), for development and tests."""

from __future__ import annotations

import asyncio
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.records import terminal_markup

from .common import ExitCode, HomeOption, JsonOption, cli_parser, eth_amount_option, print_json, resolve_home
from .params import parse_ipfs_api

if TYPE_CHECKING:
    from aitbc_agent_sdk.devnet import DevnetOptions
    from aitbc_agent_sdk.profile import Profile

app = typer.Typer(help="Run a local devnet: MQTT broker, anvil with the contracts, IPFS, provider daemons.",
                  no_args_is_help=True)

DEFAULT_PRICE_WEI = 10**16


class IpfsChoice(str, Enum):
    local = "local"  # the content store under $AITBC_HOME/store
    daemon = "daemon"  # start a js-ipfs daemon with a Kubo RPC API


@app.command()
def up(
    providers: Annotated[int, typer.Option(min=0, help="provider daemons to start")] = 3,
    ipfs: Annotated[IpfsChoice, typer.Option(help="'local' content store, or 'daemon' to start js-ipfs")
                    ] = IpfsChoice.local,
    ipfs_api: Annotated[Optional[str], typer.Option(
        "--ipfs-api", "--api", parser=cli_parser(parse_ipfs_api), metavar="ADDR",
        help="use a running Kubo RPC API instead: multiaddr /ip4/127.0.0.1/tcp/5001 or http URL")] = None,
    price: Annotated[int, eth_amount_option("--price", "--price-eth", help="first provider's price per round",
                                            default_wei=DEFAULT_PRICE_WEI)] = DEFAULT_PRICE_WEI,
    host: Annotated[str, typer.Option(help="the one local IPv4 address every server binds to (never 0.0.0.0)")
                    ] = "127.0.0.1",
    tls: Annotated[Optional[bool], typer.Option(
        "--tls/--no-tls", help="broker TLS with a CA made for this devnet (default: on unless --host is loopback)")
                   ] = None,
    max_message_kib: Annotated[int, typer.Option(min=1, max=256 * 1024, help="largest MQTT payload, in KiB")] = 1024,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Start the devnet and write the profile later commands use.

    The broker admits only the devnet's accounts (one per wallet, plus 'observer'); their
    passwords are 0600 files under $AITBC_HOME/devnet/broker-auth/accounts.

    Example: aitbc devnet up --providers 3 --ipfs daemon --json
    """
    from aitbc_agent_sdk.devnet import DevnetOptions

    options = DevnetOptions(providers=providers, ipfs=ipfs.value, ipfs_api=ipfs_api,
                            provider_price_wei=price, host=host, tls=tls,
                            max_message_bytes=max_message_kib * 1024)
    profile = start_devnet(resolve_home(home), options, quiet=as_json)
    if as_json:
        print_json(profile.model_dump(mode="json"))
        return
    table = Table(title="devnet up")
    for col in ("service", "pid", "address"):
        table.add_column(col)
    for service in profile.services:
        table.add_row(service.name, str(service.pid), f"{service.host}:{service.port}" if service.port else "-")
    Console().print(table)
    Console().print(f"chain {profile.chain.rpc_url} (id {profile.chain.chain_id}), escrow {profile.chain.escrow}; "
                    f"store {profile.store.kind}; coordinator wallet 'dev'")


def start_devnet(home: Path, options: DevnetOptions, *, quiet: bool = False) -> Profile:
    """Start the devnet's servers in HOME and write its profile (``up``, and ``init`` on a fresh machine)."""
    from aitbc_agent_sdk.devnet import devnet_up

    console = Console(stderr=True, quiet=quiet)
    with console.status("starting broker, chain, contracts and providers..."):
        return asyncio.run(devnet_up(home, options))


@app.command()
def join(
    profile: Annotated[Path, typer.Option("--profile", exists=True, dir_okay=False,
                                          help="profile.json written by 'devnet up' on the devnet's host")],
    wallet: Annotated[Optional[list[str]], typer.Option("--wallet", help="create this wallet here (repeatable)")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Use a devnet running on another host: check its servers, save its profile here, create wallets.

    Example: aitbc devnet join --profile profile.json --wallet alice
    """
    from aitbc_agent_sdk.devnet import devnet_join

    joined, addresses = asyncio.run(devnet_join(resolve_home(home), profile, wallet or ()))
    if as_json:
        print_json({"bus": joined.bus.model_dump(mode="json"), "chain": joined.chain.model_dump(mode="json"),
                    "store": joined.store.model_dump(mode="json"), "wallets": addresses})
        return
    console = Console()
    console.print(f"joined the devnet: broker {joined.bus.host}:{joined.bus.port}, chain {joined.chain.rpc_url} "
                  f"(id {joined.chain.chain_id}), escrow {joined.chain.escrow}, IPFS {joined.store.api}")
    for name, address in addresses.items():
        console.print(f"wallet {name}: {address}")


@app.command()
def accounts(
    username: Annotated[list[str], typer.Argument(help="wallet addresses (as topics spell them) to admit")],
    export: Annotated[Optional[Path], typer.Option(
        help="also copy each account's password file (0600) here, for the host that joins with it")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """On the devnet's host: give wallets broker accounts (for hosts that 'devnet join'), reload the broker.

    A joined host reads them from $AITBC_HOME/devnet/bus-accounts/<address>.

    Example: aitbc devnet accounts 0xAbC... --export ./accounts
    """
    from aitbc_agent_sdk.devnet import add_broker_accounts

    written = add_broker_accounts(resolve_home(home), username, export)
    if as_json:
        print_json({"accounts": username, "exported": [str(p) for p in written]})
    else:
        Console().print(f"broker accounts ready: {', '.join(username)}"
                        + (f"; password files in {export}" if export else ""))


@app.command()
def down(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Stop every devnet process and remove the profile.

    Example: aitbc devnet down
    """
    from aitbc_agent_sdk.devnet import devnet_down

    stopped = devnet_down(resolve_home(home))
    if as_json:
        print_json({"stopped": stopped})
    else:
        Console().print(f"stopped {len(stopped)} processes: {', '.join(stopped) or '-'}")


@app.command()
def status(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """Health of each part: processes, chain and contract, broker, offers and heartbeats (exit 1 if one fails).

    Example: aitbc devnet status --json
    """
    from aitbc_agent_sdk.devnet import devnet_status

    checks = asyncio.run(devnet_status(resolve_home(home)))
    if as_json:
        print_json({"ok": all(c.ok for c in checks), "checks": [c.model_dump() for c in checks]})
    else:
        table = Table(title="devnet status")
        for col in ("part", "ok", "detail"):
            table.add_column(col)
        for check in checks:
            table.add_row(check.part, "[green]ok[/]" if check.ok else "[red]FAIL[/]", terminal_markup(check.detail))
        Console().print(table)
    if not all(c.ok for c in checks):
        raise typer.Exit(ExitCode.FAILED)
