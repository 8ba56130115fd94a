"""The SDK calls ``aitbc cluster`` makes: unlock the wallet, connect to the cluster's broker, and run
the host agent, a job, a mount, the monitor or an inventory (the commands parse, these run)."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console

from aitbc_agent_sdk.cluster import ClusterConfigError
from aitbc_agent_sdk.records import terminal_markup

from .cluster_render import event_printer
from .common import PasswordSource, unlock

if TYPE_CHECKING:
    from aitbc_agent_sdk.cluster import HostAgentConfig
    from aitbc_agent_sdk.cluster import ClusterInventory
    from aitbc_agent_sdk.cluster import TrainRequest, TrainResult
    from aitbc_agent_sdk.cluster import ClusterMonitor, RowSink
    from aitbc_agent_sdk.cluster import ClusterMountReport, MountCommand
    from aitbc_agent_sdk.cluster import ClusterSpec, HostSpec
    from aitbc_agent_sdk.messaging import MqttBus


async def serve_host(root: Path, spec: ClusterSpec, wallet: str, config: HostAgentConfig,
                     password: PasswordSource) -> None:
    from aitbc_agent_sdk.cluster import ClusterAgent
    from aitbc_agent_sdk.messaging import SignedChannel
    from aitbc_agent_sdk.profile import load_profile

    broker = spec.bus or load_profile(root).bus
    account, _ = await unlock(root, wallet, password)
    if spec.host(account.address) is None:
        raise ClusterConfigError(f"wallet {wallet} ({account.address}) is not a host of cluster {spec.name}")
    main = asyncio.current_task()
    assert main is not None
    # SIGTERM ends the agent like Ctrl-C does: its job stopped, its mounts undone.
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
    async with cluster_bus(root, spec, "aitbc-cluster-host", account.address) as bus:
        async with ClusterAgent(SignedChannel(bus, account), spec, config=config, broker_host=broker.host) as agent:
            Console(stderr=True).print(
                f"serving cluster {spec.name} as {agent.name} ({account.address}) at {agent.network_address}; "
                f"torchrun {'sandboxed' if agent.config.sandbox else 'not sandboxed'}; "
                f"work dir {agent.config.work_root}", highlight=False)
            await agent.serve_forever()


async def run_train(root: Path, spec: ClusterSpec, wallet: str, request: TrainRequest, job_dir: Path, out: Console,
                 verbose: bool, host_timeout: float, password: PasswordSource) -> TrainResult:
    from aitbc_agent_sdk.audit import AuditLog
    from aitbc_agent_sdk.cluster import TrainingCoordinator
    from aitbc_agent_sdk.messaging import SignedChannel

    account, _ = await unlock(root, wallet, password)
    if spec.coordinators and account.address.lower() not in {a.lower() for a in spec.coordinators}:
        raise ClusterConfigError(f"wallet {wallet} ({account.address}) is not a coordinator of cluster {spec.name}")
    async with cluster_bus(root, spec, "aitbc-cluster-train") as bus:
        coordinator = TrainingCoordinator(
            SignedChannel(bus, account), spec, audit=AuditLog(job_dir / "audit.jsonl"),
            events_log=job_dir / "events.jsonl", on_event=event_printer(out, verbose=verbose),
            host_timeout_s=host_timeout,
            on_notice=lambda text: out.print(f"[bold magenta]coordinator[/] {terminal_markup(text)}"))
        return await coordinator.run(request)


async def run_mount(root: Path, spec: ClusterSpec, wallet: str, members: list[HostSpec], command: MountCommand,
                 timeout: float, password: PasswordSource) -> ClusterMountReport:
    from aitbc_agent_sdk.audit import AuditLog
    from aitbc_agent_sdk.cluster import TrainingCoordinator
    from aitbc_agent_sdk.messaging import SignedChannel

    account, _ = await unlock(root, wallet, password)
    async with cluster_bus(root, spec, "aitbc-cluster-mount") as bus:
        audit = AuditLog(root / "clusters" / "mounts" / f"{spec.name}.audit.jsonl")
        coordinator = TrainingCoordinator(SignedChannel(bus, account), spec, audit=audit)
        return await coordinator.mount(members, command, timeout=timeout)


async def watch_cluster(root: Path, spec: ClusterSpec, job: str | None, seconds: float | None,
                   on_metric: RowSink | None) -> ClusterMonitor:
    """Listen for SECONDS (None: until Ctrl-C) with a throw-away identity: monitoring only listens."""
    from eth_account import Account

    from aitbc_agent_sdk.cluster import ClusterMonitor
    from aitbc_agent_sdk.messaging import SignedChannel

    async with cluster_bus(root, spec, "aitbc-cluster-monitor") as bus:
        watcher = ClusterMonitor(SignedChannel(bus, Account.create()), spec, job=job, on_metric=on_metric)
        ready = None if on_metric is None else (lambda: Console(stderr=True).print(
            f"following cluster {spec.name}: metrics signed by its hosts (Ctrl-C stops)", highlight=False))
        await watcher.watch(seconds, on_ready=ready)
    return watcher


def cluster_bus(root: Path, spec: ClusterSpec, prefix: str, identity: str | None = None) -> MqttBus:
    from aitbc_agent_sdk.messaging import connect_bus
    from aitbc_agent_sdk.profile import load_profile

    settings = spec.bus or load_profile(root).bus  # its accounts and TLS too, when it is the devnet's
    return connect_bus(settings, f"{prefix}-{time.time_ns()}", identity=identity, persistent=False)


async def collect(root: Path, spec: ClusterSpec, wallet: str | None, timeout: float,
                  password: PasswordSource) -> ClusterInventory:
    from eth_account import Account

    from aitbc_agent_sdk.cluster import collect_inventory
    from aitbc_agent_sdk.messaging import SignedChannel

    if wallet is not None:
        account, _ = await unlock(root, wallet, password)
    elif spec.coordinators:
        raise ClusterConfigError(f"cluster {spec.name} answers only its coordinators: pass --wallet")
    else:
        account = Account.create()  # a throw-away identity: these hosts answer any signed requester
    async with cluster_bus(root, spec, "aitbc-cluster-inventory") as bus:
        return await collect_inventory(SignedChannel(bus, account), spec, timeout=timeout)
