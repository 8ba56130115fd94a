"""Committed trajectories: the worker records its states and batches, the coordinator re-executes segments.

Re-executing any committed segment from its boundary file reproduces the committed end state bit for
bit on this CPU (mlp, and the gpt with dropout and a resumed optimizer); a lazy worker's end state,
another dataset, a wrong start file and a malformed commitment are all caught; the commitment rides
in the checkpoint's metadata in every update encoding and comes out of the sandbox with its files."""

from __future__ import annotations

import json
import shutil
import struct
import sysconfig
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.records import COMMITMENT_KEY, JobConfig, TaskRef, TrajectoryCommitment
from aitbc_agent_sdk.provider._process import TRAJECTORY_DIR, TrainingProcess
from aitbc_agent_sdk.provider._sandbox import TrainingSandbox, take_trajectory
from aitbc_agent_sdk.provider._worker_process import CHECKPOINT_FILE, WEIGHTS_FILE, write_checkpoint
from aitbc_agent_sdk.tasks._bound_task import bind_task
from aitbc_agent_sdk.wire._checkpoint import decode_metadata, decode_state, encode_state
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.data._shard_files import TokenData, write_shard
from aitbc_agent_sdk.tasks._task import TrainingTask
from aitbc_agent_sdk.tasks._task_loop import train_step, train_task
from aitbc_agent_sdk.proof._trajectory import (
    TrajectoryRecorder, boundary_hashes, boundary_name, encode_boundary, kept_boundaries, load_boundary,
    read_commitment, tensor_digest,
)
from aitbc_agent_sdk.tasks._trajectory_replay import (
    open_boundaries, reexecute_segment, relative_distance, replay_step, trace_segment,
)
from aitbc_agent_sdk.wire._update_codec import decode_update

WORKER = "0x" + "ab" * 20
STDLIB = Path(sysconfig.get_paths()["stdlib"])
TINY_GPT = {"layers": 1, "heads": 2, "width": 32, "context": 16, "windows_per_epoch": 48, "eval_windows": 8,
            "warmup_steps": 2, "dropout": 0.2}


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def synthetic(samples: int = 300, seed: int = 0) -> LabeledData:
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(samples, 8, generator=g)
    return LabeledData(features, (features[:, 0] > 0).long() + (features[:, 1] > 0).long(), 3)


def byte_tokens(*names: str) -> TokenData:
    parts = tuple(np.frombuffer((STDLIB / n).read_bytes(), dtype=np.uint8).astype(np.uint16) for n in names)
    return TokenData(parts, vocab_size=256, eot=0)


def record(bound, data, config, directory: Path | None, seed: int = 5, kept: bytes | None = None):
    spec = bound.model_spec(data)
    model = bound.build(spec, samples=len(data), seed=1)
    recorder = TrajectoryRecorder(directory, config.segments)
    result = bound.train(model, data, config, seed=seed, kept_state=kept,
                        trajectory=recorder)
    return spec, model, recorder.commitment("job-1", WORKER, "cpu"), result


def boundary(directory: Path, index: int) -> bytes:
    return (directory / boundary_name(index)).read_bytes()


def fill(bound, spec, data, config, commitment, directory: Path, seed: int = 5) -> None:
    """Write the boundaries the recorder did not keep, recomputed as a worker opens them (checked there)."""
    n = len(commitment.state_hashes)
    assert sorted(p.name for p in directory.iterdir()) == [boundary_name(i) for i in kept_boundaries(n)]
    opened = open_boundaries(bound, spec, data, config, seed, commitment, directory, range(n))
    for index, blob in opened.items():
        if index not in kept_boundaries(n):
            (directory / boundary_name(index)).write_bytes(blob)


MLP = bind_task(TaskRef(name="mlp", params={"hidden": 16}))
MLP_CONFIG = JobConfig(epochs=2, batch_size=32, learning_rate=1e-2, segments=8)  # 20 steps, 7 segments of 3


@pytest.fixture(scope="module")
def mlp_job(tmp_path_factory):
    directory = tmp_path_factory.mktemp("mlp") / "trajectory"
    spec, model, commitment, _ = record(MLP, synthetic(), MLP_CONFIG, directory)
    fill(MLP, spec, synthetic(), MLP_CONFIG, commitment, directory)
    return spec, model, commitment, directory


