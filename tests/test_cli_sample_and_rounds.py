"""``distributed-training sample`` of a tiny GPT stored with its corpus in a real local content store, its errors,
and the per-round views (monitor's table, the report's tables, the live line, the plot): validation loss, the task's own
metric instead of a meaningless accuracy, and the model bytes each way. (A trained GPT's text comes from the
devnet GPT test; training one here would cost tens of seconds.)"""

from __future__ import annotations

import asyncio
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from rich.console import Console

from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.coordinator._monitor import Snapshot
from aitbc_agent_sdk.coordinator.data._generation import NotSampleableError, SampleRequest, prompt_tokens, sample_text
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.coordinator.data._tasks import TaskCache
from aitbc_agent_sdk.errors import ConfigError
from aitbc_agent_sdk.records import (
    EscrowSummary, RoundMetrics, RoundReport, TaskRef, TrainingPhase, TrainingRecord, TrainingReport, TrainingSpec,
)
from aitbc_agent_sdk.records._datasets import TokenLayout
from aitbc_agent_sdk.records._inert import visible
from aitbc_agent_sdk.storage import LocalContentStore
from aitbc_agent_sdk.data._datasets import LabeledData
from aitbc_agent_sdk.wire._checkpoint import encode_state
from aitbc_agent_sdk.data._corpus import decode_bytes
from aitbc_agent_sdk.tasks._gpt import GPT, generate
from aitbc_agent_sdk.tasks._gpt_task import GptTask
from aitbc_agent_sdk.tasks._task import DataInfo
from aitbc_cli.app import main
from aitbc_cli.plot import plot_report
from aitbc_cli.render import round_detail
from aitbc_cli.report_view import bytes_text, final_text, report_tables, round_columns
from aitbc_cli.training_views import render_snapshot

CID = "QmULKig5Fxrs2sC4qt9nNduucXfb92AFYQ6Hi3YRqDmrYC"
ADDRESS = "0x" + "ab" * 20
PATTERN = "abcd" * 64  # the corpus: a text dataset of one file
GPT_PARAMS = {"layers": 1, "heads": 2, "width": 32, "context": 16}


def gpt_and_state() -> tuple[GPT, dict[str, torch.Tensor]]:
    """A one-block GPT of the task's shape, weights drawn from a seed of its own: what a fresh build gives
    differs, so a sample that matches this model's own greedy text was made from the stored weights.
    (Training one until its text is recognisable takes tens of seconds on a busy 2-core machine.)"""
    task = GptTask()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(1234)
        model = task.build_model(DataInfo(feature_shape=(1,), num_classes=257, samples=0), task.params(GPT_PARAMS))
        for p in model.parameters():
            p.data.normal_(0.0, 0.5)  # far from GPT-2's init, whose greedy text repeats the last byte
    assert isinstance(model, GPT)
    return model, model.state_dict()


async def store_training(home: Path, *, language_model: bool = True, with_model: bool = True) -> TrainingRecord:
    """A training as a run leaves it under ``home``: its record in aitbc.db, dataset and model in home/store."""
    store = LocalContentStore(home / "store")
    data = DatasetStore(store, home / "datasets")
    if language_model:
        corpus = home.parent / "corpus"
        corpus.mkdir(exist_ok=True)
        (corpus / "pattern.txt").write_text(PATTERN)
        dataset_cid, _ = await data.import_dataset(corpus)
        spec = TrainingSpec(model_type="transformer", target_workers=1, task=TaskRef(name="gpt", params=GPT_PARAMS))
        _, state = gpt_and_state()
    else:
        digits = LabeledData(torch.randn(20, 4), torch.arange(20) % 2, 2)
        dataset_cid, _ = await data.import_dataset(digits)
        spec = TrainingSpec(model_type="mlp", target_workers=1)
        state = {"w": torch.zeros(2)}
    model_cid = await store.add(encode_state(state)) if with_model else None
    record = TrainingRecord(training_id=f"training_{'lm' if language_model else 'mlp'}{int(with_model)}",
                            spec=spec, coordinator=ADDRESS, dataset_cid=dataset_cid, model_cid=model_cid,
                            phase=TrainingPhase.TRAINING, round=3 if with_model else 0)
    async with TrainingDatabase(home / "aitbc.db") as db:
        await db.save_training(record)
    return record


def run_cli(args: list[str], capsys: pytest.CaptureFixture[str]) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as done:
        main(args)
    out = capsys.readouterr()
    return int(done.value.code or 0), out.out, out.err


