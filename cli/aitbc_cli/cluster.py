"""``aitbc cluster``: define a trusted cluster, inventory its hardware, serve as a host, train with torchrun,
mount shared datasets, and monitor the ranks."""

from __future__ import annotations

import asyncio
import signal
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from aitbc_agent_sdk.cluster.errors import ClusterError
from aitbc_agent_sdk.cluster.inventory import ClusterInventory
from aitbc_agent_sdk.cluster.report import gib, host_status, inventory_html
from aitbc_agent_sdk.cluster.spec import ClusterSpec, HostSpec, list_clusters, load_cluster, save_cluster
from aitbc_agent_sdk.cluster.transport import DEFAULT_TIMEOUT_S
from aitbc_agent_sdk.models import id_path
from aitbc_agent_sdk.profile import BusSettings

from .common import HomeOption, JsonOption, print_json, resolve_home, unlock

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc_agent_sdk.messaging.mqtt import MqttBus

app = typer.Typer(help="Trusted multi-host clusters: members, hardware inventory, training, shared datasets.",
                  no_args_is_help=True)

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
    work_dir: Annotated[Optional[Path], typer.Option(
        "--work-dir", help="local job directory, status and audit log [default: $TMPDIR/aitbc-cluster/CLUSTER]")] = None,
    no_sandbox: Annotated[bool, typer.Option(
        "--no-sandbox", help="run torchrun without the sandbox (still in its own pid namespace)")] = False,
    network_address: Annotated[Optional[str], typer.Option(
        "--network-address", help="this host's address for the rendezvous [default: the spec's, else the "
                                  "address that reaches the broker]")] = None,
    s3_credentials: Annotated[Optional[Path], typer.Option(
        "--s3-credentials", help="s3fs passwd file (ACCESS:SECRET, mode 600) for 'cluster mount --s3'")] = None,
    ipfs_api: Annotated[Optional[str], typer.Option(
        "--ipfs-api", help="Kubo RPC API URL for 'cluster mount --ipfs' [default: $AITBC_IPFS_API]")] = None,
    no_install: Annotated[bool, typer.Option(
        "--no-install", help="never apt-get install a missing mount client")] = False,
    home: HomeOption = None,
) -> None:
    """Serve the cluster as this host, in the foreground (Ctrl-C stops): inventory, preflight, torchrun, mounts.

    Control requests are taken only from the cluster's coordinators (aitbc cluster create --coordinator).
    """
    import os
    import tempfile

    from aitbc_agent_sdk.cluster.agent import AgentConfig, ClusterAgent
    from aitbc_agent_sdk.cluster.mounts import MountSettings
    from aitbc_agent_sdk.messaging.channel import SignedChannel
    from aitbc_agent_sdk.profile import load_profile

    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    broker = spec.bus or load_profile(root).bus
    config = AgentConfig(
        work_root=work_dir or Path(tempfile.gettempdir()) / "aitbc-cluster" / cluster, sandbox=not no_sandbox,
        network_address=network_address,
        mounts=MountSettings(s3_credentials_file=s3_credentials, ipfs_api=ipfs_api or os.environ.get("AITBC_IPFS_API"),
                             install_missing=not no_install))

    async def run() -> None:
        account, _ = await unlock(root, wallet)
        if spec.host(account.address) is None:
            raise ClusterError(f"wallet {wallet} ({account.address}) is not a host of cluster {cluster}")
        main = asyncio.current_task()
        assert main is not None
        # SIGTERM ends the agent like Ctrl-C does: its job stopped, its mounts undone.
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, main.cancel)
        async with _bus(root, spec, "aitbc-cluster-host", account.address) as bus:
            async with ClusterAgent(SignedChannel(bus, account), spec, config=config, broker_host=broker.host) as agent:
                Console(stderr=True).print(
                    f"serving cluster {cluster} as {agent.name} ({account.address}) at {agent.network_address}; "
                    f"torchrun {'sandboxed' if config.sandbox else 'not sandboxed'}; work dir {config.work_root}",
                    highlight=False)
                await agent.serve_forever()

    try:
        asyncio.run(run())
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass


