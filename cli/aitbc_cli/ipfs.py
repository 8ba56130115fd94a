"""``aitbc ipfs``: add (files and directories), cat (paths and ranges) and pin content in the configured store.

The store is a Kubo RPC daemon when ``--api URL`` (or ``$AITBC_IPFS_API``) is given, else
the local content store under ``$AITBC_HOME/store``; ``--api`` takes kubo's multiaddr
(``/ip4/127.0.0.1/tcp/5001``) as well as a URL. Both give the CIDs ``ipfs add`` gives,
and both verify every block they return. SDK errors propagate to ``app.main`` (see ``exits``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional, TypeVar

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.storage import AddOptions, LocalContentStore, scan_directory

from .common import HomeOption, IpfsApiOption, JsonOption, ipfs_api_or_default, print_json, resolve_home
from .paths import check_output_file

if TYPE_CHECKING:  # httpx: imported when a daemon is used, not for --help
    from aitbc_agent_sdk.storage import KuboContentStore

    Store = LocalContentStore | KuboContentStore

API_ENV = "AITBC_IPFS_API"

app = typer.Typer(help="Content-addressed storage: a Kubo RPC daemon (--api / $AITBC_IPFS_API)"
                       " or the local store under $AITBC_HOME/store.", no_args_is_help=True)
pin_app = typer.Typer(help="Pin, unpin and list pinned CIDs.", no_args_is_help=True)
app.add_typer(pin_app, name="pin")

ApiOption = IpfsApiOption  # --api (--ipfs-api), $AITBC_IPFS_API: a kubo multiaddr or an http URL
TimeoutOption = Annotated[float, typer.Option("--timeout", min=0.1,
                                              help="seconds to wait for the daemon / for content it lacks")]
T = TypeVar("T")


@asynccontextmanager
async def _store(api: str | None, home: Path | None, timeout: float) -> AsyncIterator[Store]:
    api = ipfs_api_or_default(api)  # --api, else $AITBC_IPFS_API, else the config file's ipfs_api
    if api:
        from aitbc_agent_sdk.storage import KuboClient, KuboContentStore

        async with KuboClient(api, timeout=timeout, find_timeout=timeout) as client:
            yield KuboContentStore(client)
    else:
        yield LocalContentStore(resolve_home(home) / "store")


def _with_store(api: str | None, home: Path | None, timeout: float, fn: Callable[[Store], Awaitable[T]]) -> T:
    async def go() -> T:
        async with _store(api, home, timeout) as store:
            return await fn(store)
    return asyncio.run(go())


def _chunk_size(chunker: str) -> int:
    # Only kubo's fixed-size splitter: the CID must be computable locally to be checked.
    match = re.fullmatch(r"size-(\d+)", chunker)
    if not match:
        raise ConfigError(f"unsupported chunker {chunker!r}: use size-N (e.g. size-262144)")
    return int(match.group(1))


@app.command()
def add(
    path: Annotated[Path, typer.Argument(exists=True, readable=True, help="file to add (a directory with -r)")],
    recursive: Annotated[bool, typer.Option("--recursive", "-r", help="add a directory tree (as ipfs add -r)")
                         ] = False,
    hidden: Annotated[bool, typer.Option("--hidden", "-H", help="with -r: include files whose name starts with"
                                                                " a dot (as ipfs add -H)")] = False,
    journal: Annotated[Optional[Path], typer.Option(
        "--journal", metavar="FILE", help="with -r: the resume journal; a rerun after an interruption skips the"
                                          " files it lists (default: one under $AITBC_HOME/imports, removed"
                                          " once the import is done)")] = None,
    only_hash: Annotated[bool, typer.Option("--only-hash", help="compute the CID; store nothing")] = False,
    cid_version: Annotated[int, typer.Option("--cid-version", min=0, max=1, help="CID version, 0 or 1 (as kubo)")
                           ] = 0,
    raw_leaves: Annotated[Optional[bool], typer.Option("--raw-leaves/--no-raw-leaves",
                                                       help="leaves as raw blocks (default: on for CIDv1, as kubo)")] = None,
    chunker: Annotated[str, typer.Option(help="fixed-size chunker, size-N")] = "size-262144",
    pin: Annotated[bool, typer.Option("--pin/--no-pin", help="pin what was added")] = True,
    api: ApiOption = None,
    home: HomeOption = None,
    timeout: TimeoutOption = 60.0,
    as_json: JsonOption = False,
) -> None:
    """Add PATH and print its CID (the one `ipfs add`, or `ipfs add -r` for a directory, prints).

    Example: aitbc ipfs add -r ./dataset --api /ip4/127.0.0.1/tcp/5001 --json
    """
    if journal is not None:
        check_output_file(journal, "--journal")  # before any block is stored
    options = AddOptions(cid_version=cid_version, raw_leaves=raw_leaves,  # type: ignore[arg-type]
                         chunk_size=_chunk_size(chunker))
    if path.is_dir():
        if not recursive:
            raise ConfigError(f"{path} is a directory: add it with -r")
        _add_directory(path, options, hidden=hidden, journal=journal, only_hash=only_hash, pin=pin, api=api,
                       home=home, timeout=timeout, as_json=as_json)
        return
    size = path.stat().st_size
    cid = _with_store(api, home, timeout, lambda store: store.add(path, pin=pin, options=options,
                                                                   only_hash=only_hash))
    if as_json:
        print_json({"cid": cid, "size": size})
    else:
        typer.echo(cid)


def _default_journal(home: Path | None, api: str | None, path: Path, options: AddOptions) -> Path:
    # One journal per (tree, store, options): a rerun of the same command finds it.
    key = f"{path.resolve()}|{ipfs_api_or_default(api) or 'local'}|{options.model_dump_json()}"
    return resolve_home(home) / "imports" / f"{hashlib.sha256(key.encode()).hexdigest()[:24]}.jsonl"


def _add_directory(path: Path, options: AddOptions, *, hidden: bool, journal: Path | None, only_hash: bool,
                   pin: bool, api: str | None, home: Path | None, timeout: float, as_json: bool) -> None:
    files, total = scan_directory(path, hidden=hidden)
    implied = journal is None and not only_hash
    if implied:
        journal = _default_journal(home, api, path, options)
    bar = None if as_json or not sys.stderr.isatty() else Progress(
        TextColumn("adding"), BarColumn(), DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
        console=Console(stderr=True), transient=True)
    task = bar.add_task("add", total=total) if bar else None

    def progress(done: int) -> None:
        if bar is not None and task is not None:
            bar.update(task, completed=done)

    if bar is not None:
        bar.start()
    try:
        cid = _with_store(api, home, timeout, lambda store: store.add_directory(
            path, pin=pin, options=options, only_hash=only_hash, hidden=hidden,
            journal=None if only_hash else journal, progress=progress))
    finally:
        if bar is not None:
            bar.stop()
    if implied and journal is not None:
        journal.unlink(missing_ok=True)  # done: nothing to resume
    if as_json:
        print_json({"cid": cid, "size": total, "files": files})
    else:
        typer.echo(cid)


@app.command()
def cat(
    cid: Annotated[str, typer.Argument(help="CID of a file, or CID/path/in/dir for a file in a directory")],
    offset: Annotated[int, typer.Option("--offset", min=0, help="first byte to write")] = 0,
    length: Annotated[Optional[int], typer.Option("--length", min=0, help="bytes to write at most (default: to"
                                                                          " the end)")] = None,
    api: ApiOption = None,
    home: HomeOption = None,
    timeout: TimeoutOption = 60.0,
) -> None:
    """Write the content of CID (or of CID/path) to stdout, each block verified before it is written.

    Example: aitbc ipfs cat QmHash/train/part-0001.bin --offset 1048576 --length 4096 > piece.bin
    """
    out = sys.stdout.buffer

    async def copy(store: Store) -> None:
        # The user named this CID and the bytes go to stdout, not memory: only the DAG shape limits apply.
        async for chunk in store.stream(cid, max_bytes=None, timeout_s=None, offset=offset, length=length):
            out.write(chunk)
        out.flush()

    _with_store(api, home, timeout, copy)


@pin_app.command("add")
def pin_add(cid: Annotated[str, typer.Argument(help="CID to pin")], api: ApiOption = None, home: HomeOption = None,
            timeout: TimeoutOption = 60.0, as_json: JsonOption = False) -> None:
    """Pin CID (its content must be in the store, or fetchable by the daemon).

    Example: aitbc ipfs pin add QmHash --json
    """
    _with_store(api, home, timeout, lambda store: store.pin(cid))
    _pin_done(cid, pinned=True, as_json=as_json)


@pin_app.command("rm")
def pin_rm(cid: Annotated[str, typer.Argument(help="CID to unpin")], api: ApiOption = None, home: HomeOption = None,
           timeout: TimeoutOption = 60.0, as_json: JsonOption = False) -> None:
    """Unpin CID (a no-op when it is not pinned).

    Example: aitbc ipfs pin rm QmHash
    """
    _with_store(api, home, timeout, lambda store: store.unpin(cid))
    _pin_done(cid, pinned=False, as_json=as_json)


def _pin_done(cid: str, *, pinned: bool, as_json: bool) -> None:
    if as_json:
        print_json({"cid": cid, "pinned": pinned})
    else:
        typer.echo(f"{'pinned' if pinned else 'unpinned'} {cid}")


@pin_app.command("ls")
def pin_ls(api: ApiOption = None, home: HomeOption = None, timeout: TimeoutOption = 60.0,
           as_json: JsonOption = False) -> None:
    """List the pinned (recursive) CIDs.

    Example: aitbc ipfs pin ls --json
    """
    pins = _with_store(api, home, timeout, lambda store: store.pins())
    if as_json:
        print_json({"pins": pins})
    else:
        for cid in pins:
            typer.echo(cid)
