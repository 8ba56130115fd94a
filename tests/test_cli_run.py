"""`aitbc distributed-training run` as a user runs it: a separate process, JSON out, exit codes,
the money preview, and the tables at 80 columns."""

import json
import re
import sqlite3
import subprocess

import numpy as np
import pytest


def run_cli(aitbc_cmd, env, *args, timeout=300, yes=False):
    """As `setsid make demo < /dev/null` runs it: no terminal, no controlling tty, and no --yes, which the
    embedded network's play money does not need."""
    return subprocess.run([*aitbc_cmd, "distributed-training", "run", *(["--yes"] if yes else []), *args], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, start_new_session=True,
                          timeout=timeout)


def trainings(home) -> list:
    db = home / "aitbc.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return conn.execute("SELECT training_id, phase FROM trainings").fetchall()


def test_json_output_is_one_object_with_the_promised_keys(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    plot = tmp_path / "curves.png"
    done = run_cli(aitbc_cmd, cli_env, "--workers", "3", "--rounds", "3", "--providers", "3", "--json",
                   "--plot", str(plot))
    assert done.returncode == 0, done.stderr
    assert "play money on the embedded network: nothing to confirm" in done.stderr  # no terminal, no --yes
    report = json.loads(done.stdout)  # exactly one JSON document on stdout
    assert report["status"] == "complete"
    assert 0.9 <= report["final_accuracy"] <= 1.0
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert all({"round", "accuracy", "loss"} <= r.keys() for r in report["rounds"])
    assert len(report["workers"]) == 3
    for worker in report["workers"]:
        assert {"address", "samples", "paid_wei", "status"} <= worker.keys()
        assert worker["status"] == "paid" and int(worker["paid_wei"]) > 0
    escrow = report["escrow"]
    assert all(isinstance(v, str) for k, v in escrow.items() if k.endswith("_wei"))  # jq-safe: strings
    assert int(escrow["deposited_wei"]) == int(escrow["paid_wei"]) + int(escrow["refunded_wei"])
    assert int(escrow["paid_wei"]) == sum(int(w["paid_wei"]) for w in report["workers"])
    spend = report["verification"]  # every result spot-checked on this machine, priced apart (issue #29)
    assert (spend["checks"], spend["failed"], spend["verifier_wei"]) == (9, 0, "0")
    assert spend["coordinator_seconds"] > 0 and spend["checked_training_seconds"] > 0
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert trainings(aitbc_home) == [(report["training_id"], "complete")]
    cost = report["cost"]  # settled: the spend is what was paid, a string like every wei figure
    assert cost["spent_wei"] == escrow["paid_wei"] and cost["deposit_wei"] == escrow["deposited_wei"]
    assert len(cost["per_round_wei"]) == 3 and cost["projected_wei"] == cost["spent_wei"]
    # TensorBoard event files by default, in the training's directory
    assert list((aitbc_home / "trainings" / report["training_id"] / "tensorboard").glob("events.out.tfevents.*"))

    # every payment and the refund are in the training's hash-chained audit log
    tid = report["training_id"]
    audit = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid, "--json"],
                           env=cli_env, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stderr
    log = json.loads(audit.stdout)
    money = [e["event"] for e in log["entries"] if e["event"] in ("escrow_funded", "payment", "refund")]
    assert log["ok"] and money == ["escrow_funded"] + ["payment"] * 3 + ["refund"]  # (a busy machine may add a
    # straggler_detected: with no spare it changes nothing, and it is rightly logged)
    paid = {e["fields"]["worker"]: int(e["fields"]["amount_wei"]) for e in log["entries"] if e["event"] == "payment"}
    assert paid == {w["address"]: int(w["paid_wei"]) for w in report["workers"]}
    # editing a line is detected
    path = aitbc_home / "trainings" / tid / "audit.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if '"payment"' in line)
    edited = lines[at].replace(str(int(json.loads(lines[at])["fields"]["amount_wei"])), "1")
    assert edited != lines[at]
    lines[at] = edited
    path.write_text("".join(lines))
    tampered = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid],
                              env=cli_env, capture_output=True, text=True, timeout=120)
    assert tampered.returncode == 1 and f"chain broken at line {at + 1}" in tampered.stdout


