"""Rendering for ``aitbc cluster``: inventory, train, mount and monitor tables, and the lines a
running job prints. Pure formatting: records in, rich output out."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from aitbc_agent_sdk.cluster import ClusterInventory
from aitbc_agent_sdk.cluster import gib, host_status
from aitbc_agent_sdk.records import terminal_markup as literal  # hosts' words, shown as written

if TYPE_CHECKING:
    from aitbc_agent_sdk.cluster import TrainResult
    from aitbc_agent_sdk.cluster import ClusterMountReport
    from aitbc_agent_sdk.cluster import JobEvent


def event_printer(out: Console, *, verbose: bool) -> Callable[[JobEvent], None]:
    """What ``cluster train`` prints of each host event: logs (torchrun's INFO lines only when verbose),
    metric lines, and each torchrun's exit."""
    from aitbc_agent_sdk.cluster import is_torchrun_line

    def on_event(event: JobEvent) -> None:
        if event.kind == "log":
            for line in event.lines:
                if verbose or not (is_torchrun_line(line) and line.startswith("I")):
                    out.print(f"[dim]{literal(event.host)}[/] {literal(line)}")
        elif event.kind == "metric" and event.metric is not None:
            out.print(f"[cyan]{literal(event.host)}[/] {literal(metric_text(event.metric))}")
        elif event.kind == "state" and event.state == "exited":
            out.print(f"[bold]{literal(event.host)}[/] torchrun {literal(event.reason)}")

    return on_event


def metric_text(m: dict[str, Any]) -> str:
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



def render_train(console: Console, r: TrainResult) -> None:
    table = Table(title=f"job {literal(r.job_id)}: {'[green]finished[/]' if r.ok else '[red]failed[/]'}")
    for col in ("host", "role", "node rank", "state", "exit"):
        table.add_column(col)
    for h in r.hosts.values():
        table.add_row(literal(h.name), literal(h.role), "" if h.group_rank is None else str(h.group_rank),
                      literal(h.state),
                      "" if h.returncode is None else str(h.returncode))
    console.print(table)
    console.print(f"rendezvous {literal(r.master_addr)}:{r.port} on {literal(r.master)}; "
                  f"world size {r.world_size_confirmed} "
                  f"(expected {r.world_size_expected}); {r.duration_s:.1f}s")
    if r.failures:
        console.print("failures: " + "; ".join(f"{literal(f['host'])}: {literal(f['reason'])}" for f in r.failures))
    if r.spares_used:
        console.print("spares used: " + ", ".join(map(literal, r.spares_used)))
    if r.continuity is not None:
        c = r.continuity
        console.print(f"checkpoint continuity: {'ok' if c['ok'] else 'BROKEN'} ({c['effective_steps']} steps over "
                      f"{len(c['attempts'])} attempts, {c['rolled_back_steps']} rolled back)"
                      + ("" if c["ok"] else ": " + "; ".join(map(literal, c["problems"]))))
    if r.error:
        console.print(f"[red]error:[/] {literal(r.error)}")
    console.print(f"audit log {literal(r.audit_log)}; events {literal(r.events_log)}")


def render_mount(console: Console, s: ClusterMountReport) -> None:
    table = Table(title=f"{literal(s.source)} {literal(s.target)} at {literal(s.mountpoint)}: "
                        f"{'[green]ok[/]' if s.ok else '[red]not ok[/]'}")
    for col in ("host", "method", "mounted", "read", "write", "files", "manifest", "latency", "write MB/s",
                "read MB/s"):
        table.add_column(col)
    for name, r in sorted(s.hosts.items()):
        io, acc, man = r.io, r.access, r.manifest
        fmt = lambda v, f="{:.1f}": "n/a" if v is None else f.format(v)  # noqa: E731
        table.add_row(literal(name), literal(r.method), "yes" if r.mounted else "[red]no[/]",
                      fmt(acc and acc.readable, "{}"), fmt(acc and acc.writable, "{}"),
                      fmt(man and man.count, "{}"), literal(man.digest[:12]) if man else "n/a",
                      fmt(io and io.latency_ms, "{:.2f} ms"), fmt(io and io.write_mb_s), fmt(io and io.read_mb_s))
    console.print(table)
    c = s.comparison
    console.print(f"same dataset on {literal(', '.join(c.agreeing) or 'no host')} "
                  f"(digest {literal(c.digest[:16]) if c.digest else '-'})")
    for name, diff in c.differences.items():
        console.print(f"[red]{literal(name)} differs:[/] "
                      + "; ".join(f"{literal(k)}: {literal(', '.join(v[:5]))}" for k, v in diff.items() if v))
    for name, r in sorted(s.hosts.items()):
        for p in r.problems:
            console.print(f"[red]{literal(name)}:[/] {literal(p)}")
        for n in (*r.notes, *(r.io.notes if r.io else ())):
            console.print(f"[dim]{literal(name)}: {literal(n)}[/]")
    for name, e in s.errors.items():
        console.print(f"[red]{literal(name)}: no report:[/] {literal(e)}")


def render_monitor(console: Console, cluster: str, latest: dict[tuple[str, str], dict[str, Any]]) -> None:
    """The latest row per rank and per GPU (``ClusterMonitor.latest``)."""
    if not latest:
        console.print(f"no running job reports on cluster {literal(cluster)}")
        return
    table = Table(title=f"cluster {literal(cluster)}: latest metrics")
    for col in ("host", "job", "rank/GPU", "step", "loss", "samples/s", "memory used", "budget", "util"):
        table.add_column(col)
    for (name, key), row in sorted(latest.items()):
        gpu = row.get("gpu")
        if gpu:
            table.add_row(literal(name), literal(row.get("job") or ""),
                          literal(f"GPU {gpu.get('index')} {gpu.get('model', '')}"), "", "", "",
                          f"{(gpu['memory_total_bytes'] - gpu['memory_free_bytes']) / 2**20:.0f} MiB (nvml)", "",
                          "n/a" if gpu.get("utilization_percent") is None else f"{gpu['utilization_percent']:.0f}%")
            continue
        budget = row.get("memory_budget_bytes")
        table.add_row(literal(name), literal(row.get("job") or ""), literal(row.get("rank", "")),
                      literal(row.get("step", "")),
                      "" if row.get("loss") is None else f"{row['loss']:.4f}",
                      "" if row.get("samples_per_s") is None else f"{row['samples_per_s']:.1f}",
                      "" if row.get("memory_used_bytes") is None else
                      f"{row['memory_used_bytes'] / 2**20:.0f} MiB ({literal(row.get('memory_source', '?'))})",
                      "" if budget is None else f"{budget / 2**20:.0f} MiB ("
                      + ("config, CPU-only" if row.get("budget_source") == "config"
                         else literal(row.get("budget_source")))
                      + ")",
                      "n/a" if row.get("utilization") is None else f"{row['utilization']:.0f}%")
    console.print(table)


def render_inventory(console: Console, inv: ClusterInventory) -> None:
    table = Table(title=f"cluster {literal(inv.cluster)}: {len(inv.hosts)} hosts")
    for col in ("host", "status", "CPU, RAM avail/total", "GPU", "GPU mem free/total", "util", "driver/CUDA"):
        table.add_column(col)
    notes = []
    for h in inv.hosts:
        label = {"unreachable": "[red]unreachable[/]", "cpu-only": "[yellow]CPU only (fallback)[/]",
                 "gpu": "[green]GPU[/]"}[host_status(h)]
        if not h.reachable:
            table.add_row(literal(h.name), label, "", "", "", "", "")
            notes.append(f"{literal(h.name)}: {literal(h.error or 'no answer')}")
            continue
        cpu = f"{h.cpu_cores} cores, {gib(h.ram_available_bytes)} / {gib(h.ram_total_bytes)}"
        if not h.gpus:
            table.add_row(literal(h.name), label, cpu, "none", "", "", "")
            notes.append(f"{literal(h.name)}: GPU probe {literal(h.gpu_probe)}")
        for n, g in enumerate(h.gpus):
            first = n == 0
            util = "n/a" if g.utilization_percent is None else f"{g.utilization_percent:.0f}%"
            table.add_row(literal(h.name) if first else "", label if first else "", cpu if first else "",
                          literal(f"{g.index}: {g.model}"), f"{gib(g.memory_free_bytes)} / {gib(g.memory_total_bytes)}",
                          util, literal(f"{g.driver_version or '?'} / {g.cuda_version or '?'}"))
    console.print(table)
    for note in notes:
        console.print(f"  {note}", highlight=False)
    summary = Table(title="summary", show_header=False)
    summary.add_column()
    summary.add_column()
    for key, value in (
        ("reachable", literal(", ".join(inv.reachable_hosts) or "none")),
        ("unreachable", literal(", ".join(inv.unreachable_hosts) or "none")),
        ("CPU-only (fallback)", literal(", ".join(inv.cpu_only_hosts) or "none")),
        ("GPUs", literal(f"{inv.gpu_count} ({', '.join(f'{n}x {m}' for m, n in inv.gpu_models.items()) or 'none'})")),
        ("GPU memory free/total", f"{gib(inv.gpu_memory_free_bytes)} / {gib(inv.gpu_memory_total_bytes)}"),
    ):
        summary.add_row(key, value)
    console.print(summary)
