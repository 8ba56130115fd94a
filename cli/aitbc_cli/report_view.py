"""Tables of a training, designed for an 80-column terminal: short addresses and hashes
(0x2FD8…a91C), hardware in a word, ETH with 4 decimals. ``--json`` has the full values."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from rich import box
from rich.console import Group
from rich.table import Table

from aitbc_agent_sdk import TrainingReport
from aitbc_agent_sdk.flow import eth_text
from aitbc_agent_sdk.records import TrainingCost, terminal_markup

_VENDOR_WORDS = ("nvidia", "geforce", "amd", "radeon", "intel", "tesla")


def short(value: str, head: int = 6, tail: int = 4) -> str:
    """0x2FD8…a91C: enough to tell addresses, hashes and CIDs apart; the full value is in --json."""
    return value if len(value) <= head + tail + 1 else f"{value[:head]}…{value[-tail:]}"


def hardware(gpu_type: str, width: int = 10) -> str:
    """'NVIDIA GeForce RTX 3090' -> 'RTX 3090': the model, without the vendor's words."""
    words = [w for w in gpu_type.split() if w.lower() not in _VENDOR_WORDS] or [gpu_type]
    text = " ".join(words)
    return text if len(text) <= width else text[: width - 1] + "…"


def narrow_table(title: str, *columns: str, right: tuple[str, ...] = ()) -> Table:
    """A table without side borders, one space between columns: 80 columns go a long way."""
    table = Table(title=title, box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 1, 0, 0),
                  title_justify="left")
    for col in columns:
        table.add_column(col, justify="right" if col in right else "left", no_wrap=True)
    return table


def bytes_text(size: int | None) -> str:
    """Bytes in binary units (512 B, 3.2 KiB, 41.0 MiB); '-' when not known."""
    if size is None:
        return "-"
    for unit, factor in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if size >= factor:
            return f"{size / factor:.1f} {unit}"
    return f"{size} B"


def metric_text(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value:.4f}" if abs(value) < 100 else f"{value:,.1f}"


def is_classifier(rounds: Sequence[Any]) -> bool:
    """Whether the rounds' accuracy means something: the task reported it (rounds saved before tasks
    reported their metrics have none, and were all classifiers)."""
    return any("accuracy" in r.metrics for r in rounds) or not any(r.metrics for r in rounds)


def direction(report: TrainingReport) -> str:
    return "higher is better" if report.higher_is_better else "lower is better"


def final_text(report: TrainingReport) -> str:
    """The one-line result: a classifier's accuracy, else the task's metric and its validation loss, by the
    names the task gives them (a report saved before it named them: the task's first metric)."""
    last = report.rounds[-1]
    if report.metric == "accuracy":
        if is_classifier(report.rounds):
            return f"final accuracy {report.final_accuracy:.4f}"
        metrics = "".join(f", {n} {metric_text(last.metrics[n])}" for n in task_metric_names(report.rounds)
                          if n in last.metrics)
        return f"final validation loss {last.loss:.4f}{metrics}"
    value = metric_text(last.metrics.get(report.metric))
    return (f"final {report.metric} {value} ({direction(report)}), "
            f"validation {report.loss_name} {last.loss:.4f}")


def task_metric_names(rounds: Sequence[Any], at_most: int = 1, first: str | None = None) -> list[str]:
    """The task's own metrics (perplexity, bits per byte, mse ...), its metric ``first`` when it reported
    it, then the others in the order it reported them; one fits an 80-column table."""
    names: list[str] = [first] if first is not None and any(first in r.metrics for r in rounds) else []
    for r in rounds:
        names += [n for n in r.metrics if n not in ("loss", "accuracy") and n not in names]
    return names[:at_most]


RoundColumn = tuple[str, Callable[[Any], str]]


