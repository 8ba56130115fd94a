"""A provider daemon that cheats: ``python -m aitbc_agent_sdk.flow._provider_daemon`` plus ``--behaviour NAME``.

Run from the repository root, either way::

    python scripts/chaos/byzantine_provider.py --wallet W --price-wei N --behaviour nan
    python -m scripts.chaos.byzantine_provider --wallet W --price-wei N --behaviour nan

Like the honest daemon it reads the wallet password from the first line of stdin.
Behaviours are listed in ``scripts.chaos.byzantine.BEHAVIOURS``.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import logging
import sys
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``scripts.chaos`` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aitbc_agent_sdk.flow import _provider_daemon as daemon  # noqa: E402
from scripts.chaos.byzantine import BEHAVIOURS, IMPOSTORS, TROUBLED, byzantine_factory  # noqa: E402
from scripts.chaos.verifiers import VERIFIERS  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = daemon.build_parser("aitbc Byzantine provider daemon for chaos tests "
                                 "(reads the wallet password from stdin)")
    parser.add_argument("--behaviour", required=True, choices=sorted(BEHAVIOURS | TROUBLED | IMPOSTORS | VERIFIERS),
                        help="how this provider cheats")
    parser.add_argument("--stall-s", type=float, default=None, help="throttled: seconds each stalled job stalls")
    parser.add_argument("--stalled-jobs", type=int, default=None, help="throttled: how many first jobs stall")
    parser.add_argument("--partner", default=None, help="colluding-verifier: the address whose work it approves")
    return parser


def main(argv: list[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.warning("this provider is Byzantine: %s", args.behaviour)
    factory = byzantine_factory(args.behaviour)
    if args.behaviour == "throttled":
        factory = functools.partial(factory, stall_s=args.stall_s, stalled_jobs=args.stalled_jobs)
    if args.behaviour == "colluding-verifier":
        if not args.partner:
            raise SystemExit("colluding-verifier needs --partner ADDRESS")
        factory = functools.partial(factory, partner=args.partner)
    asyncio.run(daemon.run_daemon(args, factory))


if __name__ == "__main__":
    main()
