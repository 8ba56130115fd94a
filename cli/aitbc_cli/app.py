"""The ``aitbc`` entry point: sub-apps are registered here; errors become the exit codes of ``exits``."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Annotated, Optional

import typer
from pydantic import ValidationError
from rich.console import Console
# typer vendors click and does not re-export its exception root; usage errors derive from it.
from typer._click.exceptions import ClickException

from aitbc_agent_sdk import AitbcError
from aitbc_agent_sdk.models.inert import terminal_markup

from . import chat, cluster, devnet, distributed_training, ipfs, market, mcp_server, provider, wallet
from .exits import ExitCode, describe, error_json, exit_code_for, exit_codes_epilog

DISTRIBUTION = "aitbc-agent-sdk"

app = typer.Typer(help="Federated training on rented GPUs, paid through an on-chain escrow.\n\n"
                       "Example: aitbc devnet up && aitbc wallet balance dev --json",
                  epilog=exit_codes_epilog() + " With --json an error is one JSON object on stdout: "
                  '{"error": ..., "code": ..., "type": ...}.',
                  no_args_is_help=True, pretty_exceptions_enable=False)
app.add_typer(distributed_training.app, name="distributed-training")
app.add_typer(devnet.app, name="devnet")
app.add_typer(provider.app, name="provider")
app.add_typer(wallet.app, name="wallet")
app.add_typer(ipfs.app, name="ipfs")
app.add_typer(market.app, name="market")
app.add_typer(cluster.app, name="cluster")
app.command("chat")(chat.chat)
app.add_typer(mcp_server.app, name="mcp")

EXIT_BAD_INPUT = ExitCode.USAGE  # the old name, kept for importers


def package_version() -> str:
    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:  # run from a checkout that was never installed
        return "unknown"


def _show_version(value: bool) -> None:
    if value:
        typer.echo(f"aitbc {package_version()}")
        raise typer.Exit()


@app.callback()
def _root(version_: Annotated[Optional[bool], typer.Option(
        "--version", callback=_show_version, is_eager=True, help="print the version and exit")] = None) -> None:
    """The root: only --version; everything else is a sub-command."""


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; every error leaves as one message (or JSON object) and its exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    as_json = "--json" in args
    try:
        code = app(args=args, prog_name="aitbc", standalone_mode=False)
    except ClickException as exc:  # usage errors (exit 2) and typer's own failures
        _report(exc.format_message(), exc.exit_code, type(exc).__name__, as_json, usage=exc)
        sys.exit(exc.exit_code)
    except typer.Abort:  # end of input at a prompt
        _report("aborted", ExitCode.FAILED, "Abort", as_json)
        sys.exit(ExitCode.FAILED)
    except (AitbcError, ValidationError) as exc:
        code = exit_code_for(exc)
        _report(describe(exc), code, type(exc).__name__, as_json)
        sys.exit(code)
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    sys.exit(code if isinstance(code, int) else ExitCode.OK)


def _report(message: str, code: int, kind: str, as_json: bool, usage: ClickException | None = None) -> None:
    if as_json:
        typer.echo(error_json(message, code, kind))
    elif usage is not None:
        from typer import rich_utils

        rich_utils.rich_format_error(usage)  # the usage line and a boxed message, as typer shows them
    else:
        # soft_wrap: a path in the message stays whole, whatever the terminal's width
        # An error may quote a stranger's words (a worker's reason, a node's answer).
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {terminal_markup(message, multiline=True)}",
                                                   highlight=False)


if __name__ == "__main__":
    main()
