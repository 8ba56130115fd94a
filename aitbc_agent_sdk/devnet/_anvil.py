"""anvil (Foundry's dev Ethereum node) as the devnet's chain, bound to 127.0.0.1 by default.

``host`` may name another local address (a network namespace's, say); never 0.0.0.0 or
any other wildcard, since the dev accounts' keys are public.

The node is started with an explicit mnemonic, so its pre-funded dev accounts are the
well-known ones and :func:`dev_accounts` can derive their keys locally instead of
scraping them from anvil's banner.
"""

from __future__ import annotations

import asyncio
import shutil
import time
from pathlib import Path

from eth_account import Account
from eth_account.signers.local import LocalAccount

from aitbc_agent_sdk.chain._devchain import connect_rpc
from aitbc_agent_sdk.chain._tx import CHAIN_EXCEPTIONS

from ._service import (
    LOCALHOST, ServiceError, ServiceProcess, check_bind_host, free_port, spawn, stop, tail, wait_for_port,
)

__all__ = [
    "DEV_BALANCE_ETH",
    "DEV_MNEMONIC",
    "anvil_path",
    "dev_accounts",
    "rpc_url",
    "start_anvil",
    "start_chain_node",
    "wait_for_chain",
]

# anvil's (and Hardhat's) default mnemonic; its keys are public, so only ever use it on a dev chain.
DEV_MNEMONIC = "test test test test test test test test test test test junk"
DEV_ACCOUNT_COUNT = 10
DEV_BALANCE_ETH = 10_000
_NPM_PACKAGE = "@foundry-rs/anvil-linux-amd64"
_REPO_ROOT = Path(__file__).resolve().parents[2]


def anvil_path(repo_root: Path | None = None) -> Path:
    """The anvil binary: the npm copy under ``tools/node`` first, then ``$PATH``."""
    modules = (repo_root or _REPO_ROOT) / "tools" / "node" / "node_modules"
    candidates = [modules / _NPM_PACKAGE / "bin" / "anvil", modules / ".bin" / "anvil"]
    # Other platforms' packages (anvil-darwin-arm64, ...) share the layout.
    candidates += sorted(modules.glob("@foundry-rs/anvil-*/bin/anvil"))
    for path in candidates:
        if path.is_file() and path.stat().st_mode & 0o111:
            return path
    found = shutil.which("anvil")
    if found:
        return Path(found)
    raise ServiceError(f"anvil not found (looked in {modules} and on PATH); run `make setup` to install it")


def dev_accounts(n: int = DEV_ACCOUNT_COUNT, mnemonic: str = DEV_MNEMONIC) -> list[LocalAccount]:
    """The first ``n`` accounts anvil funds for ``mnemonic`` (BIP-44 path m/44'/60'/0'/0/i)."""
    if n < 0:
        raise ValueError("n must be non-negative")
    Account.enable_unaudited_hdwallet_features()
    return [Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{i}") for i in range(n)]


def rpc_url(service: ServiceProcess) -> str:
    return f"http://{service.host}:{service.port}"


def start_anvil(
    data_dir: Path,
    *,
    port: int | None = None,
    host: str = LOCALHOST,
    block_time: float | None = None,
    chain_id: int = 31337,
    state_file: Path | None = None,
    accounts: int = DEV_ACCOUNT_COUNT,
    mnemonic: str = DEV_MNEMONIC,
    repo_root: Path | None = None,
) -> ServiceProcess:
    """Spawn anvil detached, logging to ``data_dir/anvil.log``; does not wait for it.

    ``block_time`` None means auto-mine (a block per transaction). With ``state_file``
    the chain is loaded from it at start and dumped to it every second and on exit,
    so a devnet restart keeps deployed contracts and balances.
    """
    binary = anvil_path(repo_root)
    host = check_bind_host(host)  # never 0.0.0.0: the dev keys are public
    port = port or free_port(host)
    argv = [
        str(binary),
        "--host", host,
        "--port", str(port),
        "--chain-id", str(chain_id),
        "--mnemonic", mnemonic,
        "--accounts", str(accounts),
        "--balance", str(DEV_BALANCE_ETH),
    ]
    if block_time is not None:
        if block_time <= 0:
            raise ServiceError("block_time must be positive (or None for auto-mine)")
        argv += ["--block-time", f"{block_time:g}"]
    if state_file is not None:
        state_file.parent.mkdir(parents=True, exist_ok=True)
        # --state loads at start and dumps on exit; the interval covers a SIGKILL.
        argv += ["--state", str(state_file), "--state-interval", "1"]
    data_dir.mkdir(parents=True, exist_ok=True)
    return spawn("anvil", argv, port=port, host=host, log=data_dir / "anvil.log")


async def wait_for_chain(service: ServiceProcess, *, chain_id: int | None = None, timeout: float = 30.0) -> int:
    """Wait until the node answers ``eth_chainId`` (a listening port is not yet a ready node)."""
    deadline = time.monotonic() + timeout
    await wait_for_port(service, timeout=timeout)
    last: BaseException | None = None
    while time.monotonic() < deadline:
        if not service.alive():
            raise ServiceError(f"{service.name} exited during start-up; last log lines:\n{tail(service.log)}")
        w3 = await connect_rpc(rpc_url(service), timeout=2.0, check=False)
        try:
            answered = int(await asyncio.wait_for(w3.eth.chain_id, 2.0))
        except CHAIN_EXCEPTIONS as exc:
            last = exc
            await asyncio.sleep(0.1)
            continue
        finally:
            await w3.provider.disconnect()
        if chain_id is not None and answered != chain_id:
            raise ServiceError(f"{service.name} on port {service.port} reports chain id {answered}, expected {chain_id}"
                               " (another node on that port?)")
        return answered
    raise ServiceError(f"{service.name} did not answer eth_chainId within {timeout:.0f}s ({last});"
                       f" last log lines:\n{tail(service.log)}")


async def start_chain_node(
    data_dir: Path,
    *,
    port: int | None = None,
    host: str = LOCALHOST,
    block_time: float | None = None,
    chain_id: int = 31337,
    state_file: Path | None = None,
    timeout: float = 30.0,
) -> ServiceProcess:
    """Start anvil and return once it serves JSON-RPC; on failure nothing is left running."""
    service = start_anvil(data_dir, port=port, host=host, block_time=block_time, chain_id=chain_id,
                          state_file=state_file)
    try:
        await wait_for_chain(service, chain_id=chain_id, timeout=timeout)
    except BaseException:
        await asyncio.to_thread(stop, service)
        raise
    return service
