"""Streaming FedAvg vs stack-all-K, against the machine's own memory bandwidth.

    python bench/bench_fedavg.py [--k 16] [--params 10000000] [--repeat 5]

Workload: K checkpoints of one float32 state with PARAMS parameters split over four
tensors (50/25/15/10 %) plus an int64 step counter, generated deterministically
from seed k, weighted by made-up sample counts.

Definitions (1 GB = 1e9 bytes):
- size S = float bytes of one state (4 * PARAMS).
- throughput GB/s = checkpoint bytes consumed per second = K * S / seconds, for
  every method, so numbers compare directly.
- references on the same K states and the same tensor shapes:
    copy_  dst.copy_(state)          -> reads S, writes S per checkpoint
    add_   acc.add_(state, alpha=w)  -> reads 2S, writes S per checkpoint
  ``add_`` is exactly FedAvg's inner operation, so streaming/add_ near 1.0 means
  FedAvg adds no overhead beyond memory traffic. DRAM traffic GB/s (reads +
  writes) is also printed for copy_ and add_.
- time: best (and median) of --repeat round-robin runs over K states already in
  RAM (640 MB for the default, more than the L3), so folds stream from DRAM.

Peak memory is measured in a fresh subprocess per method: the states come from a
lazy generator (one state alive at a time unless the method keeps them), and the
figure is the growth of ``ru_maxrss`` over the RSS after imports. The child sets
``MALLOC_MMAP_THRESHOLD_=65536`` so every large tensor is its own mmap and its
pages return to the OS on free; RSS then tracks live tensor bytes instead of
glibc's heap high-water mark.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator

import torch

from aitbc_agent_sdk.aggregate._aggregation import FedAvg, weighted_average

from quick import parse_args

State = dict[str, torch.Tensor]
_SPLIT = (0.50, 0.25, 0.15)  # the last tensor takes the remainder
_COLS = 1000


def shapes(params: int) -> dict[str, tuple[int, ...]]:
    out: dict[str, tuple[int, ...]] = {}
    used = 0
    for i, frac in enumerate(_SPLIT):
        rows = max(int(params * frac) // _COLS, 1)
        out[f"layer{i}.weight"] = (rows, _COLS)
        used += rows * _COLS
    out["layer3.bias"] = (max(params - used, 1),)
    return out


def make_state(k: int, params: int) -> State:
    g = torch.Generator().manual_seed(k)
    state = {name: torch.randn(shape, generator=g) for name, shape in shapes(params).items()}
    state["step"] = torch.tensor(100 + k, dtype=torch.int64)
    return state


def lazy_states(k: int, params: int) -> Iterator[State]:
    # Yield without keeping a local reference, so only the consumer holds the state.
    for i in range(k):
        yield make_state(i, params)


def weights_for(k: int) -> list[float]:
    return [float(100 + 37 * i) for i in range(k)]


def state_bytes(params: int) -> int:
    return sum(torch.Size(s).numel() for s in shapes(params).values()) * 4


# -- timing (states in RAM) ----------------------------------------------------------------


def time_methods(k: int, params: int, repeat: int) -> dict[str, object]:
    states = [make_state(i, params) for i in range(k)]
    weights = weights_for(k)
    floats = [name for name in states[0] if states[0][name].is_floating_point()]
    dst = {name: torch.empty_like(states[0][name]) for name in floats}

    def streaming() -> None:
        agg = FedAvg()
        for state, w in zip(states, weights, strict=True):
            agg.accumulate(state, w)
        agg.result()

    def stacked() -> None:
        weighted_average(states, weights)

    def copy_ref() -> None:
        for state in states:
            for name in floats:
                dst[name].copy_(state[name])

    def add_ref() -> None:
        for state, w in zip(states, weights, strict=True):
            for name in floats:
                dst[name].add_(state[name], alpha=w)

    # Check the two methods agree before timing them.
    agg = FedAvg()
    for state, w in zip(states, weights, strict=True):
        agg.accumulate(state, w)
    ref = weighted_average(states, weights)
    max_err = max(float((agg.result()[n] - ref[n]).abs().max()) for n in floats)

    size = state_bytes(params)
    methods = {"streaming_fedavg": (streaming, 0), "stack_all_k": (stacked, 0), "copy_": (copy_ref, 2), "add_": (add_ref, 3)}
    for fn, _ in methods.values():
        fn()  # warm-up: page in dst/accumulators, load kernels
    # Round-robin so a noisy neighbour slows every method alike, not whichever ran then.
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(repeat):
        for name, (fn, _) in methods.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)

    out: dict[str, object] = {"max_abs_diff_vs_reference": max_err}
    for name, (_, traffic) in methods.items():
        best, median = min(times[name]), statistics.median(times[name])
        entry = {
            "seconds_best": round(best, 5),
            "seconds_median": round(median, 5),
            "gbps": round(k * size / best / 1e9, 2),
            "gbps_median": round(k * size / median / 1e9, 2),
        }
        if traffic:
            entry["dram_traffic_gbps"] = round(traffic * k * size / best / 1e9, 2)
        out[name] = entry
    return out


# -- peak memory (one subprocess per method, lazy states) ---------------------------------


def _status_bytes(field: str) -> int:
    # VmHWM is this address space's peak RSS; unlike ru_maxrss it is reset by exec,
    # so the parent's 640 MB of timing states do not leak into the child's figure.
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024  # kB
    raise RuntimeError(f"{field} not in /proc/self/status")


def child(method: str, k: int, params: int) -> None:
    torch.set_num_threads(1)  # thread pools allocate lazily; keep them out of the figure
    warm = FedAvg()  # touch the code paths once on a tiny state so lazy init is excluded
    warm.accumulate({"w": torch.ones(4)}, 1.0)
    warm.result()
    base = _status_bytes("VmRSS")
    t0 = time.perf_counter()
    weights = weights_for(k)
    if method == "streaming":
        agg = FedAvg()
        # No zip/enumerate here: they cache their last result tuple, which would keep
        # the previous state alive while the next one is built (a third model).
        i = 0
        for state in lazy_states(k, params):
            agg.accumulate(state, weights[i])
            i += 1
            del state  # drop it before the generator builds the next one
        result = agg.result()
    else:
        states = list(lazy_states(k, params))  # stacking needs all K at once
        result = weighted_average(states, weights)
    seconds = time.perf_counter() - t0
    peak = _status_bytes("VmHWM")
    print(json.dumps({"peak_bytes": peak - base, "seconds_incl_generation": seconds, "keys": len(result)}))


def measure_peak(method: str, k: int, params: int) -> dict[str, float]:
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536")
    cmd = [sys.executable, __file__, "--child", method, "--k", str(k), "--params", str(params)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    size = state_bytes(params)
    return {"peak_mb": round(data["peak_bytes"] / 1e6, 1), "peak_models": round(data["peak_bytes"] / size, 2)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, default=16, help="number of checkpoints")
    parser.add_argument("--params", type=int, default=10_000_000, help="float parameters per state")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--child", choices=("streaming", "stack"), help=argparse.SUPPRESS)
    args = parse_args(parser, k=4, params=1_000_000, repeat=2)
    if args.child:
        child(args.child, args.k, args.params)
        return

    size = state_bytes(args.params)
    timing = time_methods(args.k, args.params, args.repeat)
    memory = {m: measure_peak(m, args.k, args.params) for m in ("streaming", "stack")}
    result = {
        "k": args.k,
        "params": args.params,
        "state_mb": round(size / 1e6, 2),
        "torch_threads": torch.get_num_threads(),
        "torch": torch.__version__,
        **timing,
        "peak_memory": memory,
    }
    s, b, a, c = (timing[n] for n in ("streaming_fedavg", "stack_all_k", "add_", "copy_"))
    assert isinstance(s, dict) and isinstance(b, dict) and isinstance(a, dict) and isinstance(c, dict)
    # The figures to quote: streaming FedAvg's throughput against add_ (its inner operation) and stack-all-K.
    result["ratio_streaming_over_add_"] = round(s["gbps"] / a["gbps"], 3)
    result["ratio_streaming_over_stack"] = round(s["gbps"] / b["gbps"], 3)
    print(json.dumps(result))

    print(
        f"# K={args.k} x {size / 1e6:.0f} MB states: streaming FedAvg {s['seconds_best'] * 1e3:.0f} ms "
        f"({s['gbps']} GB/s of checkpoints) vs stack-all-K {b['seconds_best'] * 1e3:.0f} ms ({b['gbps']} GB/s).\n"
        f"# Same-size torch references: add_ {a['gbps']} GB/s (traffic {a['dram_traffic_gbps']}), "
        f"copy_ {c['gbps']} GB/s (traffic {c['dram_traffic_gbps']}); streaming reaches "
        f"{s['gbps'] / a['gbps']:.0%} of add_.\n"
        f"# Peak extra RSS: streaming {memory['streaming']['peak_mb']} MB "
        f"({memory['streaming']['peak_models']} models) vs stack-all-K {memory['stack']['peak_mb']} MB "
        f"({memory['stack']['peak_models']} models)."
    )


if __name__ == "__main__":
    main()
