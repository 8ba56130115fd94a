"""``aitbc cluster``: define a trusted cluster, inventory its hardware, serve as a host, train with torchrun,
mount shared datasets, and monitor the ranks. The commands parse; :mod:`.cluster_run` makes the SDK calls
(:mod:`aitbc_agent_sdk.cluster`) and :mod:`.cluster_render` draws the tables."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer
from rich.console import Console

from aitbc_agent_sdk.cluster import ClusterConfigError
from aitbc_agent_sdk.cluster import inventory_html
from aitbc_agent_sdk.cluster import ClusterSpec, HostSpec, list_clusters, load_cluster, save_cluster
from aitbc_agent_sdk.cluster import DEFAULT_TIMEOUT_S
from aitbc_agent_sdk.records import id_path
from aitbc_agent_sdk.records import terminal_markup
from aitbc_agent_sdk.profile import BusSettings

from .cluster_options import (
    CheckpointDirOption, CheckpointEveryOption, ClusterName, ClusterOption, CoordinatorWallet, DatasetOption,
    HostsOption, MaxRestartsOption, MinHostsOption, NoSandboxOption, NprocOption, ScriptArgs, ScriptOption,
    VerboseOption, seconds_option,
)
from .cluster_render import metric_text, render_inventory, render_monitor, render_mount, render_train
from .cluster_run import collect, run_mount, run_train, serve_host, watch_cluster
from .common import (
    ExitCode, HomeOption, IpfsApiOption, JsonOption, PasswordFileOption, PasswordSource, print_json, resolve_home,
)
from .params import broker_parts, parse_broker

if TYPE_CHECKING:
    from aitbc_agent_sdk.cluster import MetricRow

app = typer.Typer(help="Trusted multi-host clusters: members, hardware inventory, training, shared datasets.",
                  no_args_is_help=True)


# --- members and hardware ---------------------------------------------------------------------

@app.command("create")
def create(
    name: Annotated[str, typer.Argument(help="cluster name")],
    host: Annotated[list[str], typer.Option("--host", help="NAME=ADDRESS of a member host's signing key; repeat")],
    coordinator: Annotated[Optional[list[str]], typer.Option(
        "--coordinator", help="address allowed to query the hosts; repeat (none: any signed requester)")] = None,
    broker: Annotated[Optional[str], typer.Option(
        "--broker", parser=parse_broker, metavar="ADDR",
        help="MQTT broker: HOST:PORT, mqtt://HOST:PORT or mqtts://HOST:PORT (default: the devnet profile's)")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Write the cluster's allow-list to $AITBC_HOME/clusters/NAME.json.

    Example: aitbc cluster create lab --host gpu-a=0xA1... --host gpu-b=0xB2... --coordinator 0xC3...
    """
    hosts = []
    for item in host:
        host_name, sep, address = item.partition("=")
        if not sep:
            raise typer.BadParameter(f"takes NAME=ADDRESS, got {item!r}", param_hint="--host")
        hosts.append(HostSpec(name=host_name.strip(), address=address.strip()))
    bus = None
    if broker is not None:
        broker_host, port, tls = broker_parts(broker)
        bus = BusSettings(host=broker_host, port=port, tls=tls)
    spec = ClusterSpec(name=name, hosts=tuple(hosts), coordinators=tuple(coordinator or ()), bus=bus)
    path = save_cluster(resolve_home(home), spec)
    if as_json:
        print_json({"cluster": spec.model_dump(mode="json"), "path": str(path)})
    else:
        Console().print(f"cluster [bold]{name}[/] with {len(hosts)} hosts written to {path}")


