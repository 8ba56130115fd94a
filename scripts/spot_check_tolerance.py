"""How far an honest segment's re-execution lands from its committed end, against a skipped one's.

Trains jobs of the built-in mlp and gpt with their trajectory recorded on ``--device`` (cuda when
there is one), then re-executes every segment on the same device and on the CPU, and reports the
largest relative distance (``relative_distance``: to the committed end state, over the segment's
own change). The same for a worker that skips every other segment (its loss is zero there): the
gap between the two is the room a tolerance has. Prints ``RESULT|detail`` rows for
scripts/gpu_check.sh and one JSON line.

``--table PATH`` merges what it measured on a GPU into a tolerance table (the SDK ships one as
``aitbc_agent_sdk/proof/tolerances.json``): one row per device class (the GPU's name as NVML reports
it, which is what an offer advertises), precision and reference device, with the bound at the
geometric middle of the largest honest and the smallest skipped distance. A CPU adds no row: it is
compared bit for bit.

    python scripts/spot_check_tolerance.py [--device cuda] [--table PATH] [--quick]
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
from aitbc_agent_sdk.data._datasets import load_dataset  # noqa: E402
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


def distances(bound, data, config, device: torch.device, skipping: bool) -> tuple[dict[str, float], int]:
    """The worst distance per device re-executed on, and how many segments each measured."""
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
        counted = 0
        for where in {device, torch.device("cpu")}:
            for segment in range(commitment.segments):
                if skipping and segment % 2 == 0:
                    continue
                start = (directory / boundary_name(segment)).read_bytes()
                end = model_of((directory / boundary_name(segment + 1)).read_bytes())
                again = reexecute_segment(bound, spec, data, config, 7, commitment, segment, start, device=where)
                d = relative_distance(again.model, end, model_of(start))
                worst[where.type] = max(worst.get(where.type, 0.0), d)
                counted += where == device
        return worst, counted


FLOOR = 1e-6  # an honest distance of exactly 0 (a deterministic GPU kernel) still needs a bound above it


def middle_bound(honest_max: float, skipped_min: float) -> float | None:
    """The bound between the two measurements, equally far from each in ratio; None when they overlap."""
    if not honest_max < skipped_min:
        return None
    return min(math.sqrt(max(honest_max, FLOOR) * skipped_min), skipped_min * (1 - 1e-9))


def device_class(device: torch.device) -> str:
    """The class an offer from this machine is hired as: the GPU's NVML name, else the CPU's."""
    from aitbc_agent_sdk.records import CPU_CLASS
    if device.type != "cuda":
        return CPU_CLASS
    from aitbc_agent_sdk.provider._hardware import detect_hardware
    gpus = detect_hardware().gpus
    return gpus[device.index or 0].name if gpus else torch.cuda.get_device_name(device)


def table_rows(found: dict, jobs: dict, device: torch.device) -> list:
    """Rows for ``--table``: per precision and reference, the worst honest and the best skipped distance."""
    from aitbc_agent_sdk.proof._tolerances import precision_of
    from aitbc_agent_sdk.records import ToleranceRow
    if device.type == "cpu":
        return []
    name = device_class(device)
    grouped: dict[tuple[str, str], list] = {}
    for task, measured in found.items():
        precision = precision_of(device.type, jobs[task][0].task.bf16)
        for where, honest in measured["honest"].items():
            reference = name if where == device.type else "cpu"
            grouped.setdefault((precision, reference), []).append(
                (task, honest, measured["skipped"][where], measured["segments"]))
    rows = []
    for (precision, reference), entries in sorted(grouped.items()):
        honest = max(e[1] for e in entries)
        skipped = min(e[2] for e in entries)
        bound = middle_bound(honest, skipped)
        if bound is None:
            print(f"FAIL|{name} {precision} against {reference}: honest {honest:.3g} reaches skipped "
                  f"{skipped:.3g}; no tolerance separates them")
            continue
        rows.append(ToleranceRow(
            device_class=name, precision=precision, reference=reference, bound=bound, honest_max=honest,
            skipped_min=skipped, segments=sum(e[3] for e in entries),
            measured=f"torch {torch.__version__}; tasks {', '.join(e[0] for e in entries)}"))
    return rows


def read_table(path: Path):
    """The tolerance table at ``path`` (empty when there is none yet); a clear exit 2 when it is not one."""
    from aitbc_agent_sdk.records import ToleranceTable
    if not path.exists():
        return ToleranceTable()
    try:
        return ToleranceTable.model_validate_json(path.read_text())
    except (OSError, ValueError) as exc:
        print(f"error: {path} is not a tolerance table: {str(exc).splitlines()[0]}", file=sys.stderr)
        raise SystemExit(2) from None


def merge_table(path: Path, rows: list) -> None:
    """``rows`` into the table at ``path`` (replacing rows of the same key), written whole or not at all."""
    from aitbc_agent_sdk.records import ToleranceTable
    table = read_table(path)
    keys = {(r.device_class, r.precision, r.reference) for r in rows}
    kept = [r for r in table.rows if (r.device_class, r.precision, r.reference) not in keys]
    merged = ToleranceTable(rows=tuple(sorted([*kept, *rows], key=lambda r: (r.device_class, r.precision,
                                                                              r.reference))))
    partial = path.with_name(path.name + ".partial")
    partial.write_text(merged.model_dump_json(indent=2) + "\n")
    partial.replace(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--table", type=Path, help="merge the measured GPU rows into this tolerance table")
    parser.add_argument("--quick", action="store_true", help="smaller jobs (the test suite's form)")
    args = parser.parse_args()
    if args.table is not None:
        read_table(args.table)  # a bad table is refused before minutes of measuring
    device = torch.device(args.device)
    torch.set_num_threads(1)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    text = tuple(np.frombuffer((stdlib / n).read_bytes(), dtype=np.uint8).astype(np.uint16)
                 for n in ("textwrap.py", "argparse.py"))
    samples, windows, segments = (200, 128, 8) if args.quick else (450, 512, 16)
    jobs = {
        "mlp": (bind_task(TaskRef(name="mlp")), load_dataset("digits").subset(np.arange(samples)),
                JobConfig(epochs=4, batch_size=32, learning_rate=1e-2, segments=segments)),
        "gpt": (bind_task(TaskRef(name="gpt", params={"layers": 2, "heads": 2, "width": 64, "context": 32,
                                                      "windows_per_epoch": windows, "eval_windows": 8})),
                TokenData(text, vocab_size=256, eot=0), JobConfig(epochs=1, batch_size=16, learning_rate=3e-3,
                                                                   segments=segments)),
    }
    tolerance = FaultPolicy().reexec_tolerance
    found = {}
    for name, (bound, data, config) in jobs.items():
        honest, counted = distances(bound, data, config, device, skipping=False)
        lazy, _ = distances(bound, data, config, device, skipping=True)
        found[name] = {"honest": honest, "skipped": lazy, "segments": counted}
        for where, d in honest.items():
            ok = d <= tolerance and lazy[where] > tolerance
            print(f"{'PASS' if ok else 'FAIL'}|{name}, trained on {device.type}, re-executed on {where}: honest "
                  f"{d:.3g}, skipped {lazy[where]:.3g} (default tolerance {tolerance:g})")
    rows = table_rows(found, jobs, device)
    for r in rows:
        print(f"PASS|table row: {r.device_class} {r.precision} against {r.reference}: bound {r.bound:.3g} "
              f"(honest at most {r.honest_max:.3g}, skipped at least {r.skipped_min:.3g})")
    if args.table is not None:
        merge_table(args.table, rows)
    print(json.dumps({"device": device.type, "device_class": device_class(device), "tolerance": tolerance,
                      "worst_relative_distance": found, "rows": [r.model_dump() for r in rows]}))


if __name__ == "__main__":
    main()
