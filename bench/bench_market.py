"""Benchmark: the market at scale, on the real broker and chain (scripts/simulate_market.py's engine).

Simulated providers (own keys, broker accounts, on-chain bonds; a few processes) against the SDK's own
coordinator. Prints one JSON line: discovery p50/p99 over every offer and its ratio to only reading the
offers (same run), the coordinator's and the broker's CPU while it follows the providers at work, and
the time the broker's wills take to clear a killed process's offers. docs/scale.md quotes the full form.

    python bench/bench_market.py [--providers 10000] [--fleets 4] [--busy 1000] [--trainings 100]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from quick import parse_args  # noqa: E402
from scripts.market_sim.simulation import SimConfig, simulate  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", type=int, default=10_000)
    parser.add_argument("--fleets", type=int, default=4)
    parser.add_argument("--busy", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--discoveries", type=int, default=5)
    parser.add_argument("--trainings", type=int, default=100)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # unwind: the devnet and the fleets are stopped
    args = parse_args(parser, providers=60, fleets=2, busy=10, seconds=2.0, discoveries=2, trainings=1)
    report = asyncio.run(simulate(SimConfig(providers=args.providers, fleets=args.fleets, busy=args.busy,
                                            seconds=args.seconds, discoveries=args.discoveries,
                                            trainings=args.trainings, workers=3, rounds=2)))
    print(json.dumps(report.summary()))
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