@app.command("list")
def list_(home: HomeOption = None, as_json: JsonOption = False) -> None:
    """The clusters defined under $AITBC_HOME/clusters.

    Example: aitbc cluster list --json
    """
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
    timeout: Annotated[float, seconds_option("seconds to wait for each host")] = DEFAULT_TIMEOUT_S,
    html: Annotated[Optional[Path], typer.Option("--html", help="also write a self-contained HTML report")] = None,
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Every host's GPUs, CPUs and memory; CPU-only hosts are marked, silent hosts listed as unreachable.

    Without --cluster this host alone is reported (through the same request/answer path).

    Example: aitbc cluster inventory --cluster lab --wallet coord --html lab.html
    """
    root = resolve_home(home)
    if cluster is None:
        from aitbc_agent_sdk.cluster import local_inventory

        result = asyncio.run(local_inventory(timeout=timeout))
    else:
        spec = load_cluster(root, cluster)
        result = asyncio.run(collect(root, spec, wallet, timeout, PasswordSource(password_file, not as_json)))
    if html is not None:
        html.write_text(inventory_html(result))
    if as_json:
        print_json(result.model_dump(mode="json"))
        return
    render_inventory(Console(), result)
    if html is not None:
        Console().print(f"HTML report written to {html}")


# --- serving as a host ------------------------------------------------------------------------

@app.command("serve")
def serve(
    cluster: Annotated[str, typer.Option("--cluster", help="cluster this host belongs to")],
    wallet: Annotated[str, typer.Option(help="this host's wallet; its address must be listed in the cluster")],
    work_dir: Annotated[Optional[Path], typer.Option(
        "--work-dir",
        help="local job directory, status and audit log (default: $TMPDIR/aitbc-cluster/CLUSTER)")] = None,
    no_sandbox: Annotated[bool, typer.Option(
        "--no-sandbox", help="run torchrun without the sandbox (still in its own pid namespace)")] = False,
    network_address: Annotated[Optional[str], typer.Option(
        "--network-address", help="this host's address for the rendezvous (default: the spec's, else the "
                                  "address that reaches the broker)")] = None,
    s3_credentials: Annotated[Optional[Path], typer.Option(
        "--s3-credentials", help="s3fs passwd file (ACCESS:SECRET, mode 600) for 'cluster mount --s3'")] = None,
    ipfs_api: IpfsApiOption = None,
    no_install: Annotated[bool, typer.Option(
        "--no-install", help="never apt-get install a missing mount client")] = False,
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
) -> None:
    """Serve the cluster as this host, in the foreground (Ctrl-C stops): inventory, preflight, torchrun, mounts.

    Control requests are taken only from the cluster's coordinators (aitbc cluster create --coordinator).

    Example: aitbc cluster serve --cluster lab --wallet gpu-a
    """
    import tempfile

    from aitbc_agent_sdk.cluster import HostAgentConfig
    from aitbc_agent_sdk.cluster import MountSettings

    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    config = HostAgentConfig(
        work_root=work_dir or Path(tempfile.gettempdir()) / "aitbc-cluster" / cluster, sandbox=not no_sandbox,
        network_address=network_address,
        mounts=MountSettings(s3_credentials_file=s3_credentials, ipfs_api=ipfs_api,
                             install_missing=not no_install))
    try:
        asyncio.run(serve_host(root, spec, wallet, config, PasswordSource(password_file)))
    except (KeyboardInterrupt, asyncio.CancelledError):
        pass


# --- training ---------------------------------------------------------------------------------

@app.command("train")
def train(
    script: ScriptOption,
    cluster: ClusterName,
    wallet: CoordinatorWallet,
    args: ScriptArgs = None,
    hosts: HostsOption = 1,
    nproc_per_node: NprocOption = "auto",
    min_hosts: MinHostsOption = None,
    max_restarts: MaxRestartsOption = 3,
    checkpoint_dir: CheckpointDirOption = None,
    checkpoint_every: CheckpointEveryOption = None,
    dataset: DatasetOption = None,
    no_sandbox: NoSandboxOption = False,
    rendezvous_timeout: Annotated[float, seconds_option("seconds from launch to a formed rendezvous")] = 300.0,
    timeout: Annotated[Optional[float], seconds_option("seconds for the whole job (default: no limit)")] = None,
    host_timeout: Annotated[float, seconds_option(
        "seconds without a word from a host's agent before it counts as failed")] = 20.0,
    verbose: VerboseOption = False,
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Run SCRIPT with torchrun on --hosts hosts of the cluster; streams the ranks' logs and metrics.

    The most capable hosts are used (GPUs first), the first of them as master; the rest are
    spares that take a crashed host's slot. Exit 0 when the job finished, 1 when it failed,
    2 for bad input or a failed preflight.

    Example: aitbc cluster train --cluster lab --wallet coord --hosts 3 --script /srv/train_ddp.py -- data.pt 30
    """
    # Long because: typer declares every option in the signature; the body is some 30 lines.
    from aitbc_agent_sdk.cluster import TrainRequest
    from aitbc_agent_sdk.cluster import new_job_id

    if min_hosts is not None and min_hosts > hosts:
        raise typer.BadParameter(f"must be between 1 and --hosts ({hosts}), got {min_hosts}", param_hint="--min-hosts")
    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    if hosts > len(spec.hosts):
        raise ClusterConfigError(f"--hosts {hosts}: cluster {cluster} has only {len(spec.hosts)} hosts")
    job_id = new_job_id(cluster)
    request = TrainRequest(hosts=hosts, script=script.absolute(), script_args=tuple(args or ()),
                           nproc_per_node=nproc_per_node, min_hosts=min_hosts, max_restarts=max_restarts,
                           checkpoint_dir=checkpoint_dir.absolute() if checkpoint_dir else None,
                           checkpoint_every=checkpoint_every, datasets=tuple(Path(d).absolute() for d in dataset or ()),
                           sandbox=not no_sandbox, job_id=job_id, rendezvous_timeout_s=rendezvous_timeout,
                           timeout_s=timeout)
    job_dir = id_path(root / "clusters" / "jobs", job_id)
    job_dir.mkdir(parents=True, exist_ok=True)
    out = Console(stderr=as_json, highlight=False)
    try:
        result = asyncio.run(run_train(root, spec, wallet, request, job_dir, out, verbose, host_timeout,
                                           PasswordSource(password_file, not as_json)))
    except KeyboardInterrupt:
        Console(stderr=True).print(f"interrupted: job {job_id} stopped on every host (audit log "
                                   f"{job_dir / 'audit.jsonl'})")
        raise typer.Exit(ExitCode.INTERRUPTED) from None
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        render_train(out, result)
    if not result.ok:
        raise typer.Exit(ExitCode.FAILED)


