"""A CLI that answers at once (issue #26, item 6): no torch or web3 to print help, no traceback without
--debug, whole ids in a pipe, 'latest' for the newest training, --json everywhere, monitor --follow line by
line in a pipe, a warning when the market fills fewer places than asked, and output paths checked first.

In process (``aitbc_cli.app.main`` with capsys: stdout is not a terminal there, as in a pipe) against a
real training store (SQLite) and audit log in a temporary home; one subprocess watches a training live."""

from __future__ import annotations

import asyncio
import json
import os
import queue
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import typer.main

from aitbc_agent_sdk import flow
from aitbc_agent_sdk.audit import AuditLog
from aitbc_agent_sdk.coordinator._monitor import Snapshot, WorkerView
from aitbc_agent_sdk.coordinator._training_db import TrainingDatabase
from aitbc_agent_sdk.records import Payment, RoundMetrics, TrainingPhase, TrainingRecord, TrainingSpec
from aitbc_cli.app import SUB_COMMANDS, app, load_sub_command, main, split_debug
from aitbc_cli.exits import unexpected_message
from aitbc_cli.paths import OutputPathError, check_output_file, check_writable_png
from aitbc_cli.render import hiring_warnings
from aitbc_cli.training_views import event_line, newest_training, snapshot_events

COORDINATOR = "0x" + "ab" * 20
WORKER = "0x" + "cd" * 20
CID = "QmULKig5Fxrs2sC4qt9nNduucXfb92AFYQ6Hi3YRqDmrYC"
LONG_ID = "training_" + "0123456789abcdef" * 3 + "0123456"  # 64 characters: the longest id there is
OLD_ID = "training_old"


def record(training_id: str, created_at: float, phase: TrainingPhase = TrainingPhase.TRAINING,
           round_: int = 0) -> TrainingRecord:
    return TrainingRecord(training_id=training_id, spec=TrainingSpec(model_type="mlp", target_workers=1, rounds=2),
                          coordinator=COORDINATOR, phase=phase, round=round_, created_at=created_at)


async def save(home: Path, *records: TrainingRecord, rounds: tuple[RoundMetrics, ...] = ()) -> None:
    async with TrainingDatabase(flow.db_path(home)) as db:
        for r in records:
            await db.save_training(r)
        for m in rounds:
            await db.save_round(records[0].training_id, m)


