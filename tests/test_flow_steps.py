"""The flow's parts that need no network: the cost preview, one home for the tuned defaults,
reading a training's log (a real audit log and SQLite store), listing trainings."""

import asyncio
import subprocess

import pytest

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.audit import AuditLog
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.records import JobConfig, TrainingPhase, TrainingRecord, TrainingSpec
from aitbc_agent_sdk.tasks._networks import MODEL_NAMES

COORD = "0x" + "ab" * 20


def test_the_preview_costs_workers_times_price_times_rounds_plus_spares():
    cost = flow.preview([10**16, 11 * 10**15], [12 * 10**15], rounds=3)
    assert cost.deposit_wei == (10**16 + 11 * 10**15) * 3
    assert cost.spares_wei == 12 * 10**15 * 3 and cost.most_wei == cost.deposit_wei + cost.spares_wei
    (what, wei), (spare_what, spare_wei) = cost.items()
    assert wei == cost.deposit_wei and "2 workers x 0.0100-0.0110 ETH x 3 rounds" in what
    assert spare_wei == cost.spares_wei and "1 spare" in spare_what
    assert cost.as_json()["deposit_wei"] == str(cost.deposit_wei)  # a string: jq-safe above 2**53
    assert flow.preview([10**16], [], rounds=1).items() == [("escrow deposit: 1 workers x 0.0100 ETH x 1 rounds",
                                                             10**16)]


def test_eth_text_is_exact_with_four_decimals():
    assert flow.eth_text(10**16) == "0.0100"
    assert flow.eth_text(123_456_789 * 10**18 + 5 * 10**13) == "123456789.0001"  # rounds half up, no float
    assert flow.eth_text(0) == "0.0000"


def test_the_tuned_defaults_live_on_jobconfig_and_every_front_end_reads_them():
    from aitbc_agent_sdk.assistant._market_tools import InitArgs

    job = JobConfig()
    assert (job.learning_rate, job.epochs, job.batch_size) == (1e-2, 2, 32)  # bench/bench_accuracy.py's best
    assert InitArgs().epochs == job.epochs
    for command in ("run", "init"):
        shown = subprocess.run(["aitbc", "distributed-training", command, "--help"], capture_output=True, text=True,
                               env={"COLUMNS": "200", "PATH": _venv_path()}, timeout=60).stdout
        lr_line = next(line for line in shown.splitlines() if "--lr" in line)
        assert "[default: 0.01]" in lr_line and "0 < lr <= 10" in lr_line, lr_line
        epochs_line = next(line for line in shown.splitlines() if "--epochs" in line)
        assert "[default: 2]" in epochs_line, epochs_line


def _venv_path() -> str:
    import os
    import sys

    return os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", "")


def test_the_cli_model_choices_are_the_sdks_models():
    from aitbc_cli.training_options import ModelType

    assert tuple(m.value for m in ModelType) == MODEL_NAMES


async def _save(home, tid: str, phase: TrainingPhase) -> None:
    async with TrainingDatabase(home / "aitbc.db") as db:
        await db.save_training(TrainingRecord(training_id=tid, spec=TrainingSpec(model_type="mlp", target_workers=2),
                                              coordinator=COORD, phase=phase))


async def test_logs_are_readable_and_follow_ends_when_the_training_does(tmp_path):
    home = tmp_path / "home"
    home.mkdir()
    await _save(home, "t1", TrainingPhase.TRAINING)
    log = AuditLog(home / "trainings" / "t1" / "audit.jsonl")
    await log.append("escrow_funded", tx="0xabc", deposit_wei=3)
    lines = [line async for line in flow.log_lines(home, "t1")]  # no daemon log: the audit log
    assert len(lines) == 1 and "#1 escrow_funded deposit_wei=3 tx=0xabc" in lines[0]

    seen: list[str] = []

    async def follow() -> None:
        async for line in flow.log_lines(home, "t1", follow=True, interval=0.05):
            seen.append(line)

    task = asyncio.create_task(follow())
    await log.append("payment", worker="w", amount_wei=1)
    while len(seen) < 2:  # the new line arrives while the training runs
        assert not task.done()
        await asyncio.sleep(0.02)
    await log.append("training_failed", reason="stopped")
    await _save(home, "t1", TrainingPhase.FAILED)
    await asyncio.wait_for(task, 10)  # a terminal phase ends --follow
    assert [line.split()[3] for line in seen] == ["escrow_funded", "payment", "training_failed"]


async def test_listing_reads_every_training_and_an_empty_home_stays_empty(tmp_path):
    home = tmp_path / "home"
    assert await flow.list_trainings(home) == [] and not home.exists()
    home.mkdir()
    await _save(home, "old", TrainingPhase.COMPLETE)
    await _save(home, "new", TrainingPhase.INITIALIZING)
    rows = await flow.list_trainings(home)
    assert [r.training_id for r in rows] == ["new", "old"]  # newest first
    assert [(r.phase, r.round, r.rounds, r.workers, r.driven) for r in rows] == [
        ("initializing", 0, 5, 0, False), ("complete", 0, 5, 0, False)]
    assert not (home / "trainings" / "new").exists()  # listing made no lock file


async def test_an_unknown_training_is_not_found(tmp_path):
    from aitbc_agent_sdk.errors import NotFoundError

    (tmp_path / "h").mkdir()
    await _save(tmp_path / "h", "t1", TrainingPhase.TRAINING)
    with pytest.raises(NotFoundError):
        [line async for line in flow.log_lines(tmp_path / "h", "nope")]