# --- shared datasets --------------------------------------------------------------------------

@app.command("mount")
def mount(
    mountpoint: Annotated[Path, typer.Option("--mountpoint", help="where the dataset appears on every host")],
    cluster: ClusterName,
    wallet: CoordinatorWallet,
    nfs: Annotated[Optional[str], typer.Option("--nfs", help="SERVER:/path of an NFS export")] = None,
    s3: Annotated[Optional[str], typer.Option("--s3", help="S3 bucket, mounted with s3fs")] = None,
    ipfs: Annotated[Optional[str], typer.Option("--ipfs", help="IPFS CID, fetched and verified on every host")] = None,
    endpoint: Annotated[Optional[str], typer.Option(
        "--endpoint", help="S3 endpoint URL (--s3), or Kubo API URL (--ipfs)")] = None,
    host: Annotated[Optional[list[str]], typer.Option("--host", help="only these hosts; repeat (default: all)")] = None,
    no_write_check: Annotated[bool, typer.Option("--no-write-check", help="check read access only")] = False,
    measure_bytes: Annotated[int, typer.Option(
        "--measure-bytes", min=0, max=1 << 30, help="size of the throughput probe in bytes (0: none)")] = 4 << 20,
    timeout: Annotated[float, seconds_option("seconds to wait for each host (installs included)")] = 600.0,
    home: HomeOption = None,
    password_file: PasswordFileOption = None,
    as_json: JsonOption = False,
) -> None:
    """Mount a shared dataset on every host and check it: read/write, same content (hash manifest), speed.

    Exit 0 when every host has it with the same manifest, 1 otherwise, 2 for bad input.

    Example: aitbc cluster mount --cluster lab --wallet coord --ipfs bafy... --mountpoint /mnt/data
    """
    from aitbc_agent_sdk.cluster import MountCommand

    chosen = [(k, v) for k, v in (("nfs", nfs), ("s3", s3), ("ipfs", ipfs)) if v is not None]
    if len(chosen) != 1:
        raise typer.BadParameter("give exactly one of --nfs SERVER:/path, --s3 BUCKET, --ipfs CID")
    if not mountpoint.is_absolute():
        raise typer.BadParameter(f"must be an absolute path, got {mountpoint}", param_hint="--mountpoint")
    source, target = chosen[0]
    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    members = [h for h in spec.hosts if not host or h.name in host]
    unknown = set(host or ()) - {h.name for h in spec.hosts}
    if unknown:
        raise ClusterConfigError(f"no host {', '.join(sorted(unknown))} in cluster {cluster}")
    command = MountCommand(source=source, target=target, endpoint=endpoint, mountpoint=str(mountpoint),
                           check_write=not no_write_check, measure_bytes=measure_bytes)
    report = asyncio.run(run_mount(root, spec, wallet, members, command, timeout,
                                  PasswordSource(password_file, not as_json)))
    if as_json:
        print_json(report.model_dump(mode="json"))
    else:
        render_mount(Console(highlight=False), report)
    if not report.ok:
        raise typer.Exit(ExitCode.FAILED)


# --- monitoring -------------------------------------------------------------------------------

@app.command("monitor")
def monitor(
    cluster: ClusterName,
    follow: Annotated[bool, typer.Option(
        "--follow", "-f", help="print each metric as it arrives (Ctrl-C stops)")] = False,
    job: Annotated[Optional[str], typer.Option("--job", help="only this job")] = None,
    wait: Annotated[float, seconds_option("seconds to gather the hosts' current status")] = 3.0,
    timeout: Annotated[Optional[float], seconds_option("with --follow: stop after this many seconds")] = None,
    home: HomeOption = None,
    as_json: JsonOption = False,
) -> None:
    """Per-rank (per-GPU) metrics of the cluster's running jobs: memory used, utilization, samples/s.

    Only messages signed by the cluster's hosts are shown. On CPU-only hosts memory budgets come
    from configuration and are labelled so.

    Example: aitbc cluster monitor --cluster lab --follow --json
    """
    root = resolve_home(home)
    spec = load_cluster(root, cluster)
    console = Console(highlight=False)

    def on_metric(row: MetricRow) -> None:
        if as_json:
            print_json(row)
        else:
            console.print(terminal_markup(f"{row['host']} {row['job']} {metric_text(row)}"))

    try:
        watched = asyncio.run(watch_cluster(root, spec, job, timeout if follow else wait,
                                            on_metric if follow else None))
    except KeyboardInterrupt:
        return
    if follow:
        return
    if as_json:
        print_json({"cluster": spec.name, "ranks": watched.rows()})
    else:
        render_monitor(console, spec.name, watched.latest)