def _nproc(value: str) -> int | str:
    if value == "auto":
        return value
    if not value.isdigit() or int(value) < 1:
        raise ClusterError(f"--nproc-per-node takes 'auto' or a positive integer, got {value!r}")
    return int(value)


@app.command("train")
def train(
    script: Annotated[Path, typer.Option("--script", help="training script, at the same path on every host")],
    args: Annotated[Optional[list[str]], typer.Argument(help="arguments for the script (after --)")] = None,
    cluster: Annotated[str, typer.Option("--cluster", help="cluster name")] = "",
    wallet: Annotated[str, typer.Option(help="the coordinator's wallet (listed with --coordinator)")] = "",
    hosts: Annotated[int, typer.Option("--hosts", help="how many hosts to train on")] = 1,
    nproc_per_node: Annotated[str, typer.Option(
        "--nproc-per-node", help="ranks per host: 'auto' (one per GPU, 1 on CPU) or N")] = "auto",
    min_hosts: Annotated[Optional[int], typer.Option(
        "--min-hosts", help="elastic: keep training while this many hosts remain [default: --hosts]")] = None,
    max_restarts: Annotated[int, typer.Option("--max-restarts", help="torchrun worker-group restarts")] = 3,
    checkpoint_dir: Annotated[Optional[Path], typer.Option(
        "--checkpoint-dir", help="shared directory for checkpoints; the job's working directory on every host")] = None,
    checkpoint_every: Annotated[Optional[int], typer.Option(
        "--checkpoint-every", help="steps between checkpoints (CHECKPOINT_EVERY for the script)")] = None,
    dataset: Annotated[Optional[list[str]], typer.Option(
        "--dataset", help="path every host must be able to read (checked before launch); repeat")] = None,
    no_sandbox: Annotated[bool, typer.Option("--no-sandbox", help="ask hosts to run torchrun unsandboxed")] = False,
    rendezvous_timeout: Annotated[float, typer.Option(
        "--rendezvous-timeout", help="seconds from launch to a formed rendezvous")] = 300.0,
    timeout: Annotated[Optional[float], typer.Option("--timeout", help="seconds for the whole job")] = None,
    host_timeout: Annotated[float, typer.Option(
        "--host-timeout", help="seconds without a word from a host's agent before it counts as failed")] = 20.0,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="also show torchrun's INFO lines")] = False,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run SCRIPT with torchrun on --hosts hosts of the cluster; streams the ranks' logs and metrics.

    The most capable hosts are used (GPUs first), the first of them as master; the rest are
    spares that take a crashed host's slot. Exit 0 when the job finished, 1 when it failed,
    2 for bad input or a failed preflight.
    """
    from aitbc_agent_sdk.cluster.launch import TrainRequest, new_job_id

    if not cluster:
        raise ClusterError("--cluster is required")
    if not wallet:
        raise ClusterError("--wallet is required: hosts take launches only from the cluster's coordinators")
    if hosts < 1:
        raise ClusterError(f"--hosts must be at least 1, got {hosts}")
    if min_hosts is not None and not 1 <= min_hosts <= hosts:
        raise ClusterError(f"--min-hosts must be between 1 and --hosts ({hosts}), got {min_hosts}")
    if max_restarts < 0:
        raise ClusterError(f"--max-restarts must be >= 0, got {max_restarts}")
    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    if hosts > len(spec.hosts):
        raise ClusterError(f"--hosts {hosts}: cluster {cluster} has only {len(spec.hosts)} hosts")
    job_id = new_job_id(cluster)
    request = TrainRequest(hosts=hosts, script=script.absolute(), script_args=tuple(args or ()),
                           nproc_per_node=_nproc(nproc_per_node), min_hosts=min_hosts, max_restarts=max_restarts,
                           checkpoint_dir=checkpoint_dir.absolute() if checkpoint_dir else None,
                           checkpoint_every=checkpoint_every, datasets=tuple(Path(d).absolute() for d in dataset or ()),
                           sandbox=not no_sandbox, job_id=job_id, rendezvous_timeout_s=rendezvous_timeout,
                           timeout_s=timeout)
    job_dir = id_path(root / "clusters" / "jobs", job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    out = Console(stderr=as_json, highlight=False)
    if host_timeout <= 0:
        raise ClusterError(f"--host-timeout must be positive, got {host_timeout}")
    try:
        result = asyncio.run(_train(root, spec, wallet, request, job_dir, out, verbose, host_timeout))
    except KeyboardInterrupt:
        Console(stderr=True).print(f"interrupted: job {job_id} stopped on every host (audit log "
                                   f"{job_dir / 'audit.jsonl'})")
        raise typer.Exit(130) from None
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        _render_train(out, result)
    if not result.ok:
        raise typer.Exit(1)


async def _train(root: Path, spec: ClusterSpec, wallet: str, request: object, job_dir: Path, out: Console,
                 verbose: bool, host_timeout: float) -> object:
    from aitbc_agent_sdk.cluster.launch import JobEvent, TrainingCoordinator, is_torchrun_line
    from aitbc_agent_sdk.audit import AuditLog
    from aitbc_agent_sdk.messaging.channel import SignedChannel

    account, _ = await unlock(root, wallet)
    if spec.coordinators and account.address.lower() not in {a.lower() for a in spec.coordinators}:
        raise ClusterError(f"wallet {wallet} ({account.address}) is not a coordinator of cluster {spec.name}")

    def on_event(event: JobEvent) -> None:
        if event.kind == "log":
            for line in event.lines:
                if verbose or not (is_torchrun_line(line) and line.startswith("I")):
                    out.print(f"[dim]{event.host}[/] {escape(line)}")
        elif event.kind == "metric" and event.metric is not None:
            out.print(f"[cyan]{event.host}[/] {escape(_metric_text(event.metric))}")
        elif event.kind == "state" and event.state == "exited":
            out.print(f"[bold]{event.host}[/] torchrun {event.reason}")

    async with _bus(root, spec, "aitbc-cluster-train") as bus:
        coordinator = TrainingCoordinator(
            SignedChannel(bus, account), spec, audit=AuditLog(job_dir / "audit.jsonl"),
            events_log=job_dir / "events.jsonl", on_event=on_event, host_timeout_s=host_timeout,
            on_notice=lambda text: out.print(f"[bold magenta]coordinator[/] {escape(text)}"))
        return await coordinator.run(request)  # type: ignore[arg-type]


def _metric_text(m: dict) -> str:
    event = str(m.get("event", "metric"))
    head = f"rank {m.get('rank', '?')} " + (f"step {m['step']}" if event == "step" and "step" in m else event)
    parts = []
    if m.get("loss") is not None:
        parts.append(f"loss {m['loss']:.4f}")
    if m.get("samples_per_s") is not None:
        parts.append(f"{m['samples_per_s']:.1f} samples/s")
    if m.get("batch_size") is not None:
        parts.append(f"batch {m['batch_size']}")
    if m.get("memory_used_bytes") is not None:
        parts.append(f"mem {m['memory_used_bytes'] / 2**20:.0f} MiB ({m.get('memory_source', '?')})")
    if m.get("memory_budget_bytes") is not None:
        source = m.get("budget_source", "?")
        parts.append(f"budget {m['memory_budget_bytes'] / 2**20:.0f} MiB "
                     f"({'from configuration, CPU-only' if source == 'config' else source})")
    if m.get("utilization") is not None:
        parts.append(f"util {m['utilization']:.0f}%")
    if event == "resume":
        parts.append(f"from step {m.get('resumed_from', 0)}")
    elif event == "checkpoint":
        parts.append(f"saved at step {m.get('step')}")
    elif event == "oom":
        parts.append(f"out of memory on rank(s) {m.get('ranks')} at step {m.get('step')}: batch sizes "
                     f"{m.get('before')} -> {m.get('after')}" + (" (simulated)" if m.get("simulated") else ""))
    return head + (": " + ", ".join(parts) if parts else "")


def _render_train(console: Console, result: object) -> None:
    r = result  # TrainResult
    table = Table(title=f"job {r.job_id}: {'[green]finished[/]' if r.ok else '[red]failed[/]'}")
    for col in ("host", "role", "node rank", "state", "exit"):
        table.add_column(col)
    for h in r.hosts.values():
        table.add_row(h.name, h.role, "" if h.group_rank is None else str(h.group_rank), h.state,
                      "" if h.returncode is None else str(h.returncode))
    console.print(table)
    console.print(f"rendezvous {r.master_addr}:{r.port} on {r.master}; world size {r.world_size_confirmed} "
                  f"(expected {r.world_size_expected}); {r.duration_s:.1f}s")
    if r.failures:
        console.print("failures: " + "; ".join(f"{f['host']}: {f['reason']}" for f in r.failures))
    if r.spares_used:
        console.print("spares used: " + ", ".join(r.spares_used))
    if r.continuity is not None:
        c = r.continuity
        console.print(f"checkpoint continuity: {'ok' if c['ok'] else 'BROKEN'} ({c['effective_steps']} steps over "
                      f"{len(c['attempts'])} attempts, {c['rolled_back_steps']} rolled back)"
                      + ("" if c["ok"] else ": " + "; ".join(c["problems"])))
    if r.error:
        console.print(f"[red]error:[/] {escape(r.error)}")
    console.print(f"audit log {r.audit_log}; events {r.events_log}")


@app.command("mount")
def mount(
    mountpoint: Annotated[Path, typer.Option("--mountpoint", help="where the dataset appears on every host")],
    cluster: Annotated[str, typer.Option("--cluster", help="cluster name")] = "",
    wallet: Annotated[str, typer.Option(help="the coordinator's wallet")] = "",
    nfs: Annotated[Optional[str], typer.Option("--nfs", help="SERVER:/path of an NFS export")] = None,
    s3: Annotated[Optional[str], typer.Option("--s3", help="S3 bucket, mounted with s3fs")] = None,
    ipfs: Annotated[Optional[str], typer.Option("--ipfs", help="IPFS CID, fetched and verified on every host")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        "--endpoint", help="S3 endpoint URL (--s3), or Kubo API URL (--ipfs)")] = None,
    host: Annotated[Optional[list[str]], typer.Option("--host", help="only these hosts; repeat [default: all]")] = None,
    no_write_check: Annotated[bool, typer.Option("--no-write-check", help="check read access only")] = False,
    measure_bytes: Annotated[int, typer.Option("--measure-bytes", help="size of the throughput probe")] = 4 << 20,
    timeout: Annotated[float, typer.Option(help="seconds to wait for each host (installs included)")] = 600.0,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mount a shared dataset on every host and check it: read/write, same content (hash manifest), speed.

    Exit 0 when every host has it with the same manifest, 1 otherwise, 2 for bad input.
    """
    from aitbc_agent_sdk.cluster.mounts import MountCommand

    chosen = [(k, v) for k, v in (("nfs", nfs), ("s3", s3), ("ipfs", ipfs)) if v is not None]
    if len(chosen) != 1:
        raise ClusterError("give exactly one of --nfs SERVER:/path, --s3 BUCKET, --ipfs CID")
    if not cluster or not wallet:
        raise ClusterError("--cluster and --wallet are required")
    if not mountpoint.is_absolute():
        raise ClusterError(f"--mountpoint must be an absolute path, got {mountpoint}")
    source, target = chosen[0]
    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    members = [h for h in spec.hosts if not host or h.name in host]
    unknown = set(host or ()) - {h.name for h in spec.hosts}
    if unknown:
        raise ClusterError(f"no host {', '.join(sorted(unknown))} in cluster {cluster}")
    command = MountCommand(source=source, target=target, endpoint=endpoint, mountpoint=str(mountpoint),
                           check_write=not no_write_check, measure_bytes=measure_bytes)
    report = asyncio.run(_mount(root, spec, wallet, members, command, timeout))
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        _render_mount(Console(highlight=False), report)
    if not report.ok:
        raise typer.Exit(1)


