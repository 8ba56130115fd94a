"""The ``aitbc`` entry point: sub-apps are registered here; errors become exit code 2."""

from __future__ import annotations

import sys

import typer
from pydantic import ValidationError
from rich.console import Console

from aitbc_agent_sdk import AitbcError

from . import chat, cluster, devnet, distributed_training, ipfs, market, mcp_server, provider, wallet

app = typer.Typer(help="Federated training on rented GPUs, paid through an on-chain escrow.",
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(distributed_training.app, name="distributed-training")
app.add_typer(devnet.app, name="devnet")
app.add_typer(provider.app, name="provider")
app.add_typer(wallet.app, name="wallet")
app.add_typer(ipfs.app, name="ipfs")
app.add_typer(market.app, name="market")
app.add_typer(cluster.app, name="cluster")
app.command("chat")(chat.chat)
app.add_typer(mcp_server.app, name="mcp")

EXIT_BAD_INPUT = 2


def main() -> None:
    # Standalone mode: typer reports usage errors itself (exit 2); SDK errors are ours to map.
    try:
        app()
    except (AitbcError, ValidationError) as exc:
        Console(stderr=True).print(f"[bold red]error:[/] {_describe(exc)}")
        sys.exit(EXIT_BAD_INPUT)


def _describe(exc: Exception) -> str:
    if isinstance(exc, ValidationError):
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or exc.title
        return f"invalid {where}: {first['msg']}"
    return str(exc)


if __name__ == "__main__":
    main()
