"""Whether a dispute can be narrowed by hashes on a device: two traced re-executions of one segment.

Trains a small gpt job (dropout on) with its trajectory recorded on ``--device``, then traces its middle
segment twice on the same device (a state hash after every step, as a disputed worker and its verifier
do) and replays each step alone from the state before it (as the coordinator does at the end of a
dispute). On a CPU everything must agree bit for bit, or this exits 1. On a GPU (the worker's
deterministic kernels on) it reports how many steps agree: all of them means a GPU class's disputes
could be narrowed by hash as a CPU's are; fewer means they go to the referee (docs/protocol.md,
*Disputes*). Prints ``RESULT|detail`` rows for scripts/gpu_check.sh and one JSON line.

    python scripts/dispute_trace_check.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aitbc_agent_sdk.data._shard_files import TokenData  # noqa: E402
from aitbc_agent_sdk.proof._trajectory import TrajectoryRecorder  # noqa: E402
from aitbc_agent_sdk.provider._worker_process import reproducible_gpu  # noqa: E402
from aitbc_agent_sdk.records import JobConfig, TaskRef  # noqa: E402
from aitbc_agent_sdk.tasks._bound_task import bind_task  # noqa: E402
from aitbc_agent_sdk.tasks._trajectory_replay import open_boundaries, replay_step, trace_segment  # noqa: E402

GPT = {"layers": 2, "heads": 2, "width": 64, "context": 32, "windows_per_epoch": 256, "eval_windows": 4,
       "dropout": 0.1}
SEED = 7


def measure(device: torch.device) -> dict:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = tuple(np.frombuffer((stdlib / n).read_bytes(), dtype=np.uint8).astype(np.uint16)
                 for n in ("textwrap.py", "argparse.py"))
    data = TokenData(text, vocab_size=256, eot=0)
    bound = bind_task(TaskRef(name="gpt", params=GPT))
    config = JobConfig(epochs=1, batch_size=8, learning_rate=3e-3, segments=4)  # 32 steps: 4 segments of 8
    with tempfile.TemporaryDirectory() as tmp:
        spec = bound.model_spec(data)
        model = bound.build(spec, samples=len(data), seed=1)
        recorder = TrajectoryRecorder(Path(tmp), config.segments)
        bound.train(model, data, config, seed=SEED, trajectory=recorder, device=device)
        commitment = recorder.commitment("job-1", "0x" + "ab" * 20, device.type)
        segment = commitment.segments // 2
        start = open_boundaries(bound, spec, data, config, SEED, commitment, Path(tmp), {segment},
                                device=device)[segment]
    first, last = commitment.segment_steps_of(segment)
    points = tuple(range(1, last - first + 1))
    traces = [trace_segment(bound, spec, data, config, SEED, commitment, segment, start, points=points,
                            device=device).trace for _ in range(2)]
    repeatable = sum(a == b for a, b in zip(*traces))
    # each step alone, from the state before it (uploaded by a side at the end of a dispute)
    alone, state = 0, start
    for offset in points:
        again = replay_step(bound, spec, data, config, SEED, commitment, first + offset - 1, state, device=device)
        alone += again.state_hash == traces[0][offset - 1]
        state = again.end
    return {"device": str(device), "segment_steps": len(points), "repeatable_steps": repeatable,
            "replayed_alone_steps": alone, "ends_as_committed": traces[0][-1] == commitment.state_hashes[segment + 1]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    args = parser.parse_args()
    if args.device == "cuda":
        if not torch.cuda.is_available():
            raise SystemExit("--device cuda: torch sees no CUDA device")
        reproducible_gpu()
    torch.set_num_threads(1)
    found = measure(torch.device(args.device))
    steps = found["segment_steps"]
    agreed = found["repeatable_steps"] == found["replayed_alone_steps"] == steps and found["ends_as_committed"]
    detail = (f"{found['repeatable_steps']} of {steps} steps hash alike in two traces, "
              f"{found['replayed_alone_steps']} replayed alone from the state before them; "
              f"ends as committed: {found['ends_as_committed']}")
    if args.device == "cpu":
        print(f"{'PASS' if agreed else 'FAIL'}|cpu: {detail}")
    else:  # a measurement: fewer than all means a GPU class's disputes go to the referee
        print(f"{'PASS' if agreed else 'MEASURED'}|{torch.cuda.get_device_name(0)}: {detail}")
    print(json.dumps({"check": "dispute_trace", **found}))
    if args.device == "cpu" and not agreed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