async def _mount(root: Path, spec: ClusterSpec, wallet: str, members: list[HostSpec], command: object,
                 timeout: float) -> object:
    from aitbc_agent_sdk.cluster.launch import TrainingCoordinator
    from aitbc_agent_sdk.cluster.mounts import MountReport, summarize_mounts
    from aitbc_agent_sdk.audit import AuditLog
    from aitbc_agent_sdk.messaging.channel import SignedChannel

    account, _ = await unlock(root, wallet)
    async with _bus(root, spec, "aitbc-cluster-mount") as bus:
        audit = AuditLog(root / "clusters" / "mounts" / f"{spec.name}.audit.jsonl")
        coordinator = TrainingCoordinator(SignedChannel(bus, account), spec, audit=audit)
        replies = await asyncio.gather(*(coordinator.request(h, command, timeout=timeout) for h in members))
    reports, errors = {}, {}
    for h, reply in zip(members, replies):
        if reply.data.get("host"):
            reports[h.name] = MountReport.model_validate(reply.data)
        else:
            errors[h.name] = reply.error or "no report"
    summary = summarize_mounts(command, reports, errors)  # type: ignore[arg-type]
    await audit.append("mount", source=summary.source, target=summary.target, mountpoint=summary.mountpoint,
                       ok=summary.ok, digest=summary.comparison.digest, agreeing=list(summary.comparison.agreeing),
                       errors=summary.errors)
    return summary