def test_every_committed_mlp_segment_re_executes_bit_for_bit(mlp_job):
    spec, model, commitment, directory = mlp_job
    assert (commitment.steps, commitment.segment_steps, commitment.segments) == (20, 3, 7)
    assert sorted(p.name for p in directory.iterdir()) == [boundary_name(i) for i in range(8)]
    assert commitment.model_hashes[-1] == tensor_digest(model.state_dict())
    for segment in range(commitment.segments):
        assert boundary_hashes(boundary(directory, segment)) == (commitment.model_hashes[segment],
                                                                 commitment.state_hashes[segment])
        again = reexecute_segment(MLP, spec, synthetic(), MLP_CONFIG, 5, commitment, segment,
                                  boundary(directory, segment))
        assert again.problem is None
        assert (again.model_hash, again.state_hash) == (commitment.model_hashes[segment + 1],
                                                        commitment.state_hashes[segment + 1])
        assert boundary_hashes(again.end) == boundary_hashes(boundary(directory, segment + 1))  # the bytes may
        # differ: safetensors writes its metadata map in no fixed order
    assert relative_distance(again.model, model.state_dict(), model.state_dict()) == 0.0


def test_a_lazy_end_state_another_dataset_and_a_wrong_start_are_caught(mlp_job):
    spec, _, commitment, directory = mlp_job
    data = synthetic()
    # A lazy worker: one step of the segment's three, from the committed start.
    model = MLP.build(spec, samples=len(data))
    optimizer, scheduler = MLP.task.configure_optimizer(model, MLP.params, MLP_CONFIG, 20)
    load_boundary(boundary(directory, 2), model, optimizer, scheduler)
    train_step(MLP.task, model, (data.features[:32], data.labels[:32]), MLP.params, optimizer, scheduler,
               torch.device("cpu"), None)
    lazy = boundary_hashes(encode_boundary(model, optimizer, scheduler))
    honest = reexecute_segment(MLP, spec, data, MLP_CONFIG, 5, commitment, 2, boundary(directory, 2))
    assert lazy[0] != honest.model_hash and lazy[1] != honest.state_hash
    start = {k[len("model/"):]: v for k, v in decode_state(boundary(directory, 2)).items() if k.startswith("model/")}
    assert relative_distance(model.state_dict(), honest.model, start) > 0.3  # a third of the way

    moved = LabeledData(data.features + 0.5, data.labels, data.num_classes)
    other = reexecute_segment(MLP, spec, moved, MLP_CONFIG, 5, commitment, 3, boundary(directory, 3))
    assert other.problem == "batch order of segment 0 differs from the commitment"
    reseeded = reexecute_segment(MLP, spec, data, MLP_CONFIG, 6, commitment, 3, boundary(directory, 3))
    assert reseeded.problem == "batch order of segment 0 differs from the commitment"
    wrong = reexecute_segment(MLP, spec, data, MLP_CONFIG, 5, commitment, 3, boundary(directory, 4))
    assert wrong.problem == "opened start state does not match the commitment"
    junk = reexecute_segment(MLP, spec, data, MLP_CONFIG, 5, commitment, 3, b"\x00" * 64)
    assert junk.problem is not None and "malformed" in junk.problem
    longer = reexecute_segment(MLP, spec, data, MLP_CONFIG.model_copy(update={"epochs": 3}), 5, commitment, 3,
                               boundary(directory, 3))
    assert longer.problem is not None and "commits 20 steps" in longer.problem


def test_a_boundary_of_another_model_or_scheduler_is_refused(mlp_job):
    spec, _, _, directory = mlp_job
    wide = bind_task(TaskRef(name="mlp", params={"hidden": 32}))
    model = wide.build(spec.model_copy(update={"hidden": 32}))
    optimizer, scheduler = wide.task.configure_optimizer(model, wide.params, MLP_CONFIG, 20)
    with pytest.raises(TrainingError, match="does not fit"):
        load_boundary(boundary(directory, 1), model, optimizer, scheduler)
    model = MLP.build(spec)
    optimizer, scheduler = MLP.task.configure_optimizer(model, MLP.params, MLP_CONFIG, 20)
    blob = boundary(directory, 1)
    planted = {**decode_metadata(blob), "scheduler": json.dumps({"base_lrs": "os.system"})}
    with pytest.raises(TrainingError, match="scheduler"):
        load_boundary(encode_state(decode_state(blob), planted), model, optimizer, scheduler)
    planted = {**decode_metadata(blob), "scalars": json.dumps({"0": {"step": "x"}})}
    with pytest.raises(TrainingError, match="not numbers"):
        load_boundary(encode_state(decode_state(blob), planted), model, optimizer, scheduler)
    with pytest.raises(TrainingError, match="not a trajectory boundary"):
        boundary_hashes(encode_state({"model/x": torch.zeros(2)}, {"kind": "task_state"}))


