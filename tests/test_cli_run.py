"""`aitbc distributed-training run` as a user runs it: a separate process, JSON out, exit codes."""

import json
import sqlite3
import subprocess

import numpy as np
import pytest


def run_cli(aitbc_cmd, env, *args, timeout=300):
    return subprocess.run([*aitbc_cmd, "distributed-training", "run", *args], env=env, capture_output=True,
                          text=True, timeout=timeout)


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
    report = json.loads(done.stdout)  # exactly one JSON document on stdout
    assert report["status"] == "complete"
    assert 0.9 <= report["final_accuracy"] <= 1.0
    assert [r["round"] for r in report["rounds"]] == [1, 2, 3]
    assert all({"round", "accuracy", "loss"} <= r.keys() for r in report["rounds"])
    assert len(report["workers"]) == 3
    for worker in report["workers"]:
        assert {"address", "samples", "paid_wei", "status"} <= worker.keys()
        assert worker["status"] == "paid" and worker["paid_wei"] > 0
    escrow = report["escrow"]
    assert escrow["deposited_wei"] == escrow["paid_wei"] + escrow["refunded_wei"]
    assert escrow["paid_wei"] == sum(w["paid_wei"] for w in report["workers"])
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert trainings(aitbc_home) == [(report["training_id"], "complete")]

    # every payment and the refund are in the training's hash-chained audit log
    tid = report["training_id"]
    audit = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid, "--json"],
                           env=cli_env, capture_output=True, text=True, timeout=120)
    assert audit.returncode == 0, audit.stderr
    log = json.loads(audit.stdout)
    assert log["ok"] and [e["event"] for e in log["entries"]] == ["escrow_funded"] + ["payment"] * 3 + ["refund"]
    paid = {e["fields"]["worker"]: e["fields"]["amount_wei"] for e in log["entries"] if e["event"] == "payment"}
    assert paid == {w["address"]: w["paid_wei"] for w in report["workers"]}
    # editing a line is detected
    path = aitbc_home / "trainings" / tid / "audit.jsonl"
    lines = path.read_text().splitlines(keepends=True)
    lines[1] = lines[1].replace(str(report["workers"][0]["paid_wei"]), "1")
    path.write_text("".join(lines))
    tampered = subprocess.run([*aitbc_cmd, "distributed-training", "audit", "--training-id", tid],
                              env=cli_env, capture_output=True, text=True, timeout=120)
    assert tampered.returncode == 1 and "chain broken at line 2" in tampered.stdout


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


@pytest.mark.parametrize("args,message", [
    (["--data-path", "/nonexistent/data.npz"], "not found"),
    (["--model", "resnet9000"], "unknown model"),
    (["--workers", "3", "--providers", "2"], "only 2"),
    (["--wallet-funds-eth", "0.01"], "wei"),
    (["--rounds", "0"], "rounds"),
    (["--target-throughput", "10", "--min-workers", "3", "--max-workers", "2"], "min_workers cannot exceed"),
    (["--aggregation", "mean-of-everything"], "aggregation"),
])
def test_bad_input_exits_2_and_leaves_no_training(aitbc_cmd, cli_env, aitbc_home, args, message):
    done = run_cli(aitbc_cmd, cli_env, "--providers", "2", "--workers", "2", *args)
    assert done.returncode == 2, done.stdout + done.stderr
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
