"""The provider daemon process: one ProviderAgent on the devnet's servers until told to stop.

``python -m aitbc_agent_sdk.flow._provider_daemon --wallet W --price-wei N`` reads the wallet
password from its first line of stdin, so it never appears in argv or the environment.
Jobs train in the bwrap sandbox (:mod:`aitbc_agent_sdk.provider._sandbox`); without a working
bwrap the daemon refuses to start unless given ``--no-sandbox``.

It wires a provider to the bus, store and chain that :mod:`aitbc_agent_sdk._stack` opens, so it
lives above the services layer, beside the coordinator daemon (:mod:`._daemon`).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable
from contextlib import AsyncExitStack
from pathlib import Path

from eth_account.signers.local import LocalAccount

from ..chain import EscrowClient, TransactionSender, WalletStore, connect_rpc
from ..chain._registry import RegistryClient
from ..config import AgentConfig, default_home
from ..messaging import LastWill, topics
from ..records import TaskPolicy, parse_size
from ..profile import Profile, load_profile
from ..provider._cache import DEFAULT_CACHE_BYTES
from ..provider._hardware import detect_hardware
from ..provider._node import ProviderAgent, ProviderConfig
from ..provider._onchain import ProviderChain
from ..provider._sandbox import TrainingSandbox
from .._stack import open_bus, open_store, register_provider

STATUS_FILE = "status.json"

# Builds the provider from ProviderAgent's constructor arguments; a subclass changes its behaviour.
AgentFactory = Callable[..., ProviderAgent]


def provider_dir(home: Path, address: str) -> Path:
    return home / "providers" / address


async def ensure_registered(profile: Profile, account: LocalAccount, provider: ProviderAgent, stake_wei: int) -> None:
    """Bond the provider in the registry unless it already is (a restart keeps its bond)."""
    w3 = await connect_rpc(profile.chain.rpc_url)
    registry = RegistryClient(w3, await EscrowClient(w3, profile.chain.escrow).registry())
    if not (await registry.provider(account.address)).registered:
        sender = TransactionSender(w3, account, confirmations=profile.chain.confirmations)
        await register_provider(registry, sender, provider, stake_wei)
        logging.info("registered %s with a bond of %d wei", account.address, stake_wei)


async def open_provider_chain(profile: Profile, exits: AsyncExitStack) -> ProviderChain:
    """The escrow every contract is checked against before the provider works for it."""
    w3 = await connect_rpc(profile.chain.rpc_url)
    exits.push_async_callback(w3.provider.disconnect)
    return await ProviderChain.connect(w3, profile.chain.escrow, confirmations=profile.chain.confirmations)


async def serve_provider(home: Path, account: LocalAccount, *, price_wei: int, slots: int | None = None,
                         gpu: str = "auto", stake_wei: int | None = None, stop: asyncio.Event,
                         agent_factory: AgentFactory = ProviderAgent,
                         sandbox: TrainingSandbox | None = TrainingSandbox(), threads: int | None = None,
                         tasks: TaskPolicy = TaskPolicy(), cache_dir: Path | None = None,
                         cache_bytes: int | None = None, max_unreceipted_rounds: int | None = None,
                         kept_bytes: int | None = None) -> None:
    """Serve until ``stop``; ``sandbox=None`` trains unconfined (``--no-sandbox``), and says so.
    ``slots=None``: one per GPU (1 on a CPU host); ``threads=None``: the cores shared among the slots;
    ``cache_dir=None``: the content cache is under the provider's directory; ``cache_bytes=None``: 20 GiB;
    ``max_unreceipted_rounds=None`` and ``kept_bytes=None``: :class:`ProviderConfig`'s defaults."""
    profile = load_profile(home)
    work_dir = provider_dir(home, account.address)
    hardware = await asyncio.to_thread(detect_hardware)
    if gpu == "none":
        hardware = hardware.model_copy(update={"gpus": ()})
    async with AsyncExitStack() as exits:
        # A stable client id gives the provider a persistent session: jobs sent while it
        # was reconnecting are delivered when it is back.
        # Presence is the retained offer: if this daemon dies, the broker clears it (the will).
        bus = await open_bus(profile, f"provider-{account.address}", exits, identity=account.address, home=home,
                             will=LastWill(topics.offer(account.address)))
        store = await open_store(profile, AgentConfig(home=home), exits)
        if sandbox is None:
            logging.warning("--no-sandbox: jobs from strangers train unconfined, as this user")
        elif cache_dir is not None:  # other trainings' shards: a job sees its own, linked into its in/
            sandbox = sandbox.model_copy(update={"hidden_paths": (*sandbox.hidden_paths, cache_dir.resolve())})
        chain = await open_provider_chain(profile, exits)
        config = ProviderConfig(price_wei=price_wei, slots=slots, work_dir=work_dir, sandbox=sandbox,
                                worker_threads=threads, tasks=tasks, cache_dir=cache_dir,
                                cache_bytes=DEFAULT_CACHE_BYTES if cache_bytes is None else cache_bytes,
                                **({} if max_unreceipted_rounds is None
                                   else {"max_unreceipted_rounds": max_unreceipted_rounds}),
                                **({} if kept_bytes is None else {"kept_bytes": kept_bytes}))
        provider = agent_factory(account, bus, store, config,
                                 hardware=hardware, chain=chain)
        if stake_wei:
            await ensure_registered(profile, account, provider, stake_wei)
        async with provider:
            logging.info("provider %s serving at %s wei per round", account.address, price_wei)
            while not stop.is_set():
                write_status(work_dir, provider)
                try:
                    await asyncio.wait_for(stop.wait(), 1.0)
                except TimeoutError:
                    pass
            write_status(work_dir, provider, running=False)


