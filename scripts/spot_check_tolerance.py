"""How far an honest segment's re-execution lands from its committed end, against a skipped one's.

Trains jobs of the built-in mlp and gpt with their trajectory recorded on ``--device`` (cuda when
there is one), then re-executes every segment on the same device and on the CPU, and reports the
largest relative distance (``relative_distance``: to the committed end state, over the segment's
own change). The same for a worker that skips every other segment (its loss is zero there): the
gap between the two is the room ``FaultPolicy.reexec_tolerance`` has. Prints ``RESULT|detail``
rows for scripts/gpu_check.sh and one JSON line.

    python scripts/spot_check_tolerance.py [--device cuda]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import sysconfig
import tempfile
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from aitbc_agent_sdk.records import FaultPolicy, JobConfig, TaskRef  # noqa: E402
from aitbc_agent_sdk.wire._checkpoint import decode_state  # noqa: E402
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.tasks._bound_task import bind_task  # noqa: E402
from aitbc_agent_sdk.data._shard_files import TokenData  # noqa: E402
from aitbc_agent_sdk.tasks._task_loop import train_task  # noqa: E402
from aitbc_agent_sdk.proof._trajectory import TrajectoryRecorder, boundary_name  # noqa: E402
from aitbc_agent_sdk.tasks._trajectory_replay import reexecute_segment, relative_distance  # noqa: E402


class Skipping:
    """A task whose loss is zero in odd segments: a worker that did not do that work."""

    def __init__(self, task, k: int) -> None:
        self._task, self._k, self.calls = task, k, 0

    def __getattr__(self, name):
        return getattr(self._task, name)

    def loss(self, model, batch, params):
        segment, self.calls = self.calls // self._k, self.calls + 1
        loss = self._task.loss(model, batch, params)
        return loss * 0.0 if segment % 2 else loss


class EveryBoundary(TrajectoryRecorder):
    """Writes every boundary's state, not only the kept ones: each segment's end is compared here."""

    def start(self, total_steps, *args, **kwargs) -> None:
        super().start(total_steps, *args, **kwargs)  # writes boundary 0
        self.kept = tuple(range(math.ceil(total_steps / self.segment_steps) + 1))


def model_of(blob: bytes) -> dict[str, torch.Tensor]:
    return {k.removeprefix("model/"): v for k, v in decode_state(blob).items() if k.startswith("model/")}


def distances(bound, data, config, device: torch.device, skipping: bool) -> dict[str, float]:
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        spec = bound.model_spec(data)
        model = bound.build(spec, samples=len(data), seed=1)
        probe = TrajectoryRecorder(None, config.segments)
        task = bound.task
        if skipping:  # the segment length first, from an honest count
            train_task(bound.task, bound.build(spec, samples=len(data), seed=1), data, bound.params, config, seed=7,
                       device=device, trajectory=probe)
            task = Skipping(bound.task, probe.segment_steps)
        recorder = EveryBoundary(directory, config.segments)
        train_task(task, model, data, bound.params, config, seed=7, device=device, trajectory=recorder)
        commitment = recorder.commitment("job-1", "0x" + "ab" * 20, device.type)
        worst: dict[str, float] = {}
        for where in {device, torch.device("cpu")}:
            for segment in range(commitment.segments):
                if skipping and segment % 2 == 0:
                    continue
                start = (directory / boundary_name(segment)).read_bytes()
                end = model_of((directory / boundary_name(segment + 1)).read_bytes())
                again = reexecute_segment(bound, spec, data, config, 7, commitment, segment, start, device=where)
                d = relative_distance(again.model, end, model_of(start))
                worst[where.type] = max(worst.get(where.type, 0.0), d)
        return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    torch.set_num_threads(1)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = tuple(np.frombuffer((stdlib / n).read_bytes(), dtype=np.uint8).astype(np.uint16)
                 for n in ("textwrap.py", "argparse.py"))
    jobs = {
        "mlp": (bind_task(TaskRef(name="mlp")), load_dataset("digits").subset(np.arange(450)),
                JobConfig(epochs=4, batch_size=32, learning_rate=1e-2, segments=16)),
        "gpt": (bind_task(TaskRef(name="gpt", params={"layers": 2, "heads": 2, "width": 64, "context": 32,
                                                      "windows_per_epoch": 512, "eval_windows": 8})),
                TokenData(text, vocab_size=256, eot=0), JobConfig(epochs=1, batch_size=16, learning_rate=3e-3,
                                                                   segments=16)),
    }
    tolerance = FaultPolicy().reexec_tolerance
    found = {}
    for name, (bound, data, config) in jobs.items():
        honest = distances(bound, data, config, device, skipping=False)
        lazy = distances(bound, data, config, device, skipping=True)
        found[name] = {"honest": honest, "skipped": lazy}
        for where, d in honest.items():
            ok = d <= tolerance and lazy[where] > tolerance
            print(f"{'PASS' if ok else 'FAIL'}|{name}, trained on {device.type}, re-executed on {where}: honest "
                  f"{d:.3g}, skipped {lazy[where]:.3g} (tolerance {tolerance:g})")
    print(json.dumps({"device": device.type, "tolerance": tolerance, "worst_relative_distance": found}))


if __name__ == "__main__":
    main()
