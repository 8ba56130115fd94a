"""``aitbc cluster``: define a trusted cluster, ask every host what hardware it has, answer as a host."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.cluster.errors import ClusterError
from aitbc_agent_sdk.cluster.inventory import ClusterInventory
from aitbc_agent_sdk.cluster.report import gib, host_status, inventory_html
from aitbc_agent_sdk.cluster.spec import ClusterSpec, HostSpec, list_clusters, load_cluster, save_cluster
from aitbc_agent_sdk.cluster.transport import DEFAULT_TIMEOUT_S
from aitbc_agent_sdk.profile import BusSettings

from .common import HomeOption, JsonOption, print_json, resolve_home, unlock

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc_agent_sdk.messaging.mqtt import MqttBus

app = typer.Typer(help="Trusted multi-host clusters: members, hardware inventory.", no_args_is_help=True)

ClusterOption = Annotated[Optional[str], typer.Option("--cluster", help="cluster name ($AITBC_HOME/clusters/NAME.json)")]


@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="cluster name")],
    host: Annotated[list[str], typer.Option("--host", help="NAME=ADDRESS of a member host's signing key; repeat")],
    coordinator: Annotated[Optional[list[str]], typer.Option(
        "--coordinator", help="address allowed to query the hosts; repeat (none: any signed requester)")] = None,
    broker: Annotated[Optional[str], typer.Option(
        help="MQTT broker HOST:PORT (default: the devnet profile's)")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the cluster's allow-list to $AITBC_HOME/clusters/NAME.json."""
    hosts = []
    for item in host:
        host_name, sep, address = item.partition("=")
        if not sep:
            raise ClusterError(f"--host takes NAME=ADDRESS, got {item!r}")
        hosts.append(HostSpec(name=host_name.strip(), address=address.strip()))
    bus = None
    if broker is not None:
        broker_host, _, port = broker.rpartition(":")
        if not broker_host or not port.isdigit():
            raise ClusterError(f"--broker takes HOST:PORT, got {broker!r}")
        bus = BusSettings(host=broker_host, port=int(port))
    spec = ClusterSpec(name=name, hosts=tuple(hosts), coordinators=tuple(coordinator or ()), bus=bus)
    path = save_cluster(resolve_home(home), spec)
    if as_json:
        print_json({"cluster": spec.model_dump(mode="json"), "path": str(path)})
    else:
        Console().print(f"cluster [bold]{name}[/] with {len(hosts)} hosts written to {path}")