def write_status(work_dir: Path, provider: ProviderAgent, *, running: bool = True) -> None:
    status = {"address": provider.address, "pid": os.getpid(), "running": running, "updated_at": time.time(),
              "price_wei": provider.config.price_wei, "hardware": provider.hardware.model_dump(mode="json") if provider.hardware else None,
              "completed_jobs": provider.completed_jobs,
              "jobs": [p.model_dump(mode="json") for p in provider.jobs.values()]}
    work_dir.mkdir(parents=True, exist_ok=True)
    tmp = work_dir / (STATUS_FILE + ".tmp")
    tmp.write_text(json.dumps(status, indent=1))
    os.replace(tmp, work_dir / STATUS_FILE)


async def run_daemon(args: argparse.Namespace, agent_factory: Callable[..., ProviderAgent] = ProviderAgent) -> None:
    """Unlock the wallet (password on stdin) and serve until SIGTERM or SIGINT."""
    password = sys.stdin.readline().rstrip("\n")
    account = await WalletStore(args.home / "wallets").unlock(args.wallet, password)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await serve_provider(args.home, account, price_wei=args.price_wei, slots=args.slots, gpu=args.gpu,
                         stake_wei=args.stake_wei, stop=stop, agent_factory=agent_factory,
                         sandbox=None if args.no_sandbox else TrainingSandbox(hidden_paths=(args.home,)),
                         threads=args.threads, tasks=TaskPolicy(accepts=args.tasks, allowed=tuple(args.allow_task)),
                         cache_dir=args.cache_dir, cache_bytes=args.cache_size,
                         max_unreceipted_rounds=args.max_unreceipted_rounds, kept_bytes=args.kept_size)


def build_parser(description: str = "aitbc provider daemon (reads the wallet password from stdin)"
                 ) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--home", type=Path, default=default_home())
    parser.add_argument("--wallet", required=True)
    parser.add_argument("--price-wei", type=int, required=True)
    parser.add_argument("--slots", type=int, default=None, help="jobs at once (default: one per GPU, 1 on a CPU)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads per slot (default: cores/slots)")
    parser.add_argument("--tasks", choices=("builtin", "allow-list", "any"), default="builtin",
                        help="which tasks to run: built-ins only, built-ins and --allow-task CIDs, or any (sandboxed)")
    parser.add_argument("--allow-task", action="append", default=[], metavar="CID", help="a task CID to run")
    parser.add_argument("--gpu", choices=("auto", "none"), default="auto")
    parser.add_argument("--stake-wei", type=int, default=None, help="register with this bond if not registered")
    parser.add_argument("--cache-dir", type=Path, default=None,
                        help="where fetched shards and weights are kept (default: the provider's directory/cache)")
    parser.add_argument("--cache-size", type=parse_size, default=None, metavar="SIZE",
                        help="the most the cache keeps (default 20GiB; least recently used content goes first)")
    parser.add_argument("--kept-size", type=parse_size, default=None, metavar="SIZE",
                        help="the most delivered results and boundary states kept for re-sends and spot checks "
                             "(default 32GiB; past it the oldest job of the heaviest training goes first)")
    parser.add_argument("--max-unreceipted-rounds", type=int, default=None, metavar="N",
                        help="stop working for a coordinator once N delivered rounds lack its payment receipt "
                             "(default 2; 0: never stop)")
    parser.add_argument("--no-sandbox", action="store_true",
                        help="train jobs without the bwrap sandbox (they can then read this user's files)")
    return parser


def main() -> None:
    args = build_parser().parse_args()
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(run_daemon(args))


if __name__ == "__main__":
    main()