def test_a_csv_file_with_a_label_column_trains(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(300, 4))
    y = (x[:, 0] + x[:, 1] > 0).astype(int)
    path = tmp_path / "points.csv"
    lines = ["a,b,c,d,kind"] + [",".join(f"{v:.5f}" for v in row) + f",{'yes' if t else 'no'}"
                                for row, t in zip(x, y)]
    path.write_text("\n".join(lines) + "\n")
    done = run_cli(aitbc_cmd, cli_env, "--data-path", str(path), "--label-column", "kind", "--workers", "2",
                   "--providers", "2", "--rounds", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["final_accuracy"] > 0.85


@pytest.mark.parametrize("args,message,code", [
    (["--data-path", "/nonexistent/data.npz"], "not found", 2),
    (["--model", "resnet9000"], "'resnet9000' is", 2),  # the choices are listed too
    (["--workers", "3", "--providers", "2"], "only 2", 4),  # not enough providers: a runtime failure
    (["--wallet-funds-eth", "0.01"], "wei", 5),  # the wallet cannot pay
    (["--rounds", "0"], "rounds", 2),
    (["--lr", "0"], "0 < lr <= 10", 2),  # the range said x>=0 and refused 0; now they agree
    (["--target-throughput", "10", "--min-workers", "3", "--max-workers", "2"], "min_workers cannot exceed", 2),
    (["--aggregation", "mean-of-everything"], "aggregation", 2),
])
def test_bad_input_exits_with_its_code_and_leaves_no_training(aitbc_cmd, cli_env, aitbc_home, args, message, code):
    done = run_cli(aitbc_cmd, cli_env, "--providers", "2", "--workers", "2", *args)
    assert done.returncode == code, done.stdout + done.stderr
    assert message in (done.stderr + done.stdout)
    assert "Traceback" not in done.stderr
    assert trainings(aitbc_home) == []


def test_a_missing_label_column_exits_2(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    path = tmp_path / "d.csv"
    path.write_text("a,b,label\n1,2,x\n3,4,y\n5,6,x\n7,8,y\n")
    done = run_cli(aitbc_cmd, cli_env, "--data-path", str(path), "--label-column", "target",
                   "--providers", "1", "--workers", "1")
    assert done.returncode == 2
    assert "target" in done.stderr and "label" in done.stderr
    assert trainings(aitbc_home) == []


def test_an_elastic_run_grows_its_pool_and_shows_it_in_json_monitor_and_plot(aitbc_cmd, cli_env, aitbc_home,
                                                                           tmp_path):
    plot = tmp_path / "elastic.png"
    done = run_cli(aitbc_cmd, cli_env, "--workers", "2", "--providers", "3", "--rounds", "3", "--epochs", "1",
                   "--target-throughput", "1000000", "--max-workers", "3", "--scale-window", "1",
                   "--plot", str(plot), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["status"] == "complete"
    assert [r["workers"] for r in report["rounds"]] == [2, 3, 3]  # hired once, then at the maximum
    assert all(r["throughput"] > 0 for r in report["rounds"])
    assert plot.stat().st_size > 20_000
    watched = subprocess.run([*aitbc_cmd, "distributed-training", "monitor", "--training-id", report["training_id"],
                              "--json"], env=cli_env, capture_output=True, text=True, timeout=60)
    snap = json.loads(watched.stdout)
    assert snap["target_throughput"] == 1_000_000
    added = [e for e in snap["events"] if e["event"] == "worker_added"]
    assert len(added) == 1 and added[0]["throughput"] < 0.7 * 1_000_000
    rebalanced = [e for e in snap["events"] if e["event"] == "rebalanced"]
    assert rebalanced and rebalanced[0]["round"] == 2 and len(rebalanced[0]["shares"]) == 3  # the joiner got data
    # monitor prices the checks as the report does: one per accepted result (2 + 3 + 3; a busy machine's
    # straggler copy may add one)
    checks = report["verification"]["checks"]
    assert snap["verification"]["checks"] == checks >= 8
    text = subprocess.run([*aitbc_cmd, "distributed-training", "monitor", "--training-id", report["training_id"]],
                          env={**cli_env, "COLUMNS": "200"}, capture_output=True, text=True, timeout=60)
    assert f"verification: {checks} spot checks, 0 failed" in text.stdout, text.stdout
    # cost: the spend is what was paid (settled), per worker and per round as the receipts committed it
    cost, paid = snap["cost"], sum(int(p["amount_wei"]) for p in snap["payments"])
    assert int(cost["spent_wei"]) == int(cost["paid_wei"]) == paid > 0 and cost["rounds_done"] == 3
    assert sum(int(r["wei"]) for r in cost["per_round_wei"]) == paid and len(cost["per_round_wei"]) == 3
    assert "cost: " in text.stdout and "ETH spent of" in text.stdout, text.stdout
    assert report["cost"] == cost  # run's report and monitor read one record of the spend


def test_a_dry_run_shows_the_cost_and_touches_neither_home_nor_chain(aitbc_cmd, cli_env, aitbc_home):
    # Two spares asked of a market with one place left: planned with one, and said so.
    done = run_cli(aitbc_cmd, cli_env, "--workers", "2", "--providers", "3", "--spares", "2", "--rounds", "3",
                   "--dry-run", "--json", yes=False)
    assert done.returncode == 0, done.stderr
    plan = json.loads(done.stdout)
    assert plan["dry_run"] is True
    assert plan["target"] == "classes"  # the digits' labels, detected, and said before anything is paid
    workers = [w for w in plan["workers"] if w["role"] == "worker"]
    spares = [w for w in plan["workers"] if w["role"] == "spare"]
    assert len(workers) == 2 and len(spares) == 1
    shortfall = ("asked for 2 spares, the market has 1 more that qualifies: training with 1 spare "
                 "(see --min-gpu/--min-stake)")
    assert plan["warnings"] == [shortfall] and f"warning: {shortfall}" in done.stderr
    deposit = sum(int(w["price_wei"]) for w in workers) * 3
    assert plan["cost"]["deposit_wei"] == str(deposit)  # workers x price x rounds, as a string
    assert plan["cost"]["min_stake_wei"] == "0"  # the embedded network's providers are this machine's processes
    assert int(plan["total_wei"]) == deposit + int(spares[0]["price_wei"]) * 3  # plus what the spare could take
    assert "escrow deposit: 2 workers" in done.stderr and "dry run: nothing spent" in done.stderr
    # what checking will cost this machine, said before anything is paid (issue #29)
    assert (plan["cost"]["spot_checks"], plan["cost"]["segments"]) == (5, 64)
    assert "spot-checked: 5 of its 64 segments re-executed" in " ".join(done.stderr.split())  # auto, CPUs here
    assert plan["cost"]["verify_on"] == "auto"
    assert not aitbc_home.exists()  # no database, no wallet, nothing


def test_an_unwritable_plot_fails_before_anything_is_paid(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a regular file")
    done = run_cli(aitbc_cmd, cli_env, "--workers", "1", "--providers", "1", "--plot", str(blocker / "c.png"))
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--plot" in done.stderr and "not a directory" in done.stderr and "Traceback" not in done.stderr
    assert not (aitbc_home / "aitbc.db").exists()  # stopped before the stack started: nothing funded


@pytest.mark.parametrize("name,content,message", [
    ("latin1.csv", "a,b,label\n1,2,caf\xe9\n3,4,th\xe9\n".encode("latin-1"), "UTF-8"),
    ("empty.npz", b"", "not a readable .npz file"),
])
def test_an_unreadable_dataset_is_a_clear_usage_error(aitbc_cmd, cli_env, aitbc_home, tmp_path, name, content,
                                                       message):
    path = tmp_path / name
    path.write_bytes(content)
    done = run_cli(aitbc_cmd, cli_env, "--data-path", str(path), "--label-column", "label", "--workers", "1",
                   "--providers", "1")
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and name in done.stderr
    assert "Traceback" not in done.stderr and "Aborted" not in done.stderr


def test_the_final_tables_fit_80_columns(aitbc_cmd, cli_env, aitbc_home):
    env = {**cli_env, "COLUMNS": "80"}
    done = run_cli(aitbc_cmd, env, "--workers", "2", "--providers", "2", "--rounds", "1", "--epochs", "1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80, "\n".join(lines)
    start = next(i for i, line in enumerate(lines) if line.strip() == "Workers")
    rows = [line for line in lines[start:] if re.match(r"\s*0x[0-9a-fA-F]{4}…[0-9a-fA-F]{4}\s", line)]
    assert len(rows) == 2, "\n".join(lines)
    assert any(line.startswith("Verification") for line in lines), "\n".join(lines)
    for row in rows:
        cells = row.split()
        # short address, hardware, samples, rounds, ETH/round and paid with 4 decimals, the payment's tx short
        assert cells[1] == "cpu" and int(cells[2]) > 0 and cells[3] == "1"
        assert re.fullmatch(r"\d\.\d{4}", cells[4]) and cells[4] == cells[5]  # one round: paid its price
        assert re.fullmatch(r"0x[0-9a-f]{4}…[0-9a-f]{4}", cells[6])
