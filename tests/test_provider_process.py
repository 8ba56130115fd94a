"""The provider's training process: a separate OS process with a scrubbed environment."""

import asyncio
import os
from pathlib import Path

import pytest

from aitbc_agent_sdk.errors import TrainingError
from aitbc_agent_sdk.host._sandbox_plan import scrubbed_env
from aitbc_agent_sdk.records import JobConfig
from aitbc_agent_sdk.provider._hardware import detect_hardware
from aitbc_agent_sdk.provider._process import TrainingProcess
from aitbc_agent_sdk.provider._worker_process import CHECKPOINT_FILE, WEIGHTS_FILE
from aitbc_agent_sdk.tasks._networks import build_model, model_spec_for
from aitbc_agent_sdk.wire._checkpoint import decode_state, encode_state
from aitbc_agent_sdk.data._datasets import load_dataset
from aitbc_agent_sdk.data._shard_files import write_shard


def test_scrubbed_env_keeps_only_the_allow_list(tmp_path):
    env = scrubbed_env(tmp_path, 1, {"PATH": "/bin", "AITBC_WALLET_PASSWORD": "hunter2",
                                     "AWS_SECRET_ACCESS_KEY": "x", "LANG": "C.UTF-8"})
    assert env["PATH"] == "/bin" and env["LANG"] == "C.UTF-8"
    assert "AITBC_WALLET_PASSWORD" not in env and "AWS_SECRET_ACCESS_KEY" not in env
    assert env["HOME"] == str(tmp_path) and env["OMP_NUM_THREADS"] == "1"


async def test_a_job_runs_in_another_process_without_the_parents_secrets(tmp_path, monkeypatch):
    monkeypatch.setenv("AITBC_WALLET_PASSWORD", "hunter2")
    data = load_dataset("digits").subset(list(range(200)))
    model = build_model(model_spec_for("mlp", data), seed=0)
    job_dir = tmp_path / "jobs" / "j1"
    job_dir.mkdir(parents=True)
    write_shard(job_dir, data)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(model.state_dict()))

    process = TrainingProcess(tmp_path / "work")
    await process.start()
    try:
        assert process.pid != os.getpid()
        environ = Path(f"/proc/{process.pid}/environ").read_bytes()
        assert b"hunter2" not in environ
        epochs = []
        done = await process.train(job_dir, job_id="j1", model=model_spec_for("mlp", data),
                                   config=JobConfig(epochs=2), seed=1, on_epoch=epochs.append)
    finally:
        await process.stop()
    assert done["samples"] == 200 and [e["epoch"] for e in epochs] == [1, 2]
    trained = decode_state((job_dir / CHECKPOINT_FILE).read_bytes())
    assert not all((trained[k] == v).all() for k, v in model.state_dict().items())


async def test_a_broken_job_is_reported_and_the_process_survives(tmp_path):
    data = load_dataset("digits").subset(list(range(50)))
    job_dir = tmp_path / "j"
    job_dir.mkdir()
    write_shard(job_dir, data)
    (job_dir / WEIGHTS_FILE).write_bytes(b"not safetensors")
    process = TrainingProcess(tmp_path / "work")
    await process.start()
    try:
        with pytest.raises(TrainingError):
            await process.train(job_dir, job_id="j", model=model_spec_for("mlp", data), config=JobConfig(), seed=0,
                                owner="t1")
        pid = process.pid
        model = build_model(model_spec_for("mlp", data), seed=0)
        (job_dir / WEIGHTS_FILE).write_bytes(encode_state(model.state_dict()))
        done = await process.train(job_dir, job_id="j", model=model_spec_for("mlp", data), config=JobConfig(), seed=0,
                                owner="t1")
        assert done["samples"] == 50 and process.pid == pid
    finally:
        await process.stop()


async def test_a_model_larger_than_the_job_declares_fails_before_it_trains(tmp_path):
    data = load_dataset("digits").subset(list(range(50)))
    job_dir = tmp_path / "j"
    job_dir.mkdir()
    write_shard(job_dir, data)
    spec = model_spec_for("mlp", data)
    model = build_model(spec, seed=0)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(model.state_dict()))
    count = sum(p.numel() for p in model.parameters())
    process = TrainingProcess(tmp_path / "work")
    await process.start()
    try:
        with pytest.raises(TrainingError, match=f"the job declares {count - 1:,}"):
            await process.train(job_dir, job_id="j", model=spec, config=JobConfig(), seed=0, max_parameters=count - 1)
        done = await process.train(job_dir, job_id="j2", model=spec, config=JobConfig(), seed=0, max_parameters=count)
        assert done["samples"] == 50
    finally:
        await process.stop()


def test_hardware_is_detected_honestly():
    hardware = detect_hardware()
    assert hardware.cpu_cores == os.cpu_count()
    assert hardware.ram_bytes > 0
    # no NVIDIA driver on this machine: no GPU may be claimed
    if not Path("/proc/driver/nvidia").exists():
        assert hardware.gpus == () and hardware.gpu_type == "cpu"


def write_job_inputs(job_dir: Path, samples: int) -> tuple:
    data = load_dataset("digits").subset(list(range(samples)))
    spec = model_spec_for("mlp", data)
    job_dir.mkdir(parents=True)
    write_shard(job_dir, data)
    (job_dir / WEIGHTS_FILE).write_bytes(encode_state(build_model(spec, seed=0).state_dict()))
    return data, spec


def is_gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


async def test_kill_stops_the_process_and_the_next_train_starts_a_fresh_one(tmp_path):
    _, spec = write_job_inputs(tmp_path / "j", 50)
    process = TrainingProcess(tmp_path / "work")
    await process.start()
    try:
        first_pid = process.pid
        assert first_pid is not None
        await process.kill()
        assert process.pid is None and is_gone(first_pid)
        await process.kill()  # a second kill, with nothing running, is a no-op
        done = await process.train(tmp_path / "j", job_id="j", model=spec, config=JobConfig(), seed=0)
        assert done["samples"] == 50 and process.pid not in (None, first_pid)
    finally:
        await process.stop()


async def test_cancelling_a_train_kills_the_computation(tmp_path):
    _, spec = write_job_inputs(tmp_path / "j", 400)
    process = TrainingProcess(tmp_path / "work")
    await process.start()
    first_epoch = asyncio.Event()
    try:
        training = asyncio.create_task(process.train(
            tmp_path / "j", job_id="j", model=spec, config=JobConfig(epochs=1000, batch_size=4), seed=0,
            on_epoch=lambda event: first_epoch.set()))
        await asyncio.wait_for(first_epoch.wait(), 60)
        pid = process.pid
        training.cancel()
        with pytest.raises(asyncio.CancelledError):
            await training
        assert pid is not None and is_gone(pid) and process.pid is None
        (tmp_path / "j" / CHECKPOINT_FILE).unlink(missing_ok=True)
        done = await process.train(tmp_path / "j", job_id="j2", model=spec, config=JobConfig(), seed=0)
        assert done["samples"] == 400 and (tmp_path / "j" / CHECKPOINT_FILE).exists()
    finally:
        await process.stop()
