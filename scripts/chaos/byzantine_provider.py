"""A provider daemon that cheats: ``python -m aitbc_agent_sdk.provider.daemon`` plus ``--behaviour NAME``.

Run from the repository root, either way::

    python scripts/chaos/byzantine_provider.py --wallet W --price-wei N --behaviour nan
    python -m scripts.chaos.byzantine_provider --wallet W --price-wei N --behaviour nan

Like the honest daemon it reads the wallet password from the first line of stdin.
Behaviours are listed in ``scripts.chaos.byzantine.BEHAVIOURS``.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``scripts.chaos`` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aitbc_agent_sdk.chain import WalletStore  # noqa: E402
from aitbc_agent_sdk.config import default_home  # noqa: E402
from aitbc_agent_sdk.provider.daemon import serve_provider  # noqa: E402
from scripts.chaos.byzantine import BEHAVIOURS, byzantine_factory  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="aitbc Byzantine provider daemon for chaos tests "
                                                 "(reads the wallet password from stdin)")
    parser.add_argument("--home", type=Path, default=default_home())
    parser.add_argument("--wallet", required=True)
    parser.add_argument("--price-wei", type=int, required=True)
    parser.add_argument("--slots", type=int, default=1)
    parser.add_argument("--gpu", choices=("auto", "none"), default="auto")
    parser.add_argument("--stake-wei", type=int, default=None, help="register with this bond if not registered")
    parser.add_argument("--behaviour", required=True, choices=sorted(BEHAVIOURS), help="how this provider cheats")
    return parser


async def _main(args: argparse.Namespace) -> None:
    password = sys.stdin.readline().rstrip("\n")
    account = await WalletStore(args.home / "wallets").unlock(args.wallet, password)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    logging.warning("provider %s is Byzantine: %s", account.address, args.behaviour)
    await serve_provider(args.home, account, price_wei=args.price_wei, slots=args.slots, gpu=args.gpu,
                         stake_wei=args.stake_wei, stop=stop, agent_factory=byzantine_factory(args.behaviour))


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(_main(args))


if __name__ == "__main__":
    main()
