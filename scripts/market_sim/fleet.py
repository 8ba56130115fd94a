"""Simulated providers, many to a process: each is the SDK's own ProviderAgent on the real broker and chain.

Each provider has its own key, broker account and MQTT session, with a last will that clears its offer.
It serves the market as a provider daemon does (``provider.SimulatedProvider``: only its training slot
differs). A provider marked busy heartbeats as one at work does, for the liveness phase.

Churn comes as commands on the fleet's own queue, one provider each: ``leave`` (an idle provider shuts
down cleanly: its offer is cleared, its session closed), ``crash`` (one with a job, when there is one,
dies without a word: the broker's will clears its offer) and ``join`` (a provider from the reserve,
registered at set-up, connects and advertises). What happened is part of the fleet's stats report.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import functools
import multiprocessing as mp
import os
import queue
import random
import resource
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
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
FLEET_NICENESS = 10
CRASH_WAIT_S = 10.0  # a crash waits this long for a provider holding a job
CHURN_EVENT_S = 60.0  # one churn event at most (a crash waits 10 s for a job, and 5 s for its close)


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
    reserve: tuple[str, ...] = ()  # keys of providers that join during the run: registered, not connected
    reserve_prices_wei: tuple[int, ...] = ()
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
                 gate: asyncio.Semaphore) -> tuple[SimulatedProvider, contextlib.AsyncExitStack]:
    """One provider up, with its own exit stack: it leaves (clearing its offer) before its bus closes."""
    async with gate:
        exits = contextlib.AsyncExitStack()
        try:
            bus = connect_bus(settings, f"sim-{account.address}", identity=account.address, persistent=False,
                              keepalive=KEEPALIVE_S, timeout=120.0, will=LastWill(topics.offer(account.address)))
            await exits.enter_async_context(bus)
            provider = await exits.enter_async_context(make(bus))
        except BaseException:
            await exits.aclose()
            raise
        return provider, exits


async def _churn_one(kind: str, members: dict[str, tuple[SimulatedProvider, contextlib.AsyncExitStack]],
                     joiners: list[Callable[[], Awaitable[tuple[SimulatedProvider, contextlib.AsyncExitStack]]]],
                     ) -> dict[str, Any]:
    """One churn event; returns what happened (the provider, and whether it held a job)."""
    honest = [a for a, (p, _) in members.items() if type(p) is SimulatedProvider and not p.marked_busy]
    if kind == "join":
        if not joiners:
            return {"kind": kind, "skipped": "the reserve is used up", "at": time.time()}
        provider, exits = await joiners.pop()()
        members[provider.address] = (provider, exits)
        return {"kind": kind, "provider": provider.address, "at": time.time()}
    if kind == "crash":  # mid-job when a provider has a job within a few seconds: the case that matters
        deadline = time.monotonic() + CRASH_WAIT_S
        while not (pool := [a for a in honest if members[a][0].mid_job]) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            honest = [a for a in honest if a in members]
        pool = pool or honest
    else:  # a provider shutting down cleanly picks a moment without a job
        pool = [a for a in honest if not members[a][0].at_work] or honest
    if not pool:
        return {"kind": kind, "skipped": "no honest provider left", "at": time.time()}
    address = random.choice(pool)
    provider, exits = members.pop(address)
    mid_job = provider.mid_job
    if kind == "crash":
        await provider.crash()
    else:
        await exits.aclose()
    return {"kind": kind, "provider": address, "mid_job": mid_job, "at": time.time()}


async def run_fleet(spec: FleetSpec, index: int, report: mp.Queue, stop: MpEvent, ask: MpEvent,
                    commands: mp.Queue | None = None) -> None:
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
    joiners = [functools.partial(_serve, maker(Account.from_key(key), price, False, None, len(accounts) + j),
                                 Account.from_key(key), spec.bus, gate)
               for j, (key, price) in enumerate(zip(spec.reserve, spec.reserve_prices_wei))]
    started = time.monotonic()
    members: dict[str, tuple[SimulatedProvider, contextlib.AsyncExitStack]] = {}
    gone: list[SimulatedProvider] = []  # left or crashed: their jobs and dispatch times still count
    churned: list[dict[str, Any]] = []
    failed = None
    try:
        outcomes = await asyncio.gather(*(
            _serve(maker(a, price, busy, hostile, i), a, spec.bus, gate)
            for i, (a, price, busy, hostile) in enumerate(zip(accounts, spec.prices_wei, spec.busy, spec.hostile))),
            return_exceptions=True)
        for outcome in outcomes:
            if isinstance(outcome, BaseException):
                failed = failed or f"providers failed to start: {outcome!r}"
            else:
                members[outcome[0].address] = outcome
        report.put({"fleet": index, "up": failed is None, "error": failed, "providers": len(accounts),
                    "connect_s": time.monotonic() - started})
        while not stop.is_set():
            while commands is not None and not commands.empty():
                with contextlib.suppress(queue.Empty):
                    kind = commands.get_nowait()
                    if kind == "rest":  # the liveness phase is over: the providers marked busy go idle
                        for provider, _ in members.values():
                            provider.marked_busy = False
                        continue
                    before = {a: p for a, (p, _) in members.items()}
                    try:  # bounded: a churn event that hangs must not keep the fleet from its stats
                        churned.append(await asyncio.wait_for(_churn_one(kind, members, joiners), CHURN_EVENT_S))
                    except (AitbcError, OSError, TimeoutError) as exc:
                        churned.append({"kind": kind, "error": repr(exc) or "timed out", "at": time.time()})
                    gone += [p for a, p in before.items() if a not in members]
            if ask.is_set() and not answered:
                everyone = [p for p, _ in members.values()] + gone
                report.put({"fleet": index, "stats": True, "jobs": sum(p.completed_jobs for p in everyone),
                            "dispatch_s": [d for p in everyone for d in p.dispatch_s],
                            "dropped": dict(sum((p.dropped for p in everyone), Counter())), "churn": churned,
                            "advertising": sum(1 for p, _ in members.values() if not p.hides_offer)})
                answered = True
            await asyncio.sleep(0.2)
    finally:
        # Every provider leaves, clearing its offer; then its bus closes.
        await asyncio.gather(*(exits.aclose() for _, exits in members.values()), return_exceptions=True)
        with contextlib.suppress(Exception):
            await w3.provider.disconnect()
    report.put({"fleet": index, "done": True})


def fleet_main(spec: FleetSpec, index: int, report: mp.Queue, stop: MpEvent, ask: MpEvent,
               commands: mp.Queue | None = None) -> None:
    raise_open_files()
    # The simulated providers would each have a machine of their own: here they yield the cores to the
    # coordinator, the broker and the chain, whose costs are what the simulation measures.
    os.nice(FLEET_NICENESS)
    torch.set_num_threads(1)  # jobs run in threads of this process; each takes one core at most
    logging.basicConfig(level=logging.ERROR)
    random.seed(index)  # which provider churns: the same in every run
    asyncio.run(run_fleet(spec, index, report, stop, ask, commands))
