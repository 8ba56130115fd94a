"""The ``aitbc`` entry point: sub-apps are registered here; errors become the exit codes of ``exits``.

A sub-command's module is imported only when that sub-command runs or shows its help, so ``aitbc
--version`` and ``aitbc --help`` answer at once (bench/bench_cli_startup.py); the modules themselves
import torch, web3 and the stack only inside the commands that use them."""

from __future__ import annotations

import importlib
import os
import sys
import traceback
from collections.abc import Mapping, Sequence
from typing import Annotated, Any, Optional

import typer
import typer.main
from pydantic import ValidationError
# typer vendors click and does not re-export its exception root; usage errors derive from it.
from typer._click.exceptions import ClickException
from typer.core import TyperCommand, TyperGroup

from aitbc_agent_sdk.errors import AitbcError

from .exits import ExitCode, describe, error_json, exit_code_for, exit_codes_epilog, unexpected_message

DISTRIBUTION = "aitbc-agent-sdk"
DEBUG_FLAG = "--debug"
DEBUG_ENV = "AITBC_DEBUG"

# name -> (module, its Typer app or command function, the help the root lists). In the order --help lists
# them; each help is the sub-command's own (tests/test_cli_first_hour.py keeps the two equal).
SUB_COMMANDS: dict[str, tuple[str, str, str]] = {
    "chat": ("chat", "chat", "Ask the assistant to do something: train, detect GPUs, mount data, balance memory, "
                             "recover, pay."),
    "distributed-training": ("distributed_training", "app", (
        "Coordinate federated training across GPU providers: `run` does it all in one process; init, upload-data, "
        "discover-workers, distribute follow the seed's steps on the devnet; list, logs, monitor, stop and resume "
        "manage what runs.")),
    "devnet": ("devnet", "app", "Run a local devnet: MQTT broker, anvil with the contracts, IPFS, provider daemons."),
    "provider": ("provider", "app", "Run a provider daemon and see its jobs and earnings."),
    "wallet": ("wallet", "app", "Manage local wallets (encrypted keystore v3 files in $AITBC_HOME/wallets)."),
    "ipfs": ("ipfs", "app", "Content-addressed storage: a Kubo RPC daemon (--api / $AITBC_IPFS_API) or the local "
                            "store under $AITBC_HOME/store."),
    "market": ("market", "app", "Browse the market: signed offers, bonds and on-chain reputation."),
    "cluster": ("cluster", "app", "Trusted multi-host clusters: members, hardware inventory, training, shared "
                                  "datasets."),
    "dashboard": ("dashboard.command", "dashboard", "Serve a live web dashboard of the home's trainings, their "
                                                     "workers, money and audit log, and the market."),
    "mcp": ("mcp_server", "app", "Model Context Protocol: expose the SDK's tools to MCP-capable assistants."),
}


def load_sub_command(name: str) -> Any:
    """The click command of sub-command NAME, built from its module (imported now)."""
    module, attribute, _ = SUB_COMMANDS[name]
    target = getattr(importlib.import_module(f".{module}", __package__), attribute)
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)  # a group even with one command (market list, mcp serve)
    else:
        single = typer.Typer()
        single.command(name)(target)
        command = typer.main.get_command(single)
    command.name = name
    return command


class _LoadedOnUse(dict):  # type: ignore[type-arg]
    def __missing__(self, name: str) -> Any:
        if name not in SUB_COMMANDS:
            raise KeyError(name)
        self[name] = command = load_sub_command(name)
        return command


class LazyGroup(TyperGroup):
    """The root group: sub-commands are listed from SUB_COMMANDS and imported when one is used."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.commands = _LoadedOnUse()
        self._listing = False

    def list_commands(self, ctx: Any) -> list[str]:
        return list(SUB_COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        if cmd_name not in SUB_COMMANDS:
            return None
        if self._listing:  # the root's --help needs a name and a line, not the module
            return TyperCommand(name=cmd_name, help=SUB_COMMANDS[cmd_name][2])
        return self.commands[cmd_name]

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


app = typer.Typer(help="Federated training on rented GPUs, paid through an on-chain escrow.\n\n"
                       "Example: aitbc devnet up && aitbc wallet balance dev --json",
                  epilog=exit_codes_epilog() + " With --json an error is one JSON object on stdout: "
                  '{"error": ..., "code": ..., "type": ...}.',
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=LazyGroup)

EXIT_BAD_INPUT = ExitCode.USAGE  # the old name, kept for importers


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

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
        "--version", callback=_show_version, is_eager=True, help="print the version and exit")] = None,
          debug: Annotated[bool, typer.Option(
              DEBUG_FLAG, help=f"show the traceback of an error (also ${DEBUG_ENV}=1); allowed anywhere on the "
                               "command line")] = False) -> None:
    """The root: --version and --debug; everything else is a sub-command."""


def split_debug(args: Sequence[str], environ: Mapping[str, str]) -> tuple[list[str], bool]:
    """ARGS without --debug (before a '--'), and whether debugging is on (the flag or $AITBC_DEBUG=1)."""
    end = args.index("--") if "--" in args else len(args)
    kept = [a for a in args[:end] if a != DEBUG_FLAG] + list(args[end:])
    return kept, len(kept) < len(args) or environ.get(DEBUG_ENV, "") not in ("", "0")


def main(argv: Sequence[str] | None = None) -> None:
    """Run the CLI; every error leaves as one message (or JSON object) and its exit code, with a
    traceback only under --debug."""
    args, debug = split_debug(list(sys.argv[1:] if argv is None else argv), os.environ)
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
        if debug:
            traceback.print_exc()
        code = exit_code_for(exc)
        _report(describe(exc), code, type(exc).__name__, as_json)
        sys.exit(code)
    except KeyboardInterrupt:
        sys.exit(ExitCode.INTERRUPTED)
    except Exception as exc:  # a bug or an unforeseen failure: one line, the traceback only when asked
        if debug:
            raise
        _report(unexpected_message(exc), ExitCode.FAILED, type(exc).__name__, as_json)
        sys.exit(ExitCode.FAILED)
    sys.exit(code if isinstance(code, int) else ExitCode.OK)


def _report(message: str, code: int, kind: str, as_json: bool, usage: ClickException | None = None) -> None:
    if as_json:
        typer.echo(error_json(message, code, kind))
    elif usage is not None:
        from typer import rich_utils

        rich_utils.rich_format_error(usage)  # the usage line and a boxed message, as typer shows them
    else:
        from rich.console import Console

        from aitbc_agent_sdk.records import terminal_markup

        # soft_wrap: a path in the message stays whole, whatever the terminal's width
        # An error may quote a stranger's words (a worker's reason, a node's answer).
        Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {terminal_markup(message, multiline=True)}",
                                                   highlight=False)


if __name__ == "__main__":
    main()