def round_columns(rounds: Sequence[Any]) -> list[RoundColumn]:
    """What a round shows (a RoundMetrics or a RoundReport): accuracy for a classifier only, the validation
    loss, the task's own metrics, and the model bytes sent and received once the coordinator counted them."""
    columns: list[RoundColumn] = []
    if is_classifier(rounds):
        columns.append(("accuracy", lambda r: f"{r.accuracy:.4f}"))
    columns.append(("val loss", lambda r: f"{r.loss:.4f}"))
    # A metric's name is the task's (a user's code): shown as written, never as markup.
    columns += [(terminal_markup(name), lambda r, n=name: metric_text(r.metrics.get(n)))
                for name in task_metric_names(rounds)]
    if any(r.bytes_sent is not None or r.bytes_received is not None for r in rounds):
        columns += [("sent", lambda r: bytes_text(r.bytes_sent)), ("received", lambda r: bytes_text(r.bytes_received))]
    return columns


def report_tables(report: TrainingReport) -> list[Any]:
    measures = round_columns(report.rounds)
    if report.cost is not None:  # each round's spend: what its accepted work's receipts committed
        spent = {s.round: s.wei for s in report.cost.per_round_wei}
        measures.append(("spent ETH", lambda r: eth_text(spent[r.round]) if r.round in spent else "-"))
    names = [name for name, _ in measures]
    rounds = narrow_table(f"Training {terminal_markup(report.training_id)}", "round", *names, "workers", "model CID",
                          right=("round", *names, "workers"))
    for r in report.rounds:
        rounds.add_row(str(r.round), *(cell(r) for _, cell in measures), str(r.workers or "-"),
                       short(r.model_cid, 8, 6))

    workers = narrow_table("Workers", "worker", "hardware", "samples", "rounds", "ETH/round", "paid ETH", "paid in",
                           right=("samples", "rounds", "ETH/round", "paid ETH"))
    for w in report.workers:  # "paid in": the payment's tx, else why not (replaced, unpaid)
        why_not = w.role if w.role != "worker" else w.status
        paid_in = short(w.tx_hash) if w.tx_hash else why_not
        workers.add_row(short(w.address), terminal_markup(hardware(w.gpu_type, 8)), str(w.samples),
                        str(w.rounds_accepted), eth_text(w.price_wei), eth_text(w.paid_wei), terminal_markup(paid_in))

    e = report.escrow
    escrow = narrow_table(f"Escrow {short(e.address)}", "deposited ETH", "paid ETH", "refunded ETH", "refund tx",
                          "wall s", "compute s", right=("deposited ETH", "paid ETH", "refunded ETH", "wall s",
                                                        "compute s"))
    escrow.add_row(eth_text(e.deposited_wei), eth_text(e.paid_wei), eth_text(e.refunded_wei),
                   short(report.refund_tx) if report.refund_tx else "-", f"{report.wall_seconds:.1f}",
                   f"{report.compute_seconds:.1f}")
    tables = [rounds, workers, escrow]
    if (v := report.verification) is not None:  # what checking the results cost, apart from the training
        columns = ("checks", "failed", "by verifiers", "verifier reports", "coordinator s",
                   "checked jobs' training s", "ratio", "verifiers ETH")
        checking = narrow_table("Verification (spot checks)", *columns, right=columns)
        checking.add_row(str(v.checks), str(v.failed), str(v.on_market), str(v.verifier_reports),
                         f"{v.coordinator_seconds:.1f}", f"{v.checked_training_seconds:.1f}",
                         "-" if v.ratio is None else f"{v.ratio:.2f}x", eth_text(v.verifier_wei))
        tables.append(checking)
    return tables


def cost_line(cost: TrainingCost) -> str:
    """The spend so far (receipted or paid) against the deposit, and where it is heading."""
    of = f" of {eth_text(cost.deposit_wei)} deposited" if cost.deposit_wei is not None else ""
    mean = f", {eth_text(cost.mean_round_wei)} a round" if cost.mean_round_wei is not None else ""
    ahead = (f"; {eth_text(cost.projected_wei)} ETH projected for {cost.rounds} rounds"
             if cost.projected_wei is not None and cost.rounds_done < cost.rounds else "")
    return f"cost: {eth_text(cost.spent_wei)} ETH spent{of}{mean}{ahead}"


def report_group(report: TrainingReport) -> Group:
    return Group(*report_tables(report))
