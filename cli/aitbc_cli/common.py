"""Shared CLI plumbing: the home directory, wallet unlocking, JSON output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from aitbc_agent_sdk.config import default_home
from aitbc_agent_sdk.models import ElasticPolicy
from aitbc_agent_sdk.profile import devnet_password

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc_agent_sdk.chain import WalletStore

HomeOption = Annotated[Optional[Path], typer.Option("--home", help="state directory [default: $AITBC_HOME or ~/.aitbc]")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object and nothing else")]


def wallet_store(home: Path) -> WalletStore:
    from aitbc_agent_sdk.devnet.network import wallet_store as devnet_wallets

    return devnet_wallets(home)


def resolve_home(home: Path | None) -> Path:
    return home if home is not None else default_home()


def wallet_password(home: Path) -> str:
    """$AITBC_WALLET_PASSWORD, else the devnet's own password file, else ask."""
    password = devnet_password(home)
    if password is None:
        password = typer.prompt("wallet password", hide_input=True)
    return password


async def unlock(home: Path, wallet: str) -> tuple[LocalAccount, str]:
    password = wallet_password(home)
    return await wallet_store(home).unlock(wallet, password), password


def print_json(value: Any) -> None:
    typer.echo(json.dumps(value, sort_keys=True, default=str))

# Fault-tolerance and elastic-pool options, shared by `run` and `init`.
SparesOption = Annotated[int, typer.Option(min=0, help="spare providers hired to replace failed workers")]
AggregationOption = Annotated[str, typer.Option(help="fedavg, median, trimmed-mean, krum, multi-krum or norm-clip")]
HeartbeatOption = Annotated[float, typer.Option(min=0.1, help="seconds of silence before a worker is pinged")]
TargetThroughputOption = Annotated[Optional[float], typer.Option(min=0.0, help="elastic pool: samples/s to keep (hire below 70%, release above 130%)")]
MinWorkersOption = Annotated[int, typer.Option(min=1, help="elastic pool: never fewer workers")]
MaxWorkersOption = Annotated[int, typer.Option(min=1, help="elastic pool: never more workers")]
ScaleWindowOption = Annotated[int, typer.Option(min=1, help="elastic pool: rounds a throughput must last before acting")]


def elastic_policy(target: float | None, min_workers: int, max_workers: int, window: int) -> ElasticPolicy | None:
    """The elastic pool options, or None when no target throughput was given."""
    if target is None:
        return None
    return ElasticPolicy(target_samples_per_s=target, min_workers=min_workers, max_workers=max_workers,
                         window_rounds=window)
