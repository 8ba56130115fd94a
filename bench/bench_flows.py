"""The README's two flows, timed as whole processes against another version of the SDK.

    python bench/bench_flows.py --baseline /path/to/other/venv/bin/aitbc [--pairs 3] [--flows run devnet]

Each pair runs the baseline's command, then this checkout's, so a machine that slows down or
speeds up during the run affects both sides alike; the figure to quote is the median of the
per-pair ratios. ``run`` is ``aitbc distributed-training run`` on the embedded stack (digits,
4 workers, 5 rounds); ``devnet`` is ``scripts/devnet_flow.sh``, the step-by-step flow on
mosquitto, anvil and js-ipfs with 3 provider daemons (``--quick``: one pair of the run flow, 2
workers, 1 round; the devnet flow has no smaller form, so it stays out). Without ``--baseline`` the baseline is
this checkout too, which measures only the noise.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from quick import parse_args

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
OURS = Path(sys.executable).with_name("aitbc")


@functools.cache
def asks_before_paying(aitbc: Path) -> bool:
    """Whether this version's ``run`` has the cost question (``--yes``); versions before it just pay."""
    done = subprocess.run([str(aitbc), "distributed-training", "run", "--help"], capture_output=True, text=True,
                          timeout=300, env={**os.environ, "COLUMNS": "200"})
    return "--yes" in done.stdout


def flow_command(flow: str, aitbc: Path, workers: int, rounds: int) -> list[str]:
    if flow == "run":
        yes = ["--yes"] if asks_before_paying(aitbc) else []
        return [str(aitbc), "distributed-training", "run", "--dataset", "digits", "--workers", str(workers),
                "--rounds", str(rounds), *yes, "--json"]
    return ["bash", str(ROOT / "scripts" / "devnet_flow.sh"), str(aitbc)]


def timed(command: list[str]) -> tuple[float, str]:
    with tempfile.TemporaryDirectory(prefix="aitbc-bench-") as home:
        env = {**os.environ, "AITBC_HOME": home}
        env.pop("AITBC_WALLET_PASSWORD", None)
        start = time.perf_counter()
        # cwd outside any checkout: ``python -m`` daemons put their cwd first on sys.path.
        done = subprocess.run(command, env=env, cwd=home, capture_output=True, text=True, timeout=900)
        elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(command)} failed ({done.returncode}):\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    return elapsed, done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""


def outcome(flow: str, last_line: str) -> str:
    if flow == "run":
        return f"accuracy {json.loads(last_line)['final_accuracy']:.4f}"
    return last_line  # "complete 0.95..." from the script


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, default=OURS, help="the other version's aitbc executable")
    parser.add_argument("--pairs", type=int, default=3)
    parser.add_argument("--flows", nargs="+", choices=("run", "devnet"), default=["run", "devnet"])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the run flow (the devnet flow's are fixed)")
    parser.add_argument("--workers", type=int, default=4, help="workers of the run flow")
    args = parse_args(parser, pairs=1, flows=["run"], workers=2, rounds=1)
    rows = []
    for flow in args.flows:
        base_s, ours_s, ratios, seen = [], [], [], []
        for _ in range(args.pairs):
            b, b_out = timed(flow_command(flow, args.baseline, args.workers, args.rounds))
            o, o_out = timed(flow_command(flow, OURS, args.workers, args.rounds))
            base_s.append(b)
            ours_s.append(o)
            ratios.append(o / b)
            seen.append((outcome(flow, b_out), outcome(flow, o_out)))
        rows.append({"flow": flow, "pairs": args.pairs, "baseline_median_s": round(statistics.median(base_s), 2),
                     "ours_median_s": round(statistics.median(ours_s), 2),
                     "ratio_median": round(statistics.median(ratios), 3),
                     "ratio_min": round(min(ratios), 3), "ratio_max": round(max(ratios), 3),
                     "outcomes": seen})
        print(json.dumps(rows[-1]), flush=True)


if __name__ == "__main__":
    main()
