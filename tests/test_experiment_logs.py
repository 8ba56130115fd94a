"""``--log-to``: a real embedded training writes each round to TensorBoard (read back with TensorBoard's own
reader), W&B in offline mode and MLflow on a file store; a missing library is refused before anything is
funded; and one round's figures are named as the docs say."""

from __future__ import annotations

import asyncio
import json
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingSpec
from aitbc_agent_sdk.coordinator._experiment import round_scalars
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.records import RoundMetrics, TrainingReport
from aitbc_cli.app import main

pytest.importorskip("wandb")  # the dev extra; without W&B and MLflow their half cannot be checked
pytest.importorskip("mlflow")
from mlflow.tracking import MlflowClient  # noqa: E402
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator  # noqa: E402

WORKERS = 2


@pytest.fixture(scope="module")
def logged(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, TrainingReport]:
    """Two rounds of an mlp on two embedded providers, logged to all three (W&B offline: no network)."""
    home = tmp_path_factory.mktemp("logs") / "home"
    with pytest.MonkeyPatch.context() as env:
        env.setenv("WANDB_MODE", "offline")
        env.setenv("WANDB_SILENT", "true")
        env.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # MLflow 3 keeps its file store only on request
        env.delenv("MLFLOW_TRACKING_URI", raising=False)  # so: a file store in the training's directory

        async def train() -> TrainingReport:
            async with Agent(AgentConfig(home=home, providers=WORKERS)) as agent:
                spec = TrainingSpec(model_type="mlp", target_workers=WORKERS, rounds=2,
                                    log_to=("tensorboard", "wandb", "mlflow"),
                                    job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))
                return await agent.run_distributed_training(spec)

        report = asyncio.run(train())
    return home / "trainings" / report.training_id, report


def test_tensorboards_reader_finds_every_round_and_worker(logged: tuple[Path, TrainingReport]) -> None:
    directory, report = logged
    events = EventAccumulator(str(directory / "tensorboard"))
    events.Reload()
    tags = events.Tags()["scalars"]
    loss = events.Scalars("eval/loss")
    assert [e.step for e in loss] == [1, 2]
    assert [e.value for e in loss] == pytest.approx([r.loss for r in report.rounds])
    assert [e.value for e in events.Scalars("eval/accuracy")] == pytest.approx([r.accuracy for r in report.rounds])
    workers = sorted(t for t in tags if t.startswith("worker/"))
    assert workers == sorted(f"worker/{w.address}/train_loss" for w in report.workers)
    assert all(e.value > 0 for t in workers for e in events.Scalars(t))
    assert [e.value for e in events.Scalars("round/workers")] == [WORKERS, WORKERS]
    assert all(e.value > 0 for e in events.Scalars("bytes/sent"))
    spent = [e.value for e in events.Scalars("spend/total_eth")]
    assert 0 < spent[0] < spent[1]  # each accepted round commits more in signed receipts
    assert {"verify/spot_checks_total", "verify/failed_total", "verify/slashed_total"} <= set(tags)
    assert report.training_id in events.Tensors("training/spec/text_summary")[0].tensor_proto.string_val[0].decode()


def test_mlflow_holds_the_run_with_its_metrics_and_parameters(logged: tuple[Path, TrainingReport]) -> None:
    directory, report = logged
    client = MlflowClient(tracking_uri=(directory / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("aitbc")
    assert experiment is not None
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.run_name == report.training_id and run.info.status == "FINISHED"
    history = client.get_metric_history(run.info.run_id, "eval/loss")
    assert sorted((m.step, m.value) for m in history) == [(r.round, r.loss) for r in report.rounds]
    assert run.data.params["rounds"] == "2" and run.data.params["job.epochs"] == "1"


def wandb_records(path: Path) -> list[Any]:
    """The records of a W&B transaction log (``run-ID.wandb``), parsed with W&B's own protobuf schema: a 7-byte
    file header, then LevelDB log blocks of 32 KiB whose records carry a 7-byte header (CRC, length, kind), a
    record split over blocks as first, middle and last parts. W&B 0.31 no longer ships a Python reader."""
    from wandb.proto import wandb_internal_pb2
    raw, pos, whole, part = path.read_bytes(), 7, [], b""
    assert raw[:4] == b":W&B"
    while pos + 7 <= len(raw):
        if (left := 32768 - pos % 32768) < 7:  # a block's tail too short for a header is padding
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", raw[pos:pos + 7])
        data, pos = raw[pos + 7:pos + 7 + length], pos + 7 + length
        if kind in (1, 4):  # full, last
            whole.append(part + data)
            part = b""
        elif kind in (2, 3):  # first, middle
            part += data
        else:
            break
    records = []
    for data in whole:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        records.append(record)
    return records


def test_wandb_offline_keeps_the_run_on_disk_with_every_round(logged: tuple[Path, TrainingReport]) -> None:
    directory, report = logged
    [log] = (directory / "wandb").glob(f"offline-run-*-{report.training_id}/run-{report.training_id}.wandb")
    records = wandb_records(log)
    [run] = [r.run for r in records if r.WhichOneof("record_type") == "run"]
    assert run.run_id == report.training_id and run.project == "aitbc"
    assert {u.key for u in run.config.update} >= {"job.epochs", "rounds", "training_id"}
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for r in records if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["eval/loss"]) for h in history] == [(r.round, r.loss) for r in report.rounds]
    assert all(f"worker/{w.address}/train_loss" in h for h in history for w in report.workers)
    assert any(r.WhichOneof("record_type") == "exit" for r in records)  # finished when the training closed


