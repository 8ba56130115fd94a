"""A self-contained HTML report of a cluster inventory (inline CSS, no scripts, no external links)."""

from __future__ import annotations

import datetime as dt

from ..records._inert import html_text as escape  # hosts' words: control characters shown, then HTML-escaped
from ._inventory import ClusterInventory, HostInventory

_CSS = """
body{font-family:system-ui,sans-serif;margin:2rem;color:#222}
table{border-collapse:collapse;margin:.5rem 0 1.5rem}
th,td{border:1px solid #ccc;padding:.3rem .6rem;text-align:left}
th{background:#f3f3f3}
.bad{color:#b00020;font-weight:600}.cpu{color:#8a5a00;font-weight:600}.ok{color:#1b6e20;font-weight:600}
"""


def gib(value: int) -> str:
    return f"{value / 2**30:.1f} GiB"


def host_status(host: HostInventory) -> str:
    """One word for tables: 'unreachable', 'cpu-only' (CPU fallback) or 'gpu'."""
    if not host.reachable:
        return "unreachable"
    return "cpu-only" if host.cpu_only else "gpu"


def _summary(inv: ClusterInventory) -> str:
    rows = [
        ("hosts", str(len(inv.hosts))),
        ("reachable", ", ".join(inv.reachable_hosts) or "none"),
        ("unreachable", ", ".join(inv.unreachable_hosts) or "none"),
        ("CPU-only (fallback)", ", ".join(inv.cpu_only_hosts) or "none"),
        ("GPUs", str(inv.gpu_count)),
        ("GPU memory (free / total)", f"{gib(inv.gpu_memory_free_bytes)} / {gib(inv.gpu_memory_total_bytes)}"),
        ("GPU models", ", ".join(f"{n}× {m}" for m, n in inv.gpu_models.items()) or "none"),
    ]
    body = "".join(f"<tr><th>{escape(k)}</th><td>{escape(v)}</td></tr>" for k, v in rows)
    return f"<h2>Summary</h2><table>{body}</table>"


def _host(host: HostInventory) -> str:
    status = host_status(host)
    css = {"unreachable": "bad", "cpu-only": "cpu", "gpu": "ok"}[status]
    head = f"<h2>{escape(host.name)} <span class='{css}'>{escape(status)}</span></h2>"
    if not host.reachable:
        return head + f"<p>{escape(host.address or '')}: {escape(host.error or 'no answer')}</p>"
    facts = (f"<p>{escape(host.address or '')}<br>{escape(host.cpu_model or '?')}, {host.cpu_cores} cores, "
             f"RAM {gib(host.ram_available_bytes)} available of {gib(host.ram_total_bytes)}; "
             f"GPU probe: {escape(host.gpu_probe)}</p>")
    if not host.gpus:
        return head + facts + "<p>No GPU: scheduled as a CPU-only (fallback) host.</p>"
    cols = ("index", "model", "memory free / total", "utilization", "driver", "CUDA")
    rows = "".join(
        f"<tr><td>{g.index}</td><td>{escape(g.model)}</td>"
        f"<td>{gib(g.memory_free_bytes)} / {gib(g.memory_total_bytes)}</td>"
        f"<td>{'n/a' if g.utilization_percent is None else f'{g.utilization_percent:.0f} %'}</td>"
        f"<td>{escape(g.driver_version or '?')}</td><td>{escape(g.cuda_version or '?')}</td></tr>"
        for g in host.gpus)
    header = "".join(f"<th>{c}</th>" for c in cols)
    return head + facts + f"<table><tr>{header}</tr>{rows}</table>"


def inventory_html(inv: ClusterInventory) -> str:
    when = dt.datetime.fromtimestamp(inv.collected_at, dt.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    title = f"Cluster {inv.cluster}: hardware inventory"
    hosts = "".join(_host(h) for h in inv.hosts)
    return (f"<!DOCTYPE html><html lang='en'><head><meta charset='utf-8'><title>{escape(title)}</title>"
            f"<style>{_CSS}</style></head><body><h1>{escape(title)}</h1><p>collected {when}</p>"
            f"{_summary(inv)}{hosts}</body></html>\n")
