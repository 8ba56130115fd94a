"""How long the ``aitbc`` CLI takes to answer ``--version`` and ``--help``, against a bare ``python -c pass``.

``python bench/bench_cli_startup.py [--repeat N] [--quick]``. Each case is a fresh process, as a user
runs it (the console script's own ``main``), timed from spawn to exit; the cases take turns, so a
busy machine slows them alike. The goal (issue #26): each answers in 0.5 s or less; torch, web3 and
the stack are imported only when a command runs.

Prints a line per case, then one JSON line: medians in seconds, each case over ``python -c pass``,
and which heavy modules ``import aitbc_cli.app`` loaded (none is the goal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

from quick import parse_args

CASES = {
    "python_pass": ["-c", "pass"],
    "version": ["-c", "from aitbc_cli.app import main; main(['--version'])"],
    "help": ["-c", "from aitbc_cli.app import main; main(['--help'])"],
    "training_help": ["-c", "from aitbc_cli.app import main; main(['distributed-training', '--help'])"],
}
HEAVY = ("torch", "web3", "eth_account", "numpy", "matplotlib")
GOAL_S = 0.5


def seconds(args: list[str]) -> float:
    started = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   env={**os.environ, "COLUMNS": "80"})
    return time.perf_counter() - started


def heavy_imports() -> list[str]:
    probe = f"import sys, aitbc_cli.app; print(','.join(m for m in {HEAVY!r} if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    return [m for m in out.strip().split(",") if m]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=15, help="processes per case")
    args = parse_args(parser, repeat=3)
    runs: dict[str, list[float]] = {name: [] for name in CASES}
    for _ in range(args.repeat):
        for name, case in CASES.items():  # interleaved: load hits every case alike
            runs[name].append(seconds(case))
    medians = {name: statistics.median(times) for name, times in runs.items()}
    base = medians["python_pass"]
    for name, median in medians.items():
        print(f"{name}: median {median:.3f} s of {args.repeat} ({median / base:.1f}x python -c pass)")
    cli = {name: m for name, m in medians.items() if name != "python_pass"}
    print(json.dumps({"bench": "cli_startup", "repeat": args.repeat, "median_s": medians,
                      "ratio_over_python_pass": {name: m / base for name, m in cli.items()},
                      "goal_s": GOAL_S, "within_goal": all(m <= GOAL_S for m in cli.values()),
                      "heavy_modules_imported": heavy_imports()}))


if __name__ == "__main__":
    main()