def _render_mount(console: Console, s: object) -> None:
    table = Table(title=f"{s.source} {s.target} at {s.mountpoint}: {'[green]ok[/]' if s.ok else '[red]not ok[/]'}")
    for col in ("host", "method", "mounted", "read", "write", "files", "manifest", "latency", "write MB/s",
                "read MB/s"):
        table.add_column(col)
    for name, r in sorted(s.hosts.items()):
        io, acc, man = r.io, r.access, r.manifest
        fmt = lambda v, f="{:.1f}": "n/a" if v is None else f.format(v)  # noqa: E731
        table.add_row(name, r.method, "yes" if r.mounted else "[red]no[/]",
                      fmt(acc and acc.readable, "{}"), fmt(acc and acc.writable, "{}"),
                      fmt(man and man.count, "{}"), man.digest[:12] if man else "n/a",
                      fmt(io and io.latency_ms, "{:.2f} ms"), fmt(io and io.write_mb_s), fmt(io and io.read_mb_s))
    console.print(table)
    c = s.comparison
    console.print(f"same dataset on {', '.join(c.agreeing) or 'no host'} (digest {c.digest[:16] if c.digest else '-'})")
    for name, diff in c.differences.items():
        console.print(f"[red]{name} differs:[/] " + "; ".join(f"{k}: {', '.join(v[:5])}" for k, v in diff.items() if v))
    for name, r in sorted(s.hosts.items()):
        for p in r.problems:
            console.print(f"[red]{name}:[/] {escape(p)}")
        for n in (*r.notes, *(r.io.notes if r.io else ())):
            console.print(f"[dim]{name}: {escape(n)}[/]")
    for name, e in s.errors.items():
        console.print(f"[red]{name}: no report:[/] {escape(e)}")


