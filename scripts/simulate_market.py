"""Simulate a market of many providers on the real broker and chain, and measure the coordinator against it.

    python scripts/simulate_market.py --providers 10000 --fleets 4 --busy 1000 --json

Exit 0 only when every phase met its checks (every offer discovered, every followed worker heard,
every training complete with wei conserved, every killed provider's offer cleared by its will); 2 on
bad arguments. See docs/scale.md.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import signal
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scripts.market_sim.simulation import SimConfig, simulate  # noqa: E402


def parse(argv: list[str] | None = None) -> SimConfig:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--providers", type=int, default=500)
    parser.add_argument("--fleets", type=int, default=3, help="processes the providers are spread over")
    parser.add_argument("--busy", type=int, default=100, help="providers at work, followed by the coordinator")
    parser.add_argument("--seconds", type=float, default=10.0, help="the liveness window")
    parser.add_argument("--discoveries", type=int, default=5)
    parser.add_argument("--trainings", type=int, default=0, help="whole trainings run at once over the market")
    parser.add_argument("--workers", type=int, default=3, help="workers per training")
    parser.add_argument("--rounds", type=int, default=2, help="rounds per training")
    parser.add_argument("--stagger", type=float, default=0.0, help="seconds over which the trainings start")
    parser.add_argument("--hostile", type=int, default=0,
                        help="providers that misbehave (malformed or forged offers, floods, vanishing after consent)")
    parser.add_argument("--verify-on", choices=("auto", "coordinator", "market"), default="auto",
                        help="who re-executes the trainings' spot checks")
    parser.add_argument("--no-chain", action="store_true", help="skip registering the providers on chain")
    parser.add_argument("--churn", type=float, default=0.0, metavar="RATE",
                        help="the share of the market that changes each minute of the trainings: in turn a provider"
                             " crashes (mid-job when one has a job), one leaves cleanly, one joins")
    parser.add_argument("--no-fleet-kill", action="store_true", help="skip killing a fleet at the end")
    parser.add_argument("--home", type=Path, help="keep the devnet's home (audit logs, databases) here")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument("--plot", type=Path, help="write a PNG of the measurements here")
    args = parser.parse_args(argv)
    problems = [name for name, ok in (("--providers must be >= 1", args.providers >= 1),
                                      ("--fleets must be between 1 and --providers",
                                       1 <= args.fleets <= args.providers),
                                      ("--busy must be between 0 and --providers", 0 <= args.busy <= args.providers),
                                      ("--seconds must be > 0", args.seconds > 0),
                                      ("--churn must be between 0 and 1", 0 <= args.churn <= 1),
                                      ("--churn needs --trainings", not (args.churn and not args.trainings)),
                                      ("--discoveries must be >= 1", args.discoveries >= 1),
                                      ("--trainings must be >= 0", args.trainings >= 0),
                                      ("--hostile must be between 0 and --providers - --busy",
                                       0 <= args.hostile <= args.providers - args.busy),
                                      ("--workers must be >= 1", args.workers >= 1),
                                      ("--rounds must be >= 1", args.rounds >= 1),
                                      ("--trainings x --workers must not exceed --providers",
                                       args.trainings * args.workers <= args.providers),
                                      ("--trainings need the chain (drop --no-chain)",
                                       not (args.trainings and args.no_chain))) if not ok]
    if args.home is not None and args.home.exists() and any(args.home.iterdir()):
        problems.append(f"--home {args.home} is not empty")
    if problems:
        parser.error("; ".join(problems))  # exit 2
    parse.args = args  # type: ignore[attr-defined]
    return SimConfig(providers=args.providers, fleets=args.fleets, busy=args.busy, seconds=args.seconds,
                     discoveries=args.discoveries, chain=not args.no_chain, fleet_kill=not args.no_fleet_kill,
                     churn_per_min=args.churn,
                     trainings=args.trainings, workers=args.workers, rounds=args.rounds, stagger_s=args.stagger,
                     hostile=args.hostile, verify_on=args.verify_on, home=args.home)


def plot(summary: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 4))
    left.bar(["p50", "p99"], [summary["discovery_p50_s"], summary["discovery_p99_s"]], color="#4c72b0")
    left.set_title(f"discovery over {summary['providers']:,} offers (s)")
    right.bar(["coordinator", "broker"], [summary["coordinator_cpu_percent"], summary["broker_cpu_percent"]],
              color=["#55a868", "#c44e52"])
    right.set_title(f"CPU % of a core, {summary['liveness']['followed']} workers followed")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    config = parse(argv)
    # A TERM (a timeout, a CI job cancelled) unwinds like Ctrl-C: the devnet and the fleets are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    args = parse.args  # type: ignore[attr-defined]
    report = asyncio.run(simulate(config))
    summary = report.summary()
    if args.plot:
        plot(summary, args.plot)
    if args.json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:42s} {value}")
    return 0 if not report.failures else 1


if __name__ == "__main__":
    sys.exit(main())