def test_gpt_segments_with_dropout_and_a_resumed_optimizer_re_execute_bit_for_bit(tmp_path):
    bound = bind_task(TaskRef(name="gpt", params=TINY_GPT))
    data = byte_tokens("textwrap.py")
    config = JobConfig(epochs=2, batch_size=16, learning_rate=3e-3, rounds=2, segments=4)  # 6 steps: 3 x 2
    first = train_task(bound.task, bound.build(bound.model_spec(data), samples=len(data), seed=1), data,
                       bound.params, config, seed=2)
    spec, model, commitment, result = record(bound, data, config, tmp_path, seed=3, kept=first.task_state)
    assert result.resumed and (commitment.steps, commitment.segment_steps) == (6, 2)
    fill(bound, spec, data, config, commitment, tmp_path, seed=3)  # boundary 2 recomputed with dropout
    for segment in range(commitment.segments):
        again = reexecute_segment(bound, spec, data, config, 3, commitment, segment, boundary(tmp_path, segment))
        assert again.problem is None
        assert again.state_hash == commitment.state_hashes[segment + 1]
    assert commitment.model_hashes[-1] == tensor_digest(model.state_dict())


def test_a_segment_traced_step_by_step_replays_one_step_from_any_state_on_it_with_dropout(tmp_path):
    """What a dispute needs: every step seeded on its own, so the state after any step (not only a boundary)
    and that step's index are all the referee needs to train the next one."""
    bound = bind_task(TaskRef(name="gpt", params=TINY_GPT))
    data = byte_tokens("textwrap.py")
    config = JobConfig(epochs=2, batch_size=16, learning_rate=3e-3, segments=2)  # 6 steps: 2 segments of 3
    spec, _, commitment, _ = record(bound, data, config, tmp_path, seed=3)
    fill(bound, spec, data, config, commitment, tmp_path, seed=3)
    start = boundary(tmp_path, 1)  # segment 1: steps 3, 4 and 5
    traced = trace_segment(bound, spec, data, config, 3, commitment, 1, start, points=(1, 2, 3))
    assert traced.end.state_hash == traced.trace[-1] == commitment.state_hashes[2]
    assert len(set(traced.trace)) == 3
    after_one = trace_segment(bound, spec, data, config, 3, commitment, 1, start, points=(1,), stop=1)
    assert after_one.end.state_hash == after_one.trace[0] == traced.trace[0]
    assert replay_step(bound, spec, data, config, 3, commitment, 3, start).state_hash == traced.trace[0]
    assert replay_step(bound, spec, data, config, 3, commitment, 4, after_one.end.end).state_hash == traced.trace[1]
    # the step's index picks its batch and its dropout: the same state trained as another step lands elsewhere
    assert replay_step(bound, spec, data, config, 3, commitment, 5, after_one.end.end).state_hash != traced.trace[1]
    unfit = replay_step(bound, spec, data, config, 3, commitment, 4, b"\x00" * 64)
    assert unfit.problem is not None and not unfit.state_hash
    with pytest.raises(ValueError, match="do not lie"):
        trace_segment(bound, spec, data, config, 3, commitment, 1, start, points=(2, 1))
    with pytest.raises(ValueError, match="do not lie"):
        trace_segment(bound, spec, data, config, 3, commitment, 1, start, points=(3,), stop=2)


def test_without_a_recorder_training_is_as_before_and_the_recorder_leaves_the_rng_alone():
    config = MLP_CONFIG
    data = synthetic()
    plain = MLP.build(MLP.model_spec(data), samples=len(data), seed=1)
    MLP.train(plain, data, config, seed=5)
    rng = torch.get_rng_state()
    _, recorded, _, _ = record(MLP, data, config, None)
    assert torch.equal(rng, torch.get_rng_state())
    assert all(torch.equal(v, recorded.state_dict()[k]) for k, v in plain.state_dict().items())