def metrics(round_: int) -> RoundMetrics:
    return RoundMetrics(round=round_, accuracy=0.5 + round_ / 10, loss=1.0 / round_, model_cid=CID, workers=1)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home with two trainings: an old one, and the newest with the longest id there is."""
    root = tmp_path / "home"
    root.mkdir()
    asyncio.run(save(root, record(OLD_ID, 1_000.0), record(LONG_ID, 2_000.0)))
    asyncio.run(AuditLog(root / "trainings" / LONG_ID / "audit.jsonl").append("training_started", rounds=2))
    return root


def cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    try:
        main(list(args))
    except SystemExit as exc:
        code = exc.code
    else:
        code = 0
    out, err = capsys.readouterr()
    return int(code or 0), out, err


# -- start-up ----------------------------------------------------------------------------------

HEAVY = ("torch", "web3", "eth_account", "numpy", "aitbc_cli.distributed_training", "aitbc_cli.chat")


def test_importing_the_cli_loads_neither_torch_nor_web3() -> None:
    """Not even the sub-commands' modules: --version and the root's --help need none of them."""
    probe = ("import sys; from aitbc_cli.app import main\n"
             "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
             f"print(sorted(m for m in {HEAVY!r} if m in sys.modules))")
    for args in (["--version"], ["--help"]):
        done = subprocess.run([sys.executable, "-c", probe, *args], capture_output=True, text=True, timeout=120,
                              check=True)
        assert done.stdout.strip().splitlines()[-1] == "[]", done.stdout
    done = subprocess.run([sys.executable, "-c", probe, "distributed-training", "--help"], capture_output=True,
                          text=True, timeout=120, check=True)
    assert done.stdout.strip().splitlines()[-1] == "['aitbc_cli.distributed_training']", done.stdout


def test_the_root_lists_each_sub_command_with_its_own_help() -> None:
    for name, (_, _, listed) in SUB_COMMANDS.items():
        command = load_sub_command(name)
        assert listed == (command.help or "").split("\n\n")[0], name


# -- --debug ------------------------------------------------------------------------------------

def test_debug_is_taken_anywhere_before_a_double_dash() -> None:
    assert split_debug(["distributed-training", "list", "--debug"], {}) == (["distributed-training", "list"], True)
    assert split_debug(["chat", "--", "--debug"], {}) == (["chat", "--", "--debug"], False)
    assert split_debug(["wallet", "list"], {"AITBC_DEBUG": "1"}) == (["wallet", "list"], True)
    assert split_debug(["wallet", "list"], {"AITBC_DEBUG": "0"}) == (["wallet", "list"], False)


def test_an_unexpected_error_is_one_line_unless_debug(home: Path, capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # A mock, to inject a fault no real part produces on demand: a bug deep in a command.
    async def broken(_: Path) -> list[flow.TrainingSummary]:
        raise RuntimeError("disk\nmelted")

    monkeypatch.setattr(flow, "list_trainings", broken)
    monkeypatch.delenv("AITBC_DEBUG", raising=False)
    code, out, err = cli(capsys, "distributed-training", "list", "--home", str(home))
    assert code == 1 and out == ""
    assert err.strip() == "error: RuntimeError: disk melted (run with --debug for the traceback)"
    code, out, _ = cli(capsys, "distributed-training", "list", "--home", str(home), "--json")
    assert code == 1 and json.loads(out) == {"error": unexpected_message(RuntimeError("disk melted")), "code": 1,
                                             "type": "RuntimeError"}
    with pytest.raises(RuntimeError, match="disk"):  # --debug: the traceback, as Python prints it
        main(["--debug", "distributed-training", "list", "--home", str(home)])
    monkeypatch.setenv("AITBC_DEBUG", "1")
    with pytest.raises(RuntimeError, match="disk"):
        main(["distributed-training", "list", "--home", str(home)])


# -- ids: whole in a pipe, and 'latest' ---------------------------------------------------------

def test_list_prints_whole_ids_in_a_pipe(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = cli(capsys, "distributed-training", "list", "--home", str(home))
    assert code == 0 and LONG_ID in out and OLD_ID in out and "…" not in out


def test_the_newest_training_is_the_latest(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert newest_training(asyncio.run(flow.list_trainings(home))) == LONG_ID
    assert newest_training([]) is None
    for args in (["monitor"], ["monitor", "--training-id", "latest"], ["payments"]):
        code, out, err = cli(capsys, "distributed-training", *args, "--home", str(home), "--json")
        assert code == 0, err
        assert json.loads(out)["training_id"] == LONG_ID
    code, out, _ = cli(capsys, "distributed-training", "monitor", "--training-id", OLD_ID, "--home", str(home),
                       "--json")
    assert json.loads(out)["training_id"] == OLD_ID  # an id still names its own training
    code, out, _ = cli(capsys, "distributed-training", "audit", "--home", str(home), "--json")
    assert code == 0 and json.loads(out)["training_id"] == LONG_ID
    # stop resolves it too, then finds no wallet to sign with: the message names the newest training
    code, out, _ = cli(capsys, "distributed-training", "stop", "--home", str(home), "--json")
    assert code == 2 and LONG_ID in json.loads(out)["error"]


@pytest.mark.parametrize("command", [["monitor"], ["logs"], ["stop"], ["payments"], ["audit"],
                                     ["sample", "--prompt", "x"]])
def test_latest_in_a_home_without_trainings_says_how_to_start_one(
        command: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = cli(capsys, "distributed-training", *command, "--home", str(tmp_path))
    assert code == 2, err
    assert "no trainings yet" in err and "aitbc distributed-training run" in err and "Traceback" not in err
    assert not (tmp_path / "aitbc.db").exists()  # asking created nothing


# -- --json everywhere ----------------------------------------------------------------------------

# Where stdout is not data: the content itself (cat), a protocol (mcp) or a host's foreground service.
NO_JSON = {"ipfs cat", "mcp serve", "cluster serve", "dashboard"}  # bytes, or servers (the dashboard has /api/)


def test_every_command_that_prints_data_takes_json() -> None:
    def leaves(command: Any, path: tuple[str, ...]) -> list[tuple[str, Any]]:
        if not hasattr(command, "list_commands"):
            return [(" ".join(path), command)]
        return [leaf for name in command.list_commands(None)
                for leaf in leaves(command.get_command(None, name), (*path, name))]

    without = {path for path, command in leaves(typer.main.get_command(app), ())
               if not any("--json" in p.opts for p in command.params)}  # type: ignore[attr-defined]
    assert without == NO_JSON


def test_logs_json_has_the_audit_entries(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = cli(capsys, "distributed-training", "logs", "--home", str(home), "--json")
    assert code == 0, err
    logged = json.loads(out)
    assert (logged["training_id"], logged["source"]) == (LONG_ID, "audit")
    line, = logged["lines"]
    assert line["entry"]["event"] == "training_started" and "training_started" in line["line"]
    code, out, _ = cli(capsys, "distributed-training", "logs", LONG_ID, "--home", str(home))
    assert code == 0 and "training_started rounds=2" in out


# -- monitor --follow in a pipe ---------------------------------------------------------------------

def snap(phase: TrainingPhase, rounds: int, *, status: str = "training", payments: int = 0,
         events: tuple[dict[str, object], ...] = ()) -> Snapshot:
    worker = WorkerView(worker_id=WORKER, round=rounds + 1, status=status, epoch=1, epochs=2, progress=50.0,
                        loss=0.25, samples_per_s=100.0, paid_wei=0)
    paid = [Payment(training_id=LONG_ID, worker_id=WORKER, contract_id="c1", amount_wei=10**16, tx_hash="0x" + "1" * 64,
                    result_hash="r") for _ in range(payments)]
    return Snapshot(training_id=LONG_ID, phase=phase, round=rounds, rounds=3, model_type="mlp", workers=[worker],
                    round_metrics=[metrics(r) for r in range(1, rounds + 1)], payments=paid, escrow=None,
                    events=list(events))


def test_snapshot_events_are_what_changed() -> None:
    first = snap(TrainingPhase.TRAINING, 1)
    assert [e["event"] for e in snapshot_events(None, first)] == ["phase", "round", "worker"]
    assert snapshot_events(first, first) == []
    later = snap(TrainingPhase.COMPLETE, 2, status="done", payments=1,
                 events=({"event": "worker_replaced", "worker": WORKER, "round": 2, "reason": "[red]gone"},))
    changed = snapshot_events(first, later)
    assert [e["event"] for e in changed] == ["phase", "round", "worker", "payment", "worker_replaced"]
    assert changed[1]["round"] == 2 and changed[0]["phase"] == "complete"
    lines = [event_line(e) for e in changed]
    assert lines[1].startswith("round 2/3: accuracy 0.7000")
    assert "\\[red]gone" in lines[4]  # a worker's words are escaped, never markup
    json.dumps(changed)  # every event is JSON as it is


def test_monitor_follow_prints_each_event_as_it_happens(home: Path, cli_env: dict[str, str]) -> None:
    """A watcher in a pipe sees round 1 before round 2 is written, and ends with the training."""
    watcher = subprocess.Popen([sys.executable, "-m", "aitbc_cli.app", "distributed-training", "monitor", "--follow",
                                "--interval", "0.1", "--home", str(home), "--json"],
                               env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: queue.Queue[str] = queue.Queue()
    threading.Thread(target=lambda: [lines.put(line) for line in watcher.stdout], daemon=True).start()  # type: ignore[union-attr]
    try:
        def next_event(kind: str) -> dict[str, object]:
            while True:  # a line held in a buffer until the end never comes: the wait fails
                event = json.loads(lines.get(timeout=60))
                if event["event"] == kind:
                    return event

        assert next_event("phase")["phase"] == "training"
        asyncio.run(save(home, record(LONG_ID, 2_000.0, round_=1), rounds=(metrics(1),)))
        assert next_event("round")["round"] == 1  # printed while the training still runs
        asyncio.run(save(home, record(LONG_ID, 2_000.0, TrainingPhase.COMPLETE, 2), rounds=(metrics(2),)))
        assert next_event("round")["round"] == 2
        finished = next_event("finished")
        assert finished["phase"] == "complete" and len(finished["round_metrics"]) == 2  # type: ignore[arg-type]
        assert watcher.wait(timeout=60) == 0
    finally:
        watcher.kill()
        watcher.wait()


def test_monitor_follow_in_a_pipe_prints_lines(home: Path, capsys: pytest.CaptureFixture[str]) -> None:
    asyncio.run(save(home, record(LONG_ID, 2_000.0, TrainingPhase.COMPLETE, 1), rounds=(metrics(1),)))
    code, out, err = cli(capsys, "distributed-training", "monitor", "--follow", "--home", str(home))
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == f"{LONG_ID}: complete, round 1/2"
    assert lines[1].startswith("round 1/2: accuracy 0.6000") and lines[-1] == f"{LONG_ID} ended: complete after round 1"


# -- the market short of what was asked --------------------------------------------------------------

def test_a_shortfall_is_one_warning_per_role() -> None:
    assert hiring_warnings(asked_workers=3, asked_spares=0, workers=3, spares=0) == []
    assert hiring_warnings(asked_workers=10, asked_spares=2, workers=3, spares=1) == [
        "asked for 10 workers, the market has 3 that qualify: training with 3 (see --min-gpu/--min-stake)",
        "asked for 2 spares, the market has 1 more that qualifies: training with 1 spare (see --min-gpu/--min-stake)",
    ]


# -- output paths -----------------------------------------------------------------------------------

def test_output_paths_are_checked_before_anything_runs(tmp_path: Path) -> None:
    assert check_writable_png(tmp_path / "new" / "dir" / "curves.png") == tmp_path / "new" / "dir" / "curves.png"
    assert not (tmp_path / "new").exists()  # checking makes nothing
    blocker, folder = tmp_path / "file", tmp_path / "folder.png"
    blocker.write_text("x")
    folder.mkdir()
    refusals = {tmp_path / "curves.jpg": "name a .png file", folder: "is a directory",
                blocker / "curves.png": "is a file, not a directory"}
    for path, why in refusals.items():
        with pytest.raises(OutputPathError, match=why):
            check_writable_png(path)
    if os.geteuid() != 0:  # root writes anywhere
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o500)
        with pytest.raises(OutputPathError, match="permission denied"):
            check_output_file(locked / "journal.jsonl", "--journal")


def test_a_bad_plot_path_fails_before_the_stack_starts(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "folder.png"
    folder.mkdir()
    started = time.monotonic()
    code, _, err = cli(capsys, "distributed-training", "run", "--workers", "1", "--rounds", "1", "--yes",
                       "--home", str(tmp_path / "home"), "--plot", str(folder))
    assert code == 2 and f"--plot {folder} is a directory" in err
    assert not (tmp_path / "home").exists() and time.monotonic() - started < 30  # nothing started, nothing made
