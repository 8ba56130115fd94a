"""Simulated providers, many to a process: each is the SDK's own ProviderAgent on the real broker and chain.

Each provider has its own key, broker account and MQTT session, with a last will that clears its offer.
It serves the market as a provider daemon does (``provider.SimulatedProvider``: only its training slot
differs). A provider marked busy heartbeats as one at work does, for the liveness phase.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import multiprocessing as mp
import resource
from collections import Counter
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.synchronize import Event as MpEvent
from pathlib import Path

import torch
from eth_account import Account
from eth_account.signers.local import LocalAccount

from aitbc_agent_sdk.chain import connect_rpc
from aitbc_agent_sdk.errors import AitbcError
from aitbc_agent_sdk.messaging import Bus, LastWill, topics
from aitbc_agent_sdk.messaging._settings import BusSettings, connect_bus
from aitbc_agent_sdk.provider._config import ProviderConfig
from aitbc_agent_sdk.provider._onchain import ProviderChain
from aitbc_agent_sdk.records import Hardware, TaskPolicy
from aitbc_agent_sdk.storage import LocalContentStore

from .provider import HOSTILE, SimulatedProvider

log = logging.getLogger(__name__)

CONNECT_AT_ONCE = 64  # connections opened together per process: a burst of thousands stalls the broker
KEEPALIVE_S = 30


@dataclass(frozen=True)
class FleetSpec:
    """What one fleet process runs: keys, asks and which providers are at work."""

    bus: BusSettings
    store_root: Path  # the devnet's local content store, shared by every process
    rpc_url: str
    escrow: str
    work_dir: Path
    keys: tuple[str, ...]  # 0x-hex private keys
    prices_wei: tuple[int, ...]
    busy: tuple[bool, ...]
    hostile: tuple[str | None, ...]  # a key of provider.HOSTILE, or None for an honest provider
    heartbeat_s: float = 1.0
    offer_refresh_s: float = 30.0


def raise_open_files() -> int:
    """The soft limit on open files raised to the hard one: a connection is a descriptor."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return hard


def sim_hardware(index: int) -> Hardware:
    cores = (4, 8, 16, 32)[index % 4]
    return Hardware(cpu_model="simulated", cpu_cores=cores, ram_bytes=cores * (4 << 30), disk_free_bytes=500 << 30)


async def _serve(make: Callable[[Bus], SimulatedProvider], account: LocalAccount, settings: BusSettings,
                 exits: contextlib.AsyncExitStack, gate: asyncio.Semaphore) -> SimulatedProvider:
    async with gate:
        bus = connect_bus(settings, f"sim-{account.address}", identity=account.address, persistent=False,
                          keepalive=KEEPALIVE_S, timeout=120.0, will=LastWill(topics.offer(account.address)))
        await exits.enter_async_context(bus)
        return await exits.enter_async_context(make(bus))


async def run_fleet(spec: FleetSpec, index: int, report: mp.Queue, stop: MpEvent, ask: MpEvent) -> None:
    answered = False  # ``ask``: report the fleet's jobs and dispatch times once
    gate = asyncio.Semaphore(CONNECT_AT_ONCE)
    store = LocalContentStore(spec.store_root)
    w3 = await connect_rpc(spec.rpc_url)
    chain = await ProviderChain.connect(w3, spec.escrow)

    def maker(account: LocalAccount, price: int, busy: bool, hostile: str | None,
              i: int) -> Callable[[Bus], SimulatedProvider]:
        config = ProviderConfig(price_wei=price, work_dir=spec.work_dir / account.address, slots=1, worker_threads=1,
                                tasks=TaskPolicy(accepts="any"), sandbox=None, warm_start=False,
                                cache_bytes=64 << 20, heartbeat_interval_s=spec.heartbeat_s,
                                offer_refresh_s=spec.offer_refresh_s)

        def make(bus: Bus) -> SimulatedProvider:
            kind = HOSTILE[hostile] if hostile is not None else SimulatedProvider
            provider = kind(account, bus, store, config, hardware=sim_hardware(index + i), chain=chain)
            provider.marked_busy = busy
            return provider
        return make

    accounts = [Account.from_key(key) for key in spec.keys]
    started = time.monotonic()
    providers: list[SimulatedProvider] = []
    async with contextlib.AsyncExitStack() as exits:
        failed = None
        try:
            # One exit stack: every provider leaves (clearing its offer) before its bus closes.
            providers = list(await asyncio.gather(*(
                _serve(maker(a, price, busy, hostile, i), a, spec.bus, exits, gate)
                for i, (a, price, busy, hostile) in enumerate(zip(accounts, spec.prices_wei, spec.busy,
                                                                   spec.hostile)))))
        except (AitbcError, OSError) as exc:
            failed = f"providers failed to start: {exc}"
        report.put({"fleet": index, "up": failed is None, "error": failed, "providers": len(accounts),
                    "connect_s": time.monotonic() - started})
        while not stop.is_set():
            if ask.is_set() and not answered:
                report.put({"fleet": index, "stats": True, "jobs": sum(p.completed_jobs for p in providers),
                            "dispatch_s": [d for p in providers for d in p.dispatch_s],
                            "dropped": dict(sum((p.dropped for p in providers), Counter()))})
                answered = True
            await asyncio.sleep(0.2)
    with contextlib.suppress(Exception):
        await w3.provider.disconnect()
    report.put({"fleet": index, "done": True})


def fleet_main(spec: FleetSpec, index: int, report: mp.Queue, stop: MpEvent, ask: MpEvent) -> None:
    raise_open_files()
    torch.set_num_threads(1)  # jobs run in threads of this process; each takes one core at most
    logging.basicConfig(level=logging.ERROR)
    asyncio.run(run_fleet(spec, index, report, stop, ask))
