"""``aitbc ipfs``: add, cat and pin content in the configured store.

The store is a Kubo RPC daemon when ``--api URL`` (or ``$AITBC_IPFS_API``) is given, else
the local content store under ``$AITBC_HOME/store``; ``--api`` takes kubo's multiaddr
(``/ip4/127.0.0.1/tcp/5001``) as well as a URL. Both give the CIDs ``ipfs add`` gives,
and both verify every block they return. SDK errors propagate to ``app.main`` (see ``exits``).
"""

from __future__ import annotations

import asyncio
import re
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Annotated, Optional, TypeVar

import typer

from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.storage import AddOptions, LocalContentStore
from aitbc_agent_sdk.storage.kubo import KuboClient, KuboContentStore

from .common import HomeOption, IpfsApiOption, JsonOption, ipfs_api_or_default, print_json, resolve_home

API_ENV = "AITBC_IPFS_API"

app = typer.Typer(help="Content-addressed storage: a Kubo RPC daemon (--api / $AITBC_IPFS_API)"
                       " or the local store under $AITBC_HOME/store.", no_args_is_help=True)
pin_app = typer.Typer(help="Pin, unpin and list pinned CIDs.", no_args_is_help=True)
app.add_typer(pin_app, name="pin")

ApiOption = IpfsApiOption  # --api (--ipfs-api), $AITBC_IPFS_API: a kubo multiaddr or an http URL
TimeoutOption = Annotated[float, typer.Option("--timeout", min=0.1,
                                              help="seconds to wait for the daemon / for content it lacks")]

Store = LocalContentStore | KuboContentStore
T = TypeVar("T")


@asynccontextmanager
async def _store(api: str | None, home: Path | None, timeout: float) -> AsyncIterator[Store]:
    api = ipfs_api_or_default(api)  # --api, else $AITBC_IPFS_API, else the config file's ipfs_api
    if api:
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
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True, help="file to add")],
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
    """Add FILE and print its CID (the one `ipfs add` prints).

    Example: aitbc ipfs add model.pt --api /ip4/127.0.0.1/tcp/5001 --json
    """
    options = AddOptions(cid_version=cid_version, raw_leaves=raw_leaves,  # type: ignore[arg-type]
                         chunk_size=_chunk_size(chunker))
    size = file.stat().st_size
    cid = _with_store(api, home, timeout, lambda store: store.add(file, pin=pin, options=options,
                                                                   only_hash=only_hash))
    if as_json:
        print_json({"cid": cid, "size": size})
    else:
        typer.echo(cid)


@app.command()
def cat(
    cid: Annotated[str, typer.Argument(help="CID of a file")],
    api: ApiOption = None,
    home: HomeOption = None,
    timeout: TimeoutOption = 60.0,
) -> None:
    """Write the content of CID to stdout, each block verified before it is written.

    Example: aitbc ipfs cat QmHash > model.pt
    """
    out = sys.stdout.buffer

    async def copy(store: Store) -> None:
        # The user named this CID and the bytes go to stdout, not memory: only the DAG shape limits apply.
        async for chunk in store.stream(cid, max_bytes=None, timeout_s=None):
            out.write(chunk)
        out.flush()

    _with_store(api, home, timeout, copy)


@pin_app.command("add")
def pin_add(cid: Annotated[str, typer.Argument(help="CID to pin")], api: ApiOption = None, home: HomeOption = None,
            timeout: TimeoutOption = 60.0) -> None:
    """Pin CID (its content must be in the store, or fetchable by the daemon).

    Example: aitbc ipfs pin add QmHash
    """
    _with_store(api, home, timeout, lambda store: store.pin(cid))
    typer.echo(f"pinned {cid}")


@pin_app.command("rm")
def pin_rm(cid: Annotated[str, typer.Argument(help="CID to unpin")], api: ApiOption = None, home: HomeOption = None,
           timeout: TimeoutOption = 60.0) -> None:
    """Unpin CID (a no-op when it is not pinned).

    Example: aitbc ipfs pin rm QmHash
    """
    _with_store(api, home, timeout, lambda store: store.unpin(cid))
    typer.echo(f"unpinned {cid}")


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