class _Overpromising(TrainingTask):
    name = "overpromising"

    def build_model(self, info, params):
        return torch.nn.Linear(8, 3)

    def steps_per_epoch(self, data, params, batch_size):
        return super().steps_per_epoch(data, params, batch_size) + 1


def test_a_task_whose_batches_do_not_match_its_steps_cannot_commit():
    task = _Overpromising()
    with pytest.raises(TrainingError, match="steps_per_epoch"):
        train_task(task, task.build_model(None, None), synthetic(64), task.params(), MLP_CONFIG, seed=0,
                   trajectory=TrajectoryRecorder(None, 8))


@pytest.mark.parametrize("encoding", ["weights", "float32", "int8"])
def test_the_commitment_rides_in_the_checkpoint_of_every_encoding(mlp_job, tmp_path, encoding):
    spec, model, commitment, _ = mlp_job
    reference = MLP.build(spec, seed=1).state_dict()
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    write_checkpoint(state, reference, tmp_path, tmp_path, {"job_id": "job-1", "update_encoding": encoding},
                     commitment)
    blob = (tmp_path / CHECKPOINT_FILE).read_bytes()
    assert read_commitment(blob) == commitment
    assert decode_metadata(blob)["job_id"] == "job-1"
    decoded = decode_update(blob, reference, encoding)
    if encoding == "weights":
        assert tensor_digest(decoded) == commitment.model_hashes[-1]
    write_checkpoint(state, reference, tmp_path, tmp_path, {"job_id": "job-1", "update_encoding": encoding})
    assert read_commitment((tmp_path / CHECKPOINT_FILE).read_bytes()) is None


def test_a_malformed_commitment_is_an_error(mlp_job):
    commitment = mlp_job[2]
    with pytest.raises(TrainingError, match="malformed trajectory commitment"):
        read_commitment(encode_state({"x": torch.zeros(1)}, {COMMITMENT_KEY: "{not json"}))
    short = commitment.model_dump(mode="json")
    short["batch_hashes"] = short["batch_hashes"][:-1]
    with pytest.raises(TrainingError, match="malformed trajectory commitment"):
        read_commitment(encode_state({"x": torch.zeros(1)}, {COMMITMENT_KEY: json.dumps(short)}))
    with pytest.raises(TrainingError, match="header"):
        read_commitment(struct.pack("<Q", 1 << 40) + b"{}")
    with pytest.raises(TrainingError):
        read_commitment(b"\x01")


def test_the_trajectory_leaves_the_sandbox_as_regular_files_only(tmp_path, mlp_job):
    every = range(8)
    wanted = [boundary(mlp_job[3], i) for i in every]
    out = tmp_path / "out"
    out.mkdir()
    source = tmp_path / "sandbox-out"
    shutil.copytree(mlp_job[3], source)
    take_trajectory(source, out / "copy", boundaries=every, max_bytes=1 << 20, max_total_bytes=1 << 24)
    assert [p.read_bytes() for p in sorted((out / "copy").iterdir())] == wanted
    assert list(source.iterdir()) == []  # moved, not doubled on the provider's disk
    shutil.rmtree(source)
    shutil.copytree(mlp_job[3], source)
    with pytest.raises(TrainingError, match="not its 9 boundary files"):
        take_trajectory(source, out / "copy", boundaries=range(9), max_bytes=1 << 20, max_total_bytes=1 << 24)
    with pytest.raises(TrainingError, match="not its 3 boundary files"):  # more than the kept ones
        take_trajectory(source, out / "copy", boundaries=kept_boundaries(8), max_bytes=1 << 20,
                        max_total_bytes=1 << 24)
    assert not (out / "copy").exists()
    with pytest.raises(TrainingError):
        take_trajectory(source, out / "copy", boundaries=every, max_bytes=1 << 20, max_total_bytes=1000)
    linked = tmp_path / "linked"
    linked.symlink_to(source, target_is_directory=True)
    with pytest.raises(TrainingError, match="no usable trajectory"):
        take_trajectory(linked, out / "copy", boundaries=every, max_bytes=1 << 20, max_total_bytes=1 << 24)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / boundary_name(0)).symlink_to(source / boundary_name(0))
    with pytest.raises(TrainingError):
        take_trajectory(planted, out / "copy", boundaries=[0], max_bytes=1 << 20, max_total_bytes=1 << 24)