@app.command("monitor")
def monitor(
    cluster: Annotated[str, typer.Option("--cluster", help="cluster name")],
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="print each metric as it arrives (Ctrl-C stops)")] = False,
    job: Annotated[Optional[str], typer.Option("--job", help="only this job")] = None,
    wait: Annotated[float, typer.Option(help="seconds to gather the hosts' current status")] = 3.0,
    timeout: Annotated[Optional[float], typer.Option(help="with --follow: stop after this many seconds")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per-rank (per-GPU) metrics of the cluster's running jobs: memory used, utilization, samples/s.

    Only messages signed by the cluster's hosts are shown. On CPU-only hosts memory budgets come
    from configuration and are labelled so.
    """
    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    try:
        asyncio.run(_monitor(root, spec, follow=follow, job=job, wait=wait, timeout=timeout, as_json=as_json))
    except KeyboardInterrupt:
        pass


async def _monitor(root: Path, spec: ClusterSpec, *, follow: bool, job: str | None, wait: float,
                   timeout: float | None, as_json: bool) -> None:
    from eth_account import Account

    from aitbc_agent_sdk.cluster.launch import HostStatus, JobEvent, events_filter, status_filter
    from aitbc_agent_sdk.messaging.channel import SignedChannel

    hosts = {h.address.lower(): h.name for h in spec.hosts}
    console = Console(highlight=False)
    latest: dict[tuple[str, str], dict] = {}
    async with _bus(root, spec, "aitbc-cluster-monitor") as bus:
        channel = SignedChannel(bus, Account.create())  # listens only
        async with channel.subscribe(status_filter(spec.name), HostStatus) as statuses, \
                channel.subscribe(events_filter(spec.name, job or "+"), JobEvent) as events:
            async def read_status() -> None:
                async for s in statuses:
                    name = hosts.get(s.sender.lower())
                    if name is None or (job and s.message.job_id != job):
                        continue
                    for rank, metric in s.message.ranks.items():
                        latest[(name, rank)] = {**metric, "host": name, "job": s.message.job_id,
                                                "state": s.message.state}
                    for g in s.message.gpus:
                        latest[(name, f"gpu{g.get('index')}")] = {"host": name, "job": s.message.job_id,
                                                                  "gpu": g, "state": s.message.state}

            async def read_events() -> None:
                async for e in events:
                    name = hosts.get(e.sender.lower())
                    if name is None or e.message.kind != "metric" or e.message.metric is None:
                        continue
                    row = {**e.message.metric, "host": name, "job": e.message.job_id}
                    latest[(name, str(row.get("rank")))] = row
                    if follow:
                        if as_json:
                            print_json(row)
                        else:
                            console.print(f"{name} {e.message.job_id} {_metric_text(row)}")

            tasks = [asyncio.create_task(read_status()), asyncio.create_task(read_events())]
            try:
                await asyncio.sleep(timeout if follow and timeout is not None else (1e9 if follow else wait))
            finally:
                for t in tasks:
                    t.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)
    if follow:
        return
    if as_json:
        rows = sorted(latest.values(), key=lambda r: (r["host"], str(r.get("rank"))))
        print_json({"cluster": spec.name, "ranks": rows})
        return
    if not latest:
        console.print(f"no running job reports on cluster {spec.name}")
        return
    table = Table(title=f"cluster {spec.name}: latest metrics")
    for col in ("host", "job", "rank/GPU", "step", "loss", "samples/s", "memory used", "budget", "util"):
        table.add_column(col)
    for (name, key), row in sorted(latest.items()):
        gpu = row.get("gpu")
        if gpu:
            table.add_row(name, row.get("job") or "", f"GPU {gpu.get('index')} {gpu.get('model', '')}", "", "", "",
                          f"{(gpu['memory_total_bytes'] - gpu['memory_free_bytes']) / 2**20:.0f} MiB (nvml)", "",
                          "n/a" if gpu.get("utilization_percent") is None else f"{gpu['utilization_percent']:.0f}%")
            continue
        budget = row.get("memory_budget_bytes")
        table.add_row(name, row.get("job") or "", str(row.get("rank", "")), str(row.get("step", "")),
                      "" if row.get("loss") is None else f"{row['loss']:.4f}",
                      "" if row.get("samples_per_s") is None else f"{row['samples_per_s']:.1f}",
                      "" if row.get("memory_used_bytes") is None else
                      f"{row['memory_used_bytes'] / 2**20:.0f} MiB ({row.get('memory_source', '?')})",
                      "" if budget is None else f"{budget / 2**20:.0f} MiB ("
                      + ("config, CPU-only" if row.get("budget_source") == "config" else str(row.get("budget_source")))
                      + ")",
                      "n/a" if row.get("utilization") is None else f"{row['utilization']:.0f}%")
    console.print(table)


def _bus(root: Path, spec: ClusterSpec, prefix: str, identity: str | None = None) -> MqttBus:
    from aitbc_agent_sdk.messaging.settings import connect_bus
    from aitbc_agent_sdk.profile import load_profile

    settings = spec.bus or load_profile(root).bus  # its accounts and TLS too, when it is the devnet's
    return connect_bus(settings, f"{prefix}-{time.time_ns()}", identity=identity, persistent=False)


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