def test_sample_generates_from_the_stored_model(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The stored weights, rebuilt through the training's task and dataset, give the model's own greedy text;
    the CLI prints the same text, and the same seed gives the same sampled text."""
    home = tmp_path / "home"
    record = asyncio.run(store_training(home))
    model, _ = gpt_and_state()
    expected = decode_bytes(np.asarray(generate(model, list(b"abcdab"), 12, temperature=0.0)))
    store = LocalContentStore(home / "store")
    result = asyncio.run(sample_text(store, DatasetStore(store, None), TaskCache(store, tmp_path / "tasks"), record,
                                     SampleRequest("abcdab", tokens=12, temperature=0.0)))
    assert (result.text, result.tokens, result.model_cid, result.round) == (expected, 12, record.model_cid, 3)

    code, out, err = run_cli(["distributed-training", "sample", "--training-id", record.training_id, "--home",
                              str(home), "--prompt", "abcdab", "--tokens", "12", "--temperature", "0", "--json"],
                             capsys)
    assert code == 0, err
    assert json.loads(out)["text"] == expected
    seeded = [run_cli(["distributed-training", "sample", "--training-id", record.training_id, "--home", str(home),
                       "--prompt", "ab", "--tokens", "20", "--seed", "7"], capsys) for _ in range(2)]
    assert seeded[0][0] == 0 and seeded[0][1] == seeded[1][1] and "20 tokens from" in seeded[0][1], seeded


def test_a_classifier_or_a_training_without_a_model_cannot_be_sampled(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home = tmp_path / "home"
    classifier = asyncio.run(store_training(home, language_model=False))
    untrained = asyncio.run(store_training(home, with_model=False))
    for record, why in ((classifier, "is not a language model"), (untrained, "has no model yet")):
        code, out, _ = run_cli(["distributed-training", "sample", "--training-id", record.training_id, "--home",
                                str(home), "--prompt", "x", "--json"], capsys)
        error = json.loads(out)
        assert (code, error["type"]) == (2, "NotSampleableError") and why in error["error"], error

    async def through_the_agent() -> None:  # the facade says the same (an embedded agent of that home)
        async with Agent(AgentConfig(home=home, providers=0, auto_resume=False)) as agent:
            with pytest.raises(NotSampleableError, match="not a language model"):
                await agent.sample_text(classifier.training_id, "x")
    asyncio.run(through_the_agent())


@pytest.mark.parametrize(("request_", "why"), [
    (SampleRequest("x", tokens=0), "tokens must lie"), (SampleRequest("x", tokens=5000), "tokens must lie"),
    (SampleRequest("x" * 20_000), "above the limit"), (SampleRequest("x", temperature=-1.0), "temperature"),
    (SampleRequest("x", temperature=float("nan")), "temperature"), (SampleRequest("x", top_k=0), "top_k"),
])
def test_sample_requests_out_of_bounds_are_refused(request_: SampleRequest, why: str) -> None:
    with pytest.raises(ConfigError, match=why):
        request_.check()


def test_prompts_are_byte_tokens_and_an_empty_one_starts_a_document() -> None:
    layout = TokenLayout(vocab_size=257, eot=256)
    assert prompt_tokens("hé", layout) == [104, 0xC3, 0xA9]
    assert prompt_tokens("", layout) == [256]


def test_sampled_text_cannot_drive_the_terminal() -> None:
    """A model may emit any byte: escape sequences are shown, not obeyed; newlines, tabs and é stay."""
    assert visible("a\x1b[31mb\nc\td\u00e9\x07", multiline=True) == "a\\x1b[31mb\nc\td\u00e9\\x07"


# -- rounds ------------------------------------------------------------------------------------
def lm_round(n: int, sent: int | None = 3 << 20, received: int | None = 1536) -> RoundMetrics:
    return RoundMetrics(round=n, accuracy=0.0, loss=2.5 - n / 10, model_cid=CID, workers=2,
                        metrics={"loss": 2.5 - n / 10, "perplexity": 12.18, "bits_per_token": 3.6},
                        bytes_sent=sent, bytes_received=received)


def classifier_round(n: int) -> RoundMetrics:
    return RoundMetrics(round=n, accuracy=0.91, loss=0.3, model_cid=CID, workers=2,
                        metrics={"accuracy": 0.91, "loss": 0.3})


def text_of(renderable: object) -> str:
    """As an 80-column terminal shows it (a column that does not fit is cut short: its values would lose)."""
    console = Console(record=True, width=80)
    console.print(renderable)
    return console.export_text()


def test_byte_counts_are_shown_in_binary_units() -> None:
    assert [bytes_text(n) for n in (None, 0, 1023, 1536, 3 << 20, 5 << 30)] == [
        "-", "0 B", "1023 B", "1.5 KiB", "3.0 MiB", "5.0 GiB"]


def test_a_language_models_rounds_show_its_metric_and_bytes_not_an_accuracy() -> None:
    lm = [name for name, _ in round_columns([lm_round(1), lm_round(2)])]
    assert lm == ["val loss", "perplexity", "sent", "received"]  # the task's first metric: 80 columns
    classifier = [name for name, _ in round_columns([classifier_round(1)])]
    assert classifier == ["accuracy", "val loss"]  # no bytes counted: no empty columns
    old = RoundMetrics(round=1, accuracy=0.8, loss=0.4, model_cid=CID, workers=1)  # saved before metrics existed
    assert [name for name, _ in round_columns([old])] == ["accuracy", "val loss"]
    line = round_detail(lm_round(1, received=None))
    assert "accuracy" not in line and "perplexity 12.1800" in line and "sent 3.0 MiB received -" in line
    assert round_detail(classifier_round(1)).startswith("accuracy 0.9100")


def test_monitor_shows_validation_loss_metric_and_bytes_per_round_in_table_and_json() -> None:
    snap = Snapshot(training_id="training_lm", phase=TrainingPhase.TRAINING, round=2, rounds=3, model_type="gpt",
                    workers=[], round_metrics=[lm_round(1), lm_round(2)], payments=[], escrow=None)
    table = text_of(render_snapshot(snap))
    assert "perplexity" in table and "12.1800" in table and "3.0 MiB" in table and "1.5 KiB" in table
    assert "accuracy" not in table and "2.3000" in table  # round 2's validation loss
    rounds = json.loads(snap.model_dump_json())["round_metrics"]
    assert [(r["loss"], r["metrics"]["perplexity"], r["bytes_sent"], r["bytes_received"]) for r in rounds] == [
        (2.4, 12.18, 3 << 20, 1536), (2.3, 12.18, 3 << 20, 1536)]


def lm_report(rounds: list[RoundMetrics]) -> TrainingReport:
    reports = tuple(RoundReport(round=r.round, accuracy=r.accuracy, loss=r.loss, model_cid=r.model_cid,
                                worker_losses={ADDRESS: r.loss + 0.1}, workers=r.workers, metrics=r.metrics,
                                bytes_sent=r.bytes_sent, bytes_received=r.bytes_received) for r in rounds)
    return TrainingReport(training_id="training_lm", status=TrainingPhase.COMPLETE, final_accuracy=0.0,
                          model_cid=CID, manifest_cid=CID, rounds=reports, workers=(),
                          escrow=EscrowSummary(address=ADDRESS, deposited_wei=0, paid_wei=0, refunded_wei=0),
                          refund_tx=None, wall_seconds=1.0, compute_seconds=1.0)


def png_width(path: Path) -> int:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n"
    return struct.unpack(">I", header[16:20])[0]


def test_the_report_and_its_plot_carry_bytes_per_round(tmp_path: Path) -> None:
    """A panel of bytes sent and received is added when the coordinator counted them (a wider figure)."""
    counted, uncounted = lm_report([lm_round(1), lm_round(2)]), lm_report([lm_round(1, None, None)])
    rounds_table = text_of(report_tables(counted)[0])
    assert "perplexity" in rounds_table and "12.1800" in rounds_table and "accuracy" not in rounds_table
    assert "received" in rounds_table and "3.0 MiB" in rounds_table and "1.5 KiB" in rounds_table
    plot_report(counted, tmp_path / "counted.png")
    plot_report(uncounted, tmp_path / "uncounted.png")
    assert png_width(tmp_path / "counted.png") > 1.4 * png_width(tmp_path / "uncounted.png")


def test_the_final_line_names_a_language_models_loss_and_metric_not_a_zero_accuracy() -> None:
    text = final_text(lm_report([lm_round(1), lm_round(2)]))
    assert text == "final validation loss 2.3000, perplexity 12.1800", text
    classifier = lm_report([classifier_round(1)]).model_copy(update={"final_accuracy": 0.91})
    assert final_text(classifier) == "final accuracy 0.9100"
