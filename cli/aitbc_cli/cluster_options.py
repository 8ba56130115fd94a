"""The option types of ``aitbc cluster``: one spelling, range and help text each."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer
from typer.models import OptionInfo


def positive_seconds(text: str | float) -> float:
    """A number of seconds > 0 (typer turns the ValueError into a usage error, exit 2)."""
    try:
        value = float(text)
    except ValueError:
        raise ValueError(f"{text!r} is not a number of seconds") from None
    if not value > 0:
        raise ValueError(f"{text} must be > 0")
    return value


def nproc_per_node(text: str | int) -> int | str:
    """'auto' or a positive integer."""
    if text == "auto":
        return "auto"
    if not str(text).isdigit() or int(text) < 1:
        raise ValueError(f"takes 'auto' or a positive integer, got {text!r}")
    return int(text)


def seconds_option(help_text: str) -> OptionInfo:
    return typer.Option(parser=positive_seconds, metavar="SECONDS", help=f"{help_text} (> 0)")


ClusterOption = Annotated[Optional[str], typer.Option(
    "--cluster", help="cluster name ($AITBC_HOME/clusters/NAME.json) (default: this host alone)")]
ClusterName = Annotated[str, typer.Option("--cluster", help="cluster name ($AITBC_HOME/clusters/NAME.json)")]
CoordinatorWallet = Annotated[str, typer.Option(
    "--wallet", help="the coordinator's wallet: hosts take requests only from the cluster's --coordinator list")]

# cluster train
ScriptOption = Annotated[Path, typer.Option("--script", help="training script, at the same path on every host")]
ScriptArgs = Annotated[Optional[list[str]], typer.Argument(help="arguments for the script (after --)")]
HostsOption = Annotated[int, typer.Option("--hosts", min=1, help="how many hosts to train on")]
NprocOption = Annotated[str, typer.Option(
    "--nproc-per-node", parser=nproc_per_node, metavar="auto|N",
    help="ranks per host: 'auto' (one per GPU, 1 on CPU) or N")]
MinHostsOption = Annotated[Optional[int], typer.Option(
    "--min-hosts", min=1, help="elastic: keep training while this many hosts remain (default: --hosts)")]
MaxRestartsOption = Annotated[int, typer.Option("--max-restarts", min=0, help="torchrun worker-group restarts")]
CheckpointDirOption = Annotated[Optional[Path], typer.Option(
    "--checkpoint-dir", help="shared directory for checkpoints; the job's working directory on every host")]
CheckpointEveryOption = Annotated[Optional[int], typer.Option(
    "--checkpoint-every", min=1, help="steps between checkpoints (CHECKPOINT_EVERY for the script)")]
DatasetOption = Annotated[Optional[list[str]], typer.Option(
    "--dataset", help="path every host must be able to read (checked before launch); repeat")]
NoSandboxOption = Annotated[bool, typer.Option("--no-sandbox", help="ask hosts to run torchrun unsandboxed")]
VerboseOption = Annotated[bool, typer.Option("--verbose", "-v", help="also show torchrun's INFO lines")]
