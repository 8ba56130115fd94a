"""Async helpers the marketplace tools share: a devnet agent, the training a step is about,
the coordinator daemon's start. They call the SDK only; nothing here shells out to the CLI."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING

from ..errors import NotFoundError

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from .. import Agent
    from ..coordinator import Snapshot
    from ..records import TrainingRecord
    from ._base import ToolContext

WEI_PER_ETH = 10**18


def to_wei(eth: float) -> int:
    return int(Decimal(str(eth)) * WEI_PER_ETH)


def eth(wei: int) -> str:
    whole, frac = divmod(int(wei), WEI_PER_ETH)
    return f"{whole}.{frac:018d}".rstrip("0").rstrip(".")


def db_path(home: Path) -> Path:
    return home / "aitbc.db"


async def unlock(ctx: ToolContext, wallet: str) -> LocalAccount:
    from ..devnet import wallet_store

    return await wallet_store(ctx.home).unlock(wallet, ctx.password(wallet))


@asynccontextmanager
async def devnet_agent(ctx: ToolContext, account: LocalAccount) -> AsyncIterator[Agent]:
    from ..flow import devnet_agent as flow_agent

    async with flow_agent(ctx.home, account, "aitbc-assistant") as agent:
        yield agent


async def training(home: Path, training_id: str) -> TrainingRecord:
    from ..flow import load_training

    return await load_training(home, training_id)


async def resolve_training(ctx: ToolContext, training_id: str | None) -> str:
    """The id given, else the one an earlier step of this plan used, else the newest training."""
    if training_id:
        return training_id
    if ctx.training_id:
        return ctx.training_id
    from ..coordinator import TrainingDatabase

    if not db_path(ctx.home).exists():
        raise NotFoundError(f"no trainings yet in {ctx.home}; start one first (for example: "
                            "'find 3 workers and train an mlp on digits')")
    async with TrainingDatabase(db_path(ctx.home)) as db:
        records = await db.trainings()
    if not records:
        raise NotFoundError(f"no trainings yet in {ctx.home}")
    return max(records, key=lambda r: r.created_at).training_id


async def wallet_of(home: Path, training_id: str) -> str:
    from ..flow import wallet_of as flow_wallet_of

    return await flow_wallet_of(home, training_id)


async def snapshot_of(home: Path, training_id: str) -> Snapshot:
    from ..coordinator import snapshot
    from ..coordinator import TrainingDatabase

    async with TrainingDatabase(db_path(home)) as db:
        return await snapshot(db, training_id, audit_dir=home / "trainings")


async def wait_for_daemon(ready: Callable[[], Awaitable[bool]], home: Path, training_id: str, pid: int,
                          what: str, timeout: float = 60.0) -> None:
    """Return once ``ready()``; fail with the daemon's last log lines if it exited first."""
    from ..flow import wait_for_daemon as flow_wait

    await flow_wait(ready, home, training_id, pid, what, timeout)
