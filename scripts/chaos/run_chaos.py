"""Run the chaos scenarios on fresh devnets and print scenario -> outcome.

    .venv/bin/python scripts/chaos/run_chaos.py                      # every scenario (make chaos)
    .venv/bin/python scripts/chaos/run_chaos.py --quick              # the CI subset
    .venv/bin/python scripts/chaos/run_chaos.py --scenario straggler --scenario byzantine-stale
    .venv/bin/python scripts/chaos/run_chaos.py --json               # one JSON object on stdout

``clean`` always runs first: it is the reference accuracy of the others. Each scenario
starts its own devnet (mosquitto, anvil, js-ipfs, provider daemons) in a temporary
AITBC_HOME and tears it down afterwards, failed or not. Exit status 1 if any failed.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from pathlib import Path

if __package__ in (None, ""):  # run as a file: make ``scripts.chaos`` importable from the repo root
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402

from scripts.chaos.harness import QUICK, SCENARIOS, SLASHED, ChaosConfig, ScenarioResult, run_scenarios  # noqa: E402


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description="chaos suite: faults injected into real devnet trainings")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, metavar="NAME",
                        help=f"run this scenario (repeatable); one of: {', '.join(SCENARIOS)}")
    parser.add_argument("--quick", action="store_true", help=f"the CI subset: {', '.join(QUICK)}")
    parser.add_argument("--list", action="store_true", help="list the scenarios and exit")
    parser.add_argument("--json", dest="as_json", action="store_true", help="print one JSON object and nothing else")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--heartbeat-timeout", type=float, default=3.0)
    parser.add_argument("--tolerance", type=float, default=0.01, help="allowed accuracy difference to clean")
    parser.add_argument("--workdir", type=Path, default=None, help="where scenario homes go (default: a temp dir)")
    parser.add_argument("--keep-failed", action=argparse.BooleanOptionalAction, default=True,
                        help="keep a failed scenario's AITBC_HOME (logs, audit log, database) for inspection")
    parser.add_argument("--verbose", "-v", action="store_true", help="print the logs of failed scenarios")
    return parser


def selected(args: argparse.Namespace) -> list[str]:
    if args.scenario:
        return list(args.scenario)
    return list(QUICK if args.quick else SCENARIOS)


def _yes_no(value: bool | None, good: bool = True) -> str:
    if value is None:
        return "-"
    ok = value == good
    return f"[{'green' if ok else 'red'}]{'yes' if value else 'no'}[/]"


def _slashed(r: ScenarioResult) -> str:
    """Whether a bond was slashed, green when that is what the scenario's evidence calls for."""
    if r.slashed is None:
        return "-"
    return _yes_no(r.slashed, good=r.scenario in SLASHED)


def render(results: list[ScenarioResult]) -> Table:
    table = Table(title="chaos scenarios (4 workers + 1 spare, real mosquitto, anvil, js-ipfs)")
    for col in ("scenario", "outcome", "complete", "accuracy", "Δ vs clean", "faulty paid?", "slashed", "conserved",
                "audit event", "detect s", "wall s"):
        table.add_column(col, justify="right" if col in ("accuracy", "Δ vs clean", "detect s", "wall s") else "left")
    for r in results:
        if r.faulty_paid_wei is not None:
            paid = _yes_no(r.faulty_paid_wei > 0, good=False)
        elif r.all_paid is not None:
            paid = "n/a, all paid" if r.all_paid else "[red]n/a, NOT all paid[/]"
        else:
            paid = "-"
        if r.audit_ok is None:
            event = f"{r.expected_event} [dim]not read[/]"
        else:
            event = f"{r.expected_event} {'[green]seen[/]' if r.event_seen else '[red]missing[/]'}"
            if not r.audit_ok:
                event += " [red](log broken)[/]"
        table.add_row(
            r.scenario, "[green]PASS[/]" if r.passed else "[red]FAIL[/]", _yes_no(r.complete),
            f"{r.accuracy:.4f}" if r.accuracy is not None else "-",
            f"{r.delta:+.4f}" if r.delta is not None else "-", paid, _slashed(r), _yes_no(r.conservation_ok), event,
            f"{r.detection_s:.2f}" if r.detection_s is not None else "-", f"{r.wall_s:.0f}")
    return table


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        print("\n".join(SCENARIOS))
        return 0
    config = ChaosConfig(rounds=args.rounds, epochs=args.epochs, seed=args.seed,
                         heartbeat_timeout_s=args.heartbeat_timeout, accuracy_tolerance=args.tolerance,
                         workdir=args.workdir, keep_failed=args.keep_failed, python=sys.executable)
    err = Console(stderr=True, quiet=args.as_json)
    names = selected(args)
    started = time.monotonic()

    def progress(result: ScenarioResult) -> None:
        status = "[green]PASS[/]" if result.passed else "[red]FAIL[/]"
        err.print(f"{status} {result.scenario} in {result.wall_s:.0f}s"
                  + (f": {result.failures[0].splitlines()[0][:300]}" if result.failures else ""))

    err.print(f"running {len(names) + ('clean' not in names)} scenarios, each on its own devnet...")
    results = asyncio.run(run_scenarios(names, config, on_result=progress))
    failed = [r for r in results if not r.passed]
    if args.as_json:
        print(json.dumps({"passed": not failed, "wall_s": round(time.monotonic() - started, 1),
                          "results": [r.to_json() for r in results]}, sort_keys=True))
        return 1 if failed else 0
    out = Console() if sys.stdout.isatty() else Console(width=200)
    out.print(render(results))
    for r in results:
        lines = [f"[red]FAIL[/] {f}" for f in r.failures] + [f"[dim]{n}[/]" for n in r.notes]
        if r.silent_s is not None:
            lines.append(f"[dim]worker_failed silent_s={r.silent_s}[/]")
        if lines:
            out.print(f"[bold]{r.scenario}[/]" + (f" ({r.training_id})" if r.training_id else ""))
            for line in lines:
                out.print(f"  {line}", highlight=False)
        if not r.passed and r.home:
            out.print(f"  kept for inspection: {r.home}")
        if not r.passed and args.verbose and r.diagnostics:
            out.print(r.diagnostics, markup=False, highlight=False)
    total = time.monotonic() - started
    out.print(f"{len(results) - len(failed)}/{len(results)} scenarios passed in {total:.0f}s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
