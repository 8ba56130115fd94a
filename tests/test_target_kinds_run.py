"""A regression end to end through `aitbc distributed-training run`: the example task on a dataset it was not
written for (a synthetic CSV, six features, a standardized float target), reporting its own metric."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]


def synthetic_csv(path: Path) -> Path:
    rng = np.random.default_rng(11)
    x = rng.normal(size=(500, 6))
    y = x @ rng.normal(size=6) + 0.3 * rng.normal(size=500)
    y = (y - y.mean()) / y.std()  # variance 1: a model that learnt nothing scores mse ~1
    lines = [",".join(f"c{i}" for i in range(6)) + ",target"]
    lines += [",".join(f"{v:.5f}" for v in row) + f",{t:.5f}" for row, t in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")
    return path


def run(aitbc_cmd, env, *args) -> subprocess.CompletedProcess:
    return subprocess.run([*aitbc_cmd, "distributed-training", "run", *args], env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, start_new_session=True, timeout=300)


def test_the_regression_example_trains_on_a_float_csv_and_reports_mse(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    data = synthetic_csv(tmp_path / "synthetic.csv")
    common = ["--data-path", str(data), "--label-column", "target", "--workers", "2", "--providers", "2",
              "--rounds", "2", "--json"]
    forced = run(aitbc_cmd, cli_env, *common, "--target", "classes")  # floats cannot be classes: exit 2, unfunded
    assert forced.returncode == 2, forced.stderr
    assert "synthetic.csv: column 'target' holds non-integer numbers" in forced.stdout + forced.stderr
    assert "Traceback" not in forced.stderr
    assert not (aitbc_home / "trainings").exists() or not any((aitbc_home / "trainings").iterdir())

    done = run(aitbc_cmd, cli_env, *common, "--task", str(ROOT / "examples/tasks/linear_regression.py"))
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "complete"
    assert (report["metric"], report["higher_is_better"]) == ("mse", False)
    assert report["final_metric"] == report["rounds"][-1]["metrics"]["mse"]
    assert report["final_accuracy"] is None and all(r["accuracy"] is None for r in report["rounds"])  # never 0
    assert report["loss_name"] == "mse (standardized target)"
    last = report["rounds"][-1]["metrics"]
    assert {"mse", "mae", "r2"} <= last.keys() and "accuracy" not in last
    assert last["mse"] < 0.5 and last["r2"] > 0.5, last  # the target's variance is 1