async def test_a_sandboxed_job_commits_its_trajectory_and_recomputes_the_boundaries_it_did_not_keep(tmp_path):
    from aitbc_agent_sdk.host._sandbox import available_backends
    if "bwrap" not in available_backends():
        pytest.skip("bubblewrap does not work here")
    data = synthetic(200)
    spec = MLP.model_spec(data)
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    write_shard(job_dir, data)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(MLP.build(spec, seed=1).state_dict()))
    process = TrainingProcess(tmp_path / "work", sandbox=TrainingSandbox(job_timeout_s=120))
    await process.start()
    try:
        await process.train(job_dir, job_id="job-1", model=spec, config=MLP_CONFIG, seed=5, owner="t1",
                            update_encoding="int8", worker=WORKER)
        commitment = read_commitment((job_dir / CHECKPOINT_FILE).read_bytes())
        assert commitment is not None and commitment.worker.lower() == WORKER and commitment.job_id == "job-1"
        kept = kept_boundaries(len(commitment.state_hashes))  # 8 boundaries: 0, 2 and 5 kept
        files = {int(p.stem): p.read_bytes() for p in (job_dir / TRAJECTORY_DIR).iterdir()}
        assert sorted(files) == list(kept) == [0, 2, 5]
        assert all(boundary_hashes(blob)[1] == commitment.state_hashes[i] for i, blob in files.items())
        # A spot check asks for segments 0 and 3: boundaries 1, 3 and 4 are recomputed in the sandbox.
        again_dir = tmp_path / "again"
        again_dir.mkdir()
        write_shard(again_dir, data)
        for index in (0, 2):
            (again_dir / boundary_name(index)).write_bytes(files[index])
        await process.recompute(again_dir, job_id="job-1", model=spec, config=MLP_CONFIG, seed=5,
                                 commitment=commitment, wanted=(1, 3, 4), owner="t1")
    finally:
        await process.stop()
    recomputed = {int(p.stem): p.read_bytes() for p in (again_dir / TRAJECTORY_DIR).iterdir()}
    assert sorted(recomputed) == [1, 3, 4]
    assert all(boundary_hashes(blob)[1] == commitment.state_hashes[i] for i, blob in recomputed.items())
    again = reexecute_segment(MLP, spec, data, MLP_CONFIG, 5, commitment, 3, recomputed[3])
    assert again.problem is None and again.state_hash == commitment.state_hashes[4]


def test_several_segments_re_execute_in_one_pass_like_one_at_a_time(mlp_job):
    from aitbc_agent_sdk.tasks._trajectory_replay import reexecute_segments
    spec, _, commitment, directory = mlp_job
    data = synthetic()
    picked = {s: boundary(directory, s) for s in (1, 3, commitment.segments - 1)}
    together = reexecute_segments(MLP, spec, data, MLP_CONFIG, 5, commitment, picked)
    assert set(together) == set(picked)
    for segment, again in together.items():
        alone = reexecute_segment(MLP, spec, data, MLP_CONFIG, 5, commitment, segment, picked[segment])
        assert again.problem is None and again.state_hash == alone.state_hash == commitment.state_hashes[segment + 1]
    wrong = {**picked, 3: boundary(directory, 2)}  # one opened state is not segment 3's
    found = reexecute_segments(MLP, spec, data, MLP_CONFIG, 5, commitment, wrong)
    assert "does not match" in found[3].problem and found[1].problem is None


def test_a_commitment_of_the_segment_seeded_version_is_refused_as_malformed_not_replayed(mlp_job):
    """Version 1 seeded the RNG each segment; a replay now seeds each step, so an honest old worker's
    segments with dropout would not match: its commitment is malformed (unpaid, not slashed), never replayed."""
    _, _, commitment, _ = mlp_job
    assert commitment.version == 2
    old = json.loads(commitment.model_dump_json()) | {"version": 1}
    with pytest.raises(ValidationError):
        TrajectoryCommitment.model_validate(old)


def test_the_gpu_checks_dispute_trace_agrees_bit_for_bit_on_a_cpu():
    """scripts/dispute_trace_check.py, which scripts/gpu_check.sh runs on a card, on this CPU: two traces of
    a segment and each step replayed alone all hash alike (it exits 1 when they do not)."""
    from scripts.dispute_trace_check import measure

    found = measure(torch.device("cpu"))
    steps = found["segment_steps"]
    assert steps == 8 and found["repeatable_steps"] == found["replayed_alone_steps"] == steps
    assert found["ends_as_committed"]
