"""Run every benchmark once and print its JSON line. ``--quick`` runs each one's own ``--quick`` form (as CI does)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent

FULL = {
    "bench_fedavg.py": ["--k", "16", "--params", "10000000", "--repeat", "5"],
    "bench_cid.py": ["--size-mib", "256", "--repeat", "3"],
    "bench_accuracy.py": ["--seeds", "0", "1", "2"],
    "bench_e2e.py": ["--repeat", "3"],
    "bench_dispatch.py": ["--jobs", "1000"],
    "bench_heartbeats.py": ["--seconds", "20"],
    "bench_market.py": [],
    "bench_gas.py": ["--sizes", "1", "4", "10", "32"],
    "bench_elastic.py": ["--rounds", "6", "--repeat", "2"],
    "bench_sandbox_startup.py": ["5"],
    "bench_task_path.py": [],
    "bench_flows.py": ["--pairs", "3"],
    "bench_encryption.py": ["--size-mib", "256", "--repeat", "5"],
    "bench_datasets.py": ["--sizes-mib", "256,1024,4096", "--plot", "docs/datasets_rss.png"],
    "bench_ipfs_fetch.py": ["--mib", "256", "--repeat", "3"],
    "bench_verification.py": ["--rounds", "20000", "--real-rounds", "24"],
    "bench_lm.py": ["--steps", "400", "--inner-steps", "50", "--plot", "docs/lm_curves.png"],
    "bench_cli_startup.py": ["--repeat", "15"],
    "bench_model_scale.py": ["--include", "350M", "--plot", "docs/model-scale.png"],
    "bench_experiment_logs.py": ["--rounds", "10", "--repeat", "3", "--workers", "4"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("only", nargs="*", help="benchmark file names to run (default: all)")
    args = parser.parse_args()
    failed = 0
    for script, full_args in FULL.items():
        if args.only and script not in args.only:
            continue
        script_args = ["--quick"] if args.quick else full_args
        print(f"== {script} {' '.join(script_args)}", flush=True)
        done = subprocess.run([sys.executable, str(HERE / script), *script_args])
        failed += done.returncode != 0
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
