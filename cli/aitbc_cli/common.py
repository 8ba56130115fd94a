"""Shared CLI vocabulary: option types, the home directory, wallet unlocking, JSON output, spend confirmation.

Every command group takes its options from here, so a thing has one spelling everywhere
(``--rpc-url``, ``--api``, ``--broker``, ``--home``, ``--json``, ``--yes``, ``--dry-run``; an ETH
amount is one parser). The parsers live in ``params``, the exit codes in ``exits``.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional, TypeVar

import typer
from rich.console import Console

from aitbc_agent_sdk.config import default_home
from aitbc_agent_sdk.errors import AitbcError, ConfigError
from aitbc_agent_sdk.records import ElasticPolicy
from aitbc_agent_sdk.profile import devnet_password
from aitbc_agent_sdk.settings import UserSettings, load_settings

from .exits import ExitCode, exit_code_for  # noqa: F401 - re-exported for the command groups
from .params import format_eth, parse_broker, parse_ipfs_api, parse_rpc_url, parse_wei

T = TypeVar("T")

if TYPE_CHECKING:
    from eth_account.signers.local import LocalAccount

    from aitbc_agent_sdk.chain import WalletStore


# -- the home directory ------------------------------------------------------------------------

class HomeError(ConfigError):
    """--home (or $AITBC_HOME) names something that cannot be a state directory."""


def check_home(path: Path) -> Path:
    """PATH, if it is a directory or could become one; HomeError (exit 2) if it or a parent is a file."""
    for part in (path, *path.parents):
        if part.is_dir():
            return path
        if part.exists() or part.is_symlink():
            where = "it" if part == path else f"its parent {part}"
            raise HomeError(f"home {path} cannot be a state directory: {where} is a file, not a directory "
                            f"(pass --home DIR or set $AITBC_HOME; a missing DIR is created when first written)")
    return path


def resolve_home(home: Path | None) -> Path:
    """--home, else $AITBC_HOME, else the default; checked, never created (writers create what they write)."""
    return check_home(home if home is not None else default_home())


def _home_callback(value: Path | None) -> Path:
    try:
        return resolve_home(value)
    except HomeError as exc:
        raise typer.BadParameter(str(exc)) from exc


# -- options: one spelling each; old spellings stay as aliases ---------------------------------

def cli_parser(parse: Callable[[Any], T]) -> Callable[[Any], T]:
    """PARSE with its ValueError as typer's BadParameter (exit 2; typer would prefix 'Value error, ')."""
    def parser(value: Any) -> T:
        try:
            return parse(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from exc
    return parser


HomeOption = Annotated[Optional[Path], typer.Option(
    "--home", callback=_home_callback, metavar="DIR",
    help="state directory: wallets, trainings, devnet profile (default: $AITBC_HOME, else ~/.aitbc)")]
JsonOption = Annotated[bool, typer.Option("--json", help="print one JSON object on stdout and nothing else; "
                                                         "errors too: {\"error\", \"code\", \"type\"}")]
YesOption = Annotated[bool, typer.Option("--yes", "-y", help="spend without asking (no preview prompt)")]
DryRunOption = Annotated[bool, typer.Option("--dry-run", help="show the plan and its cost; spend nothing")]
# Endpoint flags have no envvar of their own: unset, they fall back to the user settings (the AITBC_*
# variables over the config file; see aitbc_agent_sdk.settings), through the *_or_default helpers below.
RpcUrlOption = Annotated[Optional[str], typer.Option(
    "--rpc-url", "--rpc", parser=cli_parser(parse_rpc_url), metavar="URL",
    help="chain JSON-RPC endpoint, e.g. http://127.0.0.1:8545 (default: $AITBC_RPC_URL, $ETH_RPC_URL, "
         "the config file's rpc_url)")]
IpfsApiOption = Annotated[Optional[str], typer.Option(
    "--api", "--ipfs-api", parser=cli_parser(parse_ipfs_api), metavar="ADDR",
    help="Kubo RPC API: multiaddr /ip4/127.0.0.1/tcp/5001 or URL http://127.0.0.1:5001 "
         "(default: $AITBC_IPFS_API, the config file's ipfs_api)")]
BrokerOption = Annotated[Optional[str], typer.Option(
    "--broker", parser=cli_parser(parse_broker), metavar="ADDR",
    help="MQTT broker: HOST:PORT, mqtt://HOST:PORT or mqtts://HOST:PORT (TLS) "
         "(default: $AITBC_BROKER, the config file's broker)")]
NetworkOption = Annotated[Optional[str], typer.Option(
    "--network", metavar="NAME",
    help="network by name: embedded, devnet, or one configured as networks.NAME in the config file "
         "(default: $AITBC_NETWORK, the config file's network)")]


def user_settings() -> UserSettings:
    """The settings in force now (read each time: no global state)."""
    return load_settings()


def rpc_url_or_default(flag: str | None) -> str | None:
    return flag if flag is not None else user_settings().rpc_url


def ipfs_api_or_default(flag: str | None) -> str | None:
    return flag if flag is not None else user_settings().ipfs_api


def broker_or_default(flag: str | None) -> str | None:
    return flag if flag is not None else user_settings().broker


def network_or_default(flag: str | None, fallback: str = "embedded") -> str:
    """--network, else $AITBC_NETWORK / the config file's network, else FALLBACK (a command's own default)."""
    if flag is not None:
        return flag
    settings = user_settings()
    return settings.network if "network" in settings.model_fields_set else fallback


def eth_amount_option(*names: str, help: str, default_wei: int | None = None) -> Any:  # noqa: A002 - typer's keyword
    """An ETH amount option: the value is wei (int); the user types 0.01, 0.01eth, 10gwei or 1000wei.

    The signature's default is in wei (an int passes the parser unchanged); pass the same number as
    DEFAULT_WEI so the help shows it in ETH."""
    shown: bool | str = f"{format_eth(default_wei)} ETH" if default_wei is not None else True
    return typer.Option(*names, parser=cli_parser(parse_wei), metavar="AMOUNT", show_default=shown,
                        help=f"{help} (ETH, or with a unit: 0.01eth, 10gwei, 1000wei)")


# -- wallets -------------------------------------------------------------------------------------

def wallet_store(home: Path) -> WalletStore:
    from aitbc_agent_sdk.devnet import wallet_store as devnet_wallets

    return devnet_wallets(home)


PASSWORD_ENV = "AITBC_PASSWORD"
OLD_PASSWORD_ENV = "AITBC_WALLET_PASSWORD"  # still read
PasswordFileOption = Annotated[Optional[Path], typer.Option(
    "--password-file", metavar="PATH", dir_okay=False,
    help=f"read the wallet password from the first line of PATH (else ${PASSWORD_ENV}, the devnet's own "
         "password, or a prompt; --json never prompts)")]


@dataclass(frozen=True)
class PasswordSource:
    """Where a command may take a wallet's password from, besides the environment and the devnet's file."""

    file: Path | None = None  # --password-file
    interactive: bool = True  # False under --json: stdout is for one JSON object, and nobody may be watching


def read_password_file(path: Path) -> str:
    """The first line of PATH; ConfigError (exit 2) naming PATH when it cannot be read or is empty."""
    try:
        with path.open(encoding="utf-8") as handle:
            password = handle.readline(4096).rstrip("\r\n")
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc
        raise ConfigError(f"--password-file {path}: cannot read it ({reason})") from exc
    if not password:
        raise ConfigError(f"--password-file {path}: its first line is empty; write the wallet password there")
    return password


def given_password(source: PasswordSource) -> str | None:
    """The password the user gave without a prompt: --password-file, else $AITBC_PASSWORD, else
    $AITBC_WALLET_PASSWORD (its older name); None if none."""
    if source.file is not None:
        return read_password_file(source.file)
    for name in (PASSWORD_ENV, OLD_PASSWORD_ENV):
        if (env := os.environ.get(name)) is not None:
            if not env:
                raise ConfigError(f"${name} is set but empty")
            return env
    return None


def no_prompt(wallet: str) -> ConfigError:
    """Exit 2 where a password would be asked for and must not be (--json)."""
    return ConfigError(f"wallet {wallet!r} needs a password and --json never prompts: set ${PASSWORD_ENV} "
                       f"or pass --password-file PATH")


def wallet_password(home: Path, wallet: str, source: PasswordSource = PasswordSource()) -> str:
    """What the user gave (given_password), else the devnet's own password file, else ask on stderr
    (stdout may be JSON), except under --json: exit 2 saying how to give it."""
    password = given_password(source)
    if password is None:
        password = devnet_password(home)
    if password is not None:
        return password
    if not source.interactive:
        raise no_prompt(wallet)
    return str(typer.prompt("wallet password", hide_input=True, err=True))


async def unlock(home: Path, wallet: str, source: PasswordSource = PasswordSource()) -> tuple[LocalAccount, str]:
    password = wallet_password(home, wallet, source)
    return await wallet_store(home).unlock(wallet, password), password


# -- JSON ----------------------------------------------------------------------------------------

def _is_wei_key(key: object) -> bool:
    return isinstance(key, str) and (key == "wei" or key.endswith("_wei"))


def wei_strings(value: Any, *, wei: bool = False) -> Any:
    """VALUE with every int under a key named ``wei`` or ``*_wei`` as a decimal string: JSON numbers
    above 2**53 are corrupted by jq and JavaScript."""
    if isinstance(value, dict):  # under a wei key, a mapping's plain values are wei too (wei per worker)
        return {k: wei_strings(v, wei=_is_wei_key(k) or (wei and not isinstance(v, dict | list | tuple)))
                for k, v in value.items()}
    if isinstance(value, list | tuple):  # records in a list under a wei key go by their own keys
        return [wei_strings(v, wei=wei and not isinstance(v, dict)) for v in value]
    if wei and isinstance(value, int) and not isinstance(value, bool):
        return str(value)
    return value


def print_json(value: Any) -> None:
    """One JSON object on stdout; wei amounts as strings (see wei_strings)."""
    typer.echo(json.dumps(wei_strings(value), sort_keys=True, default=str))


# -- spending ------------------------------------------------------------------------------------

class ConfirmationRequired(ConfigError):
    """A command would spend money and nobody can be asked: no --yes and no terminal."""


class SpendDeclined(AitbcError):
    """The user answered no to the spend preview."""


@dataclass(frozen=True)
class SpendPreview:
    """What a command is about to pay: one line per item, in wei."""

    action: str
    items: tuple[tuple[str, int], ...]
    notes: tuple[str, ...] = ()  # what decides who is paid, at no cost (the minimum bond): shown, not summed

    @property
    def total_wei(self) -> int:
        return sum(wei for _, wei in self.items)

    def as_json(self) -> dict[str, Any]:
        return {"action": self.action, "items": [{"what": what, "wei": str(wei)} for what, wei in self.items],
                "total_wei": str(self.total_wei), **({"notes": list(self.notes)} if self.notes else {})}


def no_terminal_to_ask(what: str) -> ConfirmationRequired:
    """The exit-2 error of a question nobody can answer: it names the flag that answers it."""
    return ConfirmationRequired(f"{what} and there is no terminal to ask: pass --yes to confirm, "
                                f"or --dry-run to only plan")


def confirm_spend(preview: SpendPreview, *, yes: bool, dry_run: bool, play_money: bool = False) -> bool:
    """Show the cost (stderr) and ask, as ``sky launch`` does. True: go ahead; False: --dry-run, spend
    nothing (the caller prints its plan). Without --yes and without a terminal: ConfirmationRequired (exit 2).
    PLAY_MONEY (the embedded network's in-process chain): shown, never asked."""
    err = Console(stderr=True)
    err.print(f"[bold]{preview.action}[/]: {format_eth(preview.total_wei)} ETH", highlight=False)
    for what, wei in preview.items:
        err.print(f"  {what}: {format_eth(wei)} ETH", highlight=False, markup=False)
    for note in preview.notes:
        err.print(f"  {note}", highlight=False, markup=False)
    if dry_run:
        err.print("dry run: nothing spent")
        return False
    if play_money:
        err.print("play money on the embedded network: nothing to confirm")
        return True
    if yes:
        return True
    if not sys.stdin.isatty():
        raise no_terminal_to_ask(f"{preview.action} would spend {format_eth(preview.total_wei)} ETH")
    if not typer.confirm(f"Spend {format_eth(preview.total_wei)} ETH?", default=False, err=True):
        raise SpendDeclined("not confirmed: nothing was spent")
    return True


# -- fault-tolerance and elastic-pool options, shared by `run` and `init` (aggregation: training_options) --
SparesOption = Annotated[int, typer.Option(min=0, help="spare providers hired to replace failed workers")]
EncryptOption = Annotated[bool, typer.Option("--encrypt", help=(
    "store the dataset sealed (AES-256-GCM): IPFS holds ciphertext, hired providers get the key wrapped for them"))]
HeartbeatOption = Annotated[float, typer.Option(min=0.1, help="seconds of silence before a worker is pinged")]
TargetThroughputOption = Annotated[Optional[float], typer.Option(
    help="elastic pool: samples/s to keep, above 0 (hire below 70%, release above 130%)")]
MinWorkersOption = Annotated[int, typer.Option(min=1, help="elastic pool: never fewer workers")]
MaxWorkersOption = Annotated[int, typer.Option(min=1, help="elastic pool: never more workers")]
ScaleWindowOption = Annotated[int, typer.Option(min=1, help="elastic pool: rounds a throughput must last before acting")]


def elastic_policy(target: float | None, min_workers: int, max_workers: int, window: int) -> ElasticPolicy | None:
    """The elastic pool options, or None when no target throughput was given."""
    if target is None:
        return None
    return ElasticPolicy(target_samples_per_s=target, min_workers=min_workers, max_workers=max_workers,
                         window_rounds=window)