@app.command("list")
def list_(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The clusters defined under $AITBC_HOME/clusters."""
    names = list_clusters(resolve_home(home))
    if as_json:
        print_json({"clusters": names})
    else:
        Console().print("\n".join(names) or "no clusters defined (aitbc cluster create)")


@app.command("inventory")
def inventory(
    cluster: ClusterOption = None,
    wallet: Annotated[Optional[str], typer.Option(
        help="wallet to sign requests with (needed when the cluster lists coordinators)")] = None,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each host")] = DEFAULT_TIMEOUT_S,
    html: Annotated[Optional[Path], typer.Option("--html", help="also write a self-contained HTML report")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every host's GPUs, CPUs and memory; CPU-only hosts are marked, silent hosts listed as unreachable.

    Without --cluster this host alone is reported (through the same request/answer path).
    """
    root = resolve_home(home)
    if cluster is None:
        from aitbc_agent_sdk.cluster.transport import local_inventory

        result = asyncio.run(local_inventory(timeout=timeout))
    else:
        spec = load_cluster(root, cluster)
        result = asyncio.run(_collect(root, spec, wallet, timeout))
    if html is not None:
        html.write_text(inventory_html(result))
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    _render(Console(), result)
    if html is not None:
        Console().print(f"HTML report written to {html}")


@app.command("serve")
def serve(
    cluster: Annotated[str, typer.Option("--cluster", help="cluster this host belongs to")],
    wallet: Annotated[str, typer.Option(help="this host's wallet; its address must be listed in the cluster")],
    home: HomeOption = None,
) -> None:
    """Answer the cluster's inventory requests as this host, in the foreground (Ctrl-C stops)."""
    from aitbc_agent_sdk.cluster.transport import InventoryResponder
    from aitbc_agent_sdk.messaging.channel import SignedChannel

    root = resolve_home(home)
    spec = load_cluster(root, cluster)

    async def run() -> None:
        account, _ = await unlock(root, wallet)
        if spec.host(account.address) is None:
            raise ClusterError(f"wallet {wallet} ({account.address}) is not a host of cluster {cluster}")
        async with _bus(root, spec, "aitbc-cluster-host") as bus:
            async with InventoryResponder.for_spec(SignedChannel(bus, account), spec):
                Console(stderr=True).print(f"answering inventory requests of cluster {cluster} as "
                                           f"{spec.host(account.address).name} ({account.address})")  # type: ignore[union-attr]
                await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


def _bus(root: Path, spec: ClusterSpec, prefix: str) -> MqttBus:
    from aitbc_agent_sdk.messaging.mqtt import MqttBus
    from aitbc_agent_sdk.profile import load_profile

    settings = spec.bus or load_profile(root).bus
    return MqttBus(settings.host, settings.port, client_id=f"{prefix}-{time.time_ns()}", persistent=False)


async def _collect(root: Path, spec: ClusterSpec, wallet: str | None, timeout: float) -> ClusterInventory:
    from eth_account import Account

    from aitbc_agent_sdk.cluster.transport import collect_inventory
    from aitbc_agent_sdk.messaging.channel import SignedChannel

    account: LocalAccount
    if wallet is not None:
        account, _ = await unlock(root, wallet)
    elif spec.coordinators:
        raise ClusterError(f"cluster {spec.name} answers only its coordinators: pass --wallet")
    else:
        account = Account.create()  # a throw-away identity: these hosts answer any signed requester
    async with _bus(root, spec, "aitbc-cluster-inventory") as bus:
        return await collect_inventory(SignedChannel(bus, account), spec, timeout=timeout)


def _render(console: Console, inv: ClusterInventory) -> None:
    table = Table(title=f"cluster {inv.cluster}: {len(inv.hosts)} hosts")
    for col in ("host", "status", "CPU, RAM avail/total", "GPU", "GPU mem free/total", "util", "driver/CUDA"):
        table.add_column(col)
    notes = []
    for h in inv.hosts:
        label = {"unreachable": "[red]unreachable[/]", "cpu-only": "[yellow]CPU only (fallback)[/]",
                 "gpu": "[green]GPU[/]"}[host_status(h)]
        if not h.reachable:
            table.add_row(h.name, label, "", "", "", "", "")
            notes.append(f"{h.name}: {h.error or 'no answer'}")
            continue
        cpu = f"{h.cpu_cores} cores, {gib(h.ram_available_bytes)} / {gib(h.ram_total_bytes)}"
        if not h.gpus:
            table.add_row(h.name, label, cpu, "none", "", "", "")
            notes.append(f"{h.name}: GPU probe {h.gpu_probe}")
        for n, g in enumerate(h.gpus):
            first = n == 0
            util = "n/a" if g.utilization_percent is None else f"{g.utilization_percent:.0f}%"
            table.add_row(h.name if first else "", label if first else "", cpu if first else "",
                          f"{g.index}: {g.model}", f"{gib(g.memory_free_bytes)} / {gib(g.memory_total_bytes)}", util,
                          f"{g.driver_version or '?'} / {g.cuda_version or '?'}")
    console.print(table)
    for note in notes:
        console.print(f"  {note}", highlight=False)
    summary = Table(title="summary", show_header=False)
    summary.add_column()
    summary.add_column()
    for key, value in (
        ("reachable", ", ".join(inv.reachable_hosts) or "none"),
        ("unreachable", ", ".join(inv.unreachable_hosts) or "none"),
        ("CPU-only (fallback)", ", ".join(inv.cpu_only_hosts) or "none"),
        ("GPUs", f"{inv.gpu_count} ({', '.join(f'{n}x {m}' for m, n in inv.gpu_models.items()) or 'none'})"),
        ("GPU memory free/total", f"{gib(inv.gpu_memory_free_bytes)} / {gib(inv.gpu_memory_total_bytes)}"),
    ):
        summary.add_row(key, value)
    console.print(summary)
