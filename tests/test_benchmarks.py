"""Every benchmark in bench/ runs in its quick form, so a benchmark that rots fails CI.

Each ``bench/bench_*.py --quick`` runs as its own process (as a user runs it) and must exit 0 and
print a JSON line with a ratio: a finite number under a key that names one (``ratio`` or
``_over_`` in it, at any depth). The full forms (bench/run_all.py without ``--quick``) stay out of CI.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "bench"
BENCHMARKS = sorted(p.name for p in BENCH.glob("bench_*.py"))
TIMEOUT_S = 600  # a quick form takes seconds; this only stops a hung one on a very busy machine


def _names_a_ratio(key: str) -> bool:
    return "ratio" in key or "_over_" in key


def ratios(value: object, key: str = "") -> list[float]:
    """Every finite number under a ratio-named key (itself or an enclosing one), at any depth of a JSON value."""
    if isinstance(value, dict):
        return [r for k, v in value.items() for r in ratios(v, key if _names_a_ratio(key) else str(k))]
    if isinstance(value, list):
        return [r for v in value for r in ratios(v, key)]
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    return [float(value)] if _names_a_ratio(key) and is_number and math.isfinite(value) else []


def json_lines(stdout: str) -> list[object]:
    found = []
    for line in stdout.splitlines():
        line = line.strip()
        if line.startswith("{"):
            try:
                found.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return found


def test_ratio_finder_needs_a_named_finite_number() -> None:
    assert ratios({"rows": [{"steady_ratio": 1.2}], "elastic_over_fixed": 0.9}) == [1.2, 0.9]
    assert ratios({"ratio_sandbox_over_plain": {"cold": 1.5}}) == [1.5]
    assert ratios({"ratio": None, "speed": 3.0, "ratio_ok": True, "x_over_y": float("nan")}) == []


def test_every_benchmark_is_in_run_all() -> None:
    run_all = (BENCH / "run_all.py").read_text()
    assert BENCHMARKS and all(f'"{name}"' in run_all for name in BENCHMARKS)


@pytest.mark.parametrize("script", BENCHMARKS)
def test_quick_form_runs_and_prints_a_ratio(script: str, tmp_path: Path) -> None:
    env = {**os.environ, "AITBC_HOME": str(tmp_path / "home")}
    env.pop("AITBC_WALLET_PASSWORD", None)
    started = time.perf_counter()
    done = subprocess.run([sys.executable, str(BENCH / script), "--quick"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=TIMEOUT_S)
    seconds = time.perf_counter() - started
    print(f"{script} --quick: {seconds:.1f} s")
    assert done.returncode == 0, f"{script} --quick exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    found = [r for obj in json_lines(done.stdout) for r in ratios(obj)]
    assert found, f"{script} --quick printed no ratio:\n{done.stdout[-3000:]}"