def test_a_missing_library_is_refused_before_anything_is_funded(aitbc_home: Path, tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # as if not installed: find_spec and import both fail
    with pytest.raises(SystemExit) as done:
        main(["distributed-training", "run", "--log-to", "tensorboard", "--log-to", "wandb", "--rounds", "1"])
    assert done.value.code == 2
    err = capsys.readouterr().err
    assert "needs the wandb library" in err and "aitbc-agent-sdk[wandb]" in err
    assert not aitbc_home.exists()  # no wallet, no stack, no training: parsing stopped it

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    with pytest.raises(SystemExit) as done:
        main(["distributed-training", "init", "--log-to", "mlflow"])
    assert done.value.code == 2 and "MLFLOW_TRACKING_URI" in capsys.readouterr().err
    assert not aitbc_home.exists()

    async def through_the_sdk() -> None:
        async with Agent(AgentConfig(home=tmp_path / "sdk", providers=1)) as agent:
            with pytest.raises(ConfigError, match="needs the wandb library"):
                await agent.coordinator.initialize(TrainingSpec(model_type="mlp", target_workers=1,
                                                                log_to=("wandb",)))
            assert await agent.coordinator.db.trainings() == []
    asyncio.run(through_the_sdk())


def test_one_round_is_named_as_the_docs_say() -> None:
    cid = "bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy"
    metrics = RoundMetrics(round=3, accuracy=0.5, loss=1.25, model_cid=cid, workers=2, round_seconds=4.0,
                           throughput=100.0, metrics={"accuracy": 0.5, "loss": 1.25}, bytes_sent=10,
                           bytes_received=None)
    scalars = round_scalars(metrics, worker_losses={"0xb": 0.5, "0xa": 0.75}, spend_wei=2 * 10**17,
                            spent_wei=10**18, checks=[{"passed": True}, {"passed": False}, {"passed": None}], slashes=1)
    assert scalars == {
        "eval/loss": 1.25, "eval/accuracy": 0.5, "round/workers": 2, "round/seconds": 4.0,
        "round/samples_per_s": 100.0, "bytes/sent": 10.0, "spend/round_eth": 0.2, "spend/total_eth": 1.0,
        "worker/0xa/train_loss": 0.75, "worker/0xb/train_loss": 0.5,
        "verify/spot_checks_total": 3, "verify/failed_total": 2, "verify/slashed_total": 1}


class KeptRounds:
    """An experiment log that keeps the steps it was given (this test's own adapter of the port)."""

    def __init__(self) -> None:
        self.steps: list[int] = []

    def log(self, step: int, scalars: dict[str, float]) -> None:
        self.steps.append(step)

    def close(self) -> None:
        pass


async def test_an_audit_log_that_cannot_be_read_skips_the_round_and_the_training_goes_on(tmp_path: Path) -> None:
    from aitbc_agent_sdk.coordinator._experiment import ExperimentRecorder
    from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
    from aitbc_agent_sdk.records import TrainingRecord

    record = TrainingRecord(training_id="training_edited", spec=TrainingSpec(model_type="mlp", target_workers=1),
                            coordinator="0x" + "11" * 20)
    audit = tmp_path / "trainings" / record.training_id / "audit.jsonl"
    audit.parent.mkdir(parents=True)
    kept = KeptRounds()
    async with TrainingDatabase(tmp_path / "aitbc.db") as db:
        await db.save_training(record)
        recorder = ExperimentRecorder(db, tmp_path / "trainings", record, [("kept", kept)])
        await db.save_round(record.training_id, RoundMetrics(
            round=1, accuracy=0.5, loss=1.0, model_cid="bafkreigh2akiscaildcqabsyg3dfr6chu3fgpregiymsck7e7aqa4s52zy",
            workers=1))
        audit.write_text("an edited line, not the hash chain\n")
        await recorder.after_round()  # a warning, not an error: the round loop goes on
        assert kept.steps == []
        audit.unlink()
        await recorder.after_round()  # the round is still owed, and written once it can be read
        await recorder.after_round()
        assert kept.steps == [1]


def test_a_resumed_training_carries_on_in_the_same_run_of_each_log(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A coordinator that resumes a training opens its logs again: round 2 lands in the run round 1 began."""
    from aitbc_agent_sdk.tracking import ExperimentRun, open_experiment_log
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    run = ExperimentRun(training_id="training_resumed", directory=tmp_path, config={"rounds": 2})
    for step in (1, 2):  # the first coordinator logs round 1 and dies; the one that resumes logs round 2
        for name in ("tensorboard", "wandb", "mlflow"):
            log = open_experiment_log(name, run)
            log.log(step, {"eval/loss": 1.0 / step})
            log.close()

    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert [(e.step, e.value) for e in events.Scalars("eval/loss")] == [(1, 1.0), (2, 0.5)]

    client = MlflowClient(tracking_uri=(tmp_path / "mlruns").as_uri())
    experiment = client.get_experiment_by_name("aitbc")
    [mlflow_run] = client.search_runs([experiment.experiment_id])  # one run, not one per coordinator
    history = client.get_metric_history(mlflow_run.info.run_id, "eval/loss")
    assert sorted((m.step, m.value) for m in history) == [(1, 1.0), (2, 0.5)]

    # Offline, each process keeps its own file under the one id (W&B adds "-1" to a directory opened in the
    # same second); `wandb sync` puts them in one run.
    logs = sorted((tmp_path / "wandb").glob("offline-run-*-training_resumed*/run-training_resumed.wandb"))
    assert len(logs) == 2
    runs = [r.run for path in logs for r in wandb_records(path) if r.WhichOneof("record_type") == "run"]
    assert {r.run_id for r in runs} == {"training_resumed"}
    history = [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in r.history.item}
               for path in logs for r in wandb_records(path) if r.WhichOneof("record_type") == "history"]
    assert [(h["_step"], h["eval/loss"]) for h in history] == [(1, 1.0), (2, 0.5)]
