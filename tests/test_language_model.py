"""A GPT trained on real text across real provider daemons with DiLoCo and int8 updates.

The devnet (mosquitto, anvil, a js-ipfs daemon, two sandboxed provider daemons) runs the seed's
steps with ``--task gpt --outer diloco --update-encoding int8``; the model must end below the
unigram entropy of the held-out files (it learned context, not byte counts), the results must be
about a quarter of the weights' bytes, the outer momentum must be in the record, and ``sample``
must print text from the trained model.
"""

from __future__ import annotations

import asyncio
import json
import math
import sqlite3
import subprocess

import numpy as np
import pytest

from aitbc_agent_sdk.coordinator.data._datasets import DatasetStore
from aitbc_agent_sdk.records import ShardManifest
from aitbc_agent_sdk.profile import load_profile
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.wire._checkpoint import decode_state
from test_devnet_flow import aitbc
from test_token_task import stdlib_corpus

pytestmark = pytest.mark.slow
GPT = ("layers=2", "heads=2", "width=64", "context=64", "windows_per_epoch=1024", "eval_windows=64")


def unigram_nats(tokens: np.ndarray) -> float:
    counts = np.bincount(tokens.astype(np.int64)).astype(np.float64)
    p = counts[counts > 0] / counts.sum()
    return float(-(p * np.log(p)).sum())


def record_of(home, tid) -> dict:
    with sqlite3.connect(home / "aitbc.db") as db:
        return json.loads(db.execute("SELECT data FROM trainings WHERE training_id=?", (tid,)).fetchone()[0])


async def validation_entropy_and_momentum(home, tmp_path, record: dict) -> tuple[float, dict]:
    profile = load_profile(home)
    async with KuboClient(profile.store.api) as client:
        store = KuboContentStore(client)
        manifest = ShardManifest.model_validate_json(await store.cat(record["manifest_cid"]))
        test = await DatasetStore(store, tmp_path / "datasets").load(manifest.test_cid)
        momentum = decode_state(await store.cat(record["outer_state_cid"]))
    return unigram_nats(np.concatenate([np.asarray(p) for p in test.parts])), momentum


def test_a_gpt_trains_below_the_unigram_entropy_with_diloco_and_int8(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    stdlib_corpus(tmp_path / "corpus", 300_000)
    aitbc_home.mkdir(parents=True, exist_ok=True)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    aitbc(aitbc_cmd, cli_env, "devnet", "up", "--providers", "2", "--ipfs", "daemon", timeout=300)
    try:
        params = [arg for p in GPT for arg in ("--task-param", p)]
        init = aitbc(aitbc_cmd, cli_env, "distributed-training", "init", "--wallet", "dev", "--task", "gpt", *params,
                     "--outer", "diloco", "--update-encoding", "int8", "--target-workers", "2", "--rounds", "3",
                     "--epochs", "1", "--batch-size", "32", "--lr", "3e-3")
        tid = init["training_id"]
        aitbc(aitbc_cmd, cli_env, "distributed-training", "upload-data", "--training-id", tid,
              "--data-path", str(tmp_path / "corpus"))
        aitbc(aitbc_cmd, cli_env, "distributed-training", "discover-workers", "--training-id", tid,
              "--min-gpu", "cpu", "--required-workers", "2")
        aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid, "--yes")
        snap = aitbc(aitbc_cmd, cli_env, "distributed-training", "monitor", "--training-id", tid, "--follow",
                     "--interval", "0.5", timeout=400)
        assert snap["phase"] == "complete", snap
        rounds = snap["round_metrics"]
        assert [r["round"] for r in rounds] == [1, 2, 3]

        record = record_of(aitbc_home, tid)
        assert record["spec"]["task"]["name"] == "gpt" and record["spec"]["outer"] == "diloco"
        entropy, momentum = asyncio.run(validation_entropy_and_momentum(aitbc_home, tmp_path, record))
        losses = [r["loss"] for r in rounds]
        assert all(math.isfinite(x) for x in losses)
        assert losses[-1] < entropy, (losses, entropy)  # below what byte counts alone give
        assert rounds[-1]["metrics"]["perplexity"] == pytest.approx(math.exp(losses[-1]), rel=1e-4)
        assert momentum and all(t.abs().sum() > 0 for t in momentum.values())  # DiLoCo's, kept for a resume
        weights = rounds[0]["bytes_sent"]  # round 1 sends the float32 model itself to both workers
        for r in rounds:  # int8 results: about a quarter of the model's bytes
            assert 0 < r["bytes_received"] <= 0.27 * weights, r
        for r in rounds[1:]:  # later rounds send the model's int8 change to workers holding the last model
            assert 0 < r["bytes_sent"] <= 0.27 * weights, r
        logs = "".join(p.read_text() for p in (aitbc_home / "devnet" / "logs").glob("provider-*.log"))
        assert logs.count("model rebuilt from") == 4, logs[-3000:]  # 2 workers x rounds 2 and 3

        sample = aitbc(aitbc_cmd, cli_env, "distributed-training", "sample", "--training-id", tid,
                       "--prompt", "def ", "--tokens", "40", "--temperature", "0")
        assert sample["prompt"] == "def " and sample["tokens"] == 40 and 0 < len(sample["text"]) <= 40
        assert sample["model_cid"] == rounds[-1]["model_cid"] and sample["round"] == 3, sample
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)


def test_run_takes_a_corpus_directory_and_transformer_on_it_is_the_gpt(aitbc_cmd, cli_env, aitbc_home, tmp_path):
    stdlib_corpus(tmp_path / "corpus", 100_000)
    done = subprocess.run([*aitbc_cmd, "distributed-training", "run", "--model-type", "transformer", "--data-path",
                           str(tmp_path / "corpus"), "--outer", "diloco", "--update-encoding", "bf16",
                           "--target-workers", "2", "--providers", "2", "--dry-run", "--json"],
                          env=cli_env, capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-3000:]
    plan = json.loads(done.stdout.strip().splitlines()[-1])
    assert (plan["task"], plan["outer"], plan["update_encoding"]) == ("gpt", "diloco", "bf16")
    missing = subprocess.run([*aitbc_cmd, "distributed-training", "run", "--task", "gpt", "--data-path",
                              str(tmp_path / "nowhere"), "--dry-run"], env=cli_env, capture_output=True, text=True,
                             timeout=120, stdin=subprocess.DEVNULL)
    assert missing.returncode == 2 and "not found" in missing.stderr, missing.stderr
