"""A GPT-2-small-shaped model (12 layers, width 768, 85M parameters) through the whole market path on
real parts: mosquitto, anvil, the IPFS daemon and two sandboxed provider daemons, with DiLoCo and int8
updates. It is funded, its results are spot-checked (a committed segment re-executed from the opened
boundary states) and paid, and it is sampled. A short context, one round of one step keep it within the
suite's budget; the model's size is what it would be in real use (issue #27)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from test_devnet_flow import aitbc
from test_language_model import record_of
from test_token_task import stdlib_corpus

pytestmark = pytest.mark.slow
# One step a round: two 1 GB boundary states per job, not three. The trajectory is copied out of the sandbox,
# so in round 2 a provider held six beside round 1's kept job, and the suite's disk ran out (CI, stops 41-43).
GPT2_SMALL = ("layers=12", "heads=12", "width=768", "context=16", "windows_per_epoch=2", "eval_windows=16")
SLOW = 900  # seconds for a command on a loaded 2-core machine: every wait below is for an event
# An opening uploads one 1 GB boundary state (weights + Adam moments) per worker: compared bit for bit, the
# segment's end is only hashed. js-ipfs adds about 71 MB/s on an idle core here. Before, both states went up
# and the daemon took over a minute to answer one add beside the other worker's: past the client's 60 s
# read timeout, the challenge was dropped and the check waited out this deadline (CI, stop 43).
OPENING = 900


def brief(event: dict) -> str:
    """An audit event in a line, long fields cut, so a failed assertion shows the events that led to it."""
    fields = {k: (v[:80] if isinstance(v, str) else v) for k, v in event.items() if k not in ("ts", "event")}
    return f"{event.get('event')} {fields}"


def test_a_gpt2_small_model_is_funded_trained_checked_paid_and_sampled(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    stdlib_corpus(tmp_path / "corpus", 200_000)
    aitbc_home.mkdir(parents=True, exist_ok=True)
    free_gb = shutil.disk_usage(tmp_path).free / 1e9  # it needs about 19 GB: said when it fails
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    aitbc(aitbc_cmd, cli_env, "devnet", "up", "--providers", "2", "--ipfs", "daemon", timeout=300)
    try:
        params = [arg for p in GPT2_SMALL for arg in ("--task-param", p)]
        init = aitbc(aitbc_cmd, cli_env, "distributed-training", "init", "--wallet", "dev", "--task", "gpt", *params,
                     "--outer", "diloco", "--update-encoding", "int8", "--target-workers", "2", "--rounds", "1",
                     "--epochs", "1", "--batch-size", "2", "--lr", "1e-4", "--spot-checks", "1",
                     # auto would send an 85M model's checks to the other worker; this test keeps the
                     # coordinator's re-execution from opened 1 GB states (verifiers: test_market_verification)
                     "--verify-on", "coordinator",
                     "--fetch-timeout", "300", "--opening-timeout", str(OPENING), "--first-round-deadline", "900")
        tid = init["training_id"]
        aitbc(aitbc_cmd, cli_env, "distributed-training", "upload-data", "--training-id", tid,
              "--data-path", str(tmp_path / "corpus"), timeout=SLOW)
        declared = record_of(aitbc_home, tid)["spec"]["footprint"]
        assert declared["parameters"] >= 85_000_000, declared  # measured in the rehearsal, beyond the old 25M
        assert declared["weights_bytes"] >= 4 * 85_000_000 and declared["optimizer_bytes"] >= 8 * 85_000_000
        hired = aitbc(aitbc_cmd, cli_env, "distributed-training", "discover-workers", "--training-id", tid,
                      "--min-gpu", "cpu", "--required-workers", "2")
        assert len(hired["workers"]) == 2
        aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid, "--yes", timeout=SLOW)
        snap = aitbc(aitbc_cmd, cli_env, "distributed-training", "monitor", "--training-id", tid, "--follow",
                     "--interval", "1", timeout=2 * SLOW)
        if snap["phase"] != "complete":  # the audit log's last events (job_failed too) say what led to it
            log = aitbc(aitbc_cmd, cli_env, "distributed-training", "audit", "--training-id", tid)["entries"]
            pytest.fail(f"{snap['phase']}: {snap.get('failure')}; {free_gb:.1f} GB free at the start; "
                        f"{[brief({'event': e['event'], **e['fields']}) for e in log[-12:]]}")
        rounds = snap["round_metrics"]
        assert [r["round"] for r in rounds] == [1]
        weights = rounds[0]["bytes_sent"] / 2  # round 1 sends the float32 model to both workers
        assert weights >= declared["weights_bytes"] - (1 << 20)
        for r in rounds:  # int8 results: about a quarter of the model's bytes each
            assert 0 < r["bytes_received"] <= 2 * 0.27 * weights, r

        log = aitbc(aitbc_cmd, cli_env, "distributed-training", "audit", "--training-id", tid)["entries"]
        checks = [e["fields"] for e in log if e["event"] == "spot_check"]
        assert checks and all(c["passed"] for c in checks), checks  # re-executed from opened 1 GB states
        assert all(list(c["opened"]) == ["0"] for c in checks), checks  # the start; the end is hashed
        assert not [e for e in log if e["event"] in ("result_rejected", "slashed", "worker_replaced")]

        paid = aitbc(aitbc_cmd, cli_env, "distributed-training", "payments", "--training-id", tid)["payments"]
        assert sorted(p["worker_id"] for p in paid) == sorted(w["worker_id"] for w in hired["workers"])
        assert all(int(p["amount_wei"]) == int(w["price_wei"]) for p in paid for w in hired["workers"]
                   if p["worker_id"] == w["worker_id"])

        sample = aitbc(aitbc_cmd, cli_env, "distributed-training", "sample", "--training-id", tid,
                       "--prompt", "def ", "--tokens", "8", "--temperature", "0", timeout=SLOW)
        assert sample["tokens"] == 8 and sample["round"] == 1, sample
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)
        drop_bulk(aitbc_home)


def drop_bulk(home: Path) -> None:
    """The IPFS blocks and the providers' kept states (about 10 GB), gone once the devnet is down, so the
    tests after this one have the disk back; the logs stay."""
    shutil.rmtree(home / "devnet" / "ipfs" / "blocks", ignore_errors=True)
    for provider in (home / "providers").glob("*"):
        for bulk in ("cache", "jobs", "kept", "task-state"):
            shutil.rmtree(provider / bulk, ignore_errors=True)
