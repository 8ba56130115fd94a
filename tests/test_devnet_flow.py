"""The seed's five-command flow, each command its own OS process, on real servers:
mosquitto, anvil and a js-ipfs daemon started by `aitbc devnet up`, with 3 provider daemons."""

import asyncio
import json
import subprocess

import numpy as np
import pytest

from aitbc_agent_sdk.chain import EscrowClient, connect_rpc
from aitbc_agent_sdk.records import ShardManifest
from aitbc_agent_sdk.profile import load_profile
from aitbc_agent_sdk.storage._kubo import KuboClient, KuboContentStore
from aitbc_agent_sdk.data._datasets import load_dataset
from test_target_kinds_run import ROOT, synthetic_csv

pytestmark = pytest.mark.slow


def aitbc(aitbc_cmd, env, *args, timeout=240) -> dict:
    done = subprocess.run([*aitbc_cmd, *args, "--json"], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"aitbc {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def devnet(aitbc_cmd, cli_env, aitbc_home):
    aitbc_home.mkdir(parents=True, exist_ok=True)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)  # the devnet makes and keeps its own
    profile = aitbc(aitbc_cmd, cli_env, "devnet", "up", "--providers", "3", "--ipfs", "daemon", timeout=300)
    try:
        yield profile
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)


def test_five_commands_across_processes(aitbc_cmd, cli_env, aitbc_home, tmp_path, devnet):
    assert devnet["store"]["kind"] == "kubo"
    status = aitbc(aitbc_cmd, cli_env, "devnet", "status")
    assert status["ok"], status

    data = load_dataset("digits")
    dataset = tmp_path / "digits.npz"
    np.savez(dataset, x=data.features.numpy(), y=data.labels.numpy())

    init = aitbc(aitbc_cmd, cli_env, "distributed-training", "init", "--wallet", "dev", "--model-type", "mlp",
                 "--dataset-size", str(dataset.stat().st_size), "--target-workers", "3", "--rounds", "3")
    tid = init["training_id"]
    assert init["status"] == "initializing"
    upload = aitbc(aitbc_cmd, cli_env, "distributed-training", "upload-data", "--training-id", tid,
                   "--data-path", str(dataset))
    hired = aitbc(aitbc_cmd, cli_env, "distributed-training", "discover-workers", "--training-id", tid,
                  "--min-gpu", "cpu", "--required-workers", "3")
    assert len(hired["workers"]) == 3
    aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid,
          "--strategy", "data-parallel", "--yes")

    # distribute has returned; the detached coordinator carries on. Watch from another process.
    snap = aitbc(aitbc_cmd, cli_env, "distributed-training", "monitor", "--training-id", tid, "--follow",
                 "--interval", "0.5", timeout=300)
    assert snap["phase"] == "complete", snap
    assert [r["round"] for r in snap["round_metrics"]] == [1, 2, 3]
    assert snap["round_metrics"][-1]["accuracy"] >= 0.93
    # the detached coordinator wrote each round to TensorBoard, the spec's default log (init's --log-to)
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    board = EventAccumulator(str(aitbc_home / "trainings" / tid / "tensorboard"))
    board.Reload()
    assert [e.step for e in board.Scalars("eval/loss")] == [1, 2, 3]

    async def check_chain_and_ipfs() -> None:
        profile = load_profile(aitbc_home)
        w3 = await connect_rpc(profile.chain.rpc_url)
        escrow = EscrowClient(w3, profile.chain.escrow)
        (key, _), = await escrow.trainings_named(tid)  # the id derives from the coordinator
        state, held = await escrow.training(key), await escrow.held(key)
        assert state.closed and state.deposited == state.paid + state.refunded + held.amount
        released = [e for e in await escrow.events(key) if e.name == "Released"]
        paid = {e.args["worker"]: e.args["amount"] for e in released}
        assert set(paid) == {w["worker_id"] for w in hired["workers"]}
        for worker in hired["workers"]:
            assert paid[worker["worker_id"]] == int(worker["price_wei"]) * 3
        assert sum(paid.values()) == state.paid

        async with KuboClient(profile.store.api) as client:
            store = KuboContentStore(client)
            assert len(await store.cat(upload["dataset_cid"])) > 0
            record = json.loads((await asyncio.to_thread(_record, aitbc_home, tid)))
            manifest = ShardManifest.model_validate_json(await store.cat(record["manifest_cid"]))
            for shard in manifest.shards:
                assert len(await store.cat(shard.cid)) > 0
            for cid in _checkpoint_cids(aitbc_home, tid):
                assert len(await store.cat(cid)) > 0
            assert len(await store.cat(record["model_cid"])) > 0

    asyncio.run(check_chain_and_ipfs())

    listed = aitbc(aitbc_cmd, cli_env, "distributed-training", "payments", "--training-id", tid)
    assert sorted(p["worker_id"] for p in listed["payments"]) == sorted(w["worker_id"] for w in hired["workers"])
    assert all(p["tx_hash"].startswith("0x") and len(p["tx_hash"]) == 66 for p in listed["payments"])

    earned = aitbc(aitbc_cmd, cli_env, "provider", "status", "--wallet", "provider-0")
    assert int(earned["earned_wei"]) in {int(w["price_wei"]) * 3 for w in hired["workers"]} | {0}

    # the market after the training: every provider bonded, and the escrow's job reports on chain
    market = aitbc(aitbc_cmd, cli_env, "market", "list", "--sort", "stake")
    assert len(market["offers"]) == 3
    assert all(o["stake_wei"] == str(10**17) and o["completed"] == 1 and o["failed"] == 0 for o in market["offers"])
    assert all(o["reputation"] > 2.5 for o in market["offers"])  # one completed job beats the prior

    # bond management: top up, start unbonding (not assigned any more), refuse a second registration
    topped = aitbc(aitbc_cmd, cli_env, "provider", "stake", "--wallet", "provider-2", "--add", "0.05")
    assert int(topped["stake_wei"]) == 10**17 + 5 * 10**16
    leaving = aitbc(aitbc_cmd, cli_env, "provider", "unregister", "--wallet", "provider-2")
    assert leaving["unbonding_at"] > 0 and leaving["assigned"] == 0
    again = subprocess.run([*aitbc_cmd, "provider", "register", "--wallet", "provider-2", "--stake", "1"],
                           env=cli_env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 2 and "already registered" in again.stderr

    # The same five steps for a regression (issue #26): the example task on a float CSV column it was not
    # written for, hired from the two providers still bonded; it reports its own metric, never accuracy 0.
    csv = synthetic_csv(tmp_path / "synthetic.csv")
    init = aitbc(aitbc_cmd, cli_env, "distributed-training", "init", "--wallet", "dev", "--task",
                 str(ROOT / "examples/tasks/linear_regression.py"), "--target-workers", "2", "--rounds", "2")
    tid = init["training_id"]
    upload = aitbc(aitbc_cmd, cli_env, "distributed-training", "upload-data", "--training-id", tid,
                   "--data-path", str(csv), "--label-column", "target")
    assert upload["target"] == "values"
    aitbc(aitbc_cmd, cli_env, "distributed-training", "discover-workers", "--training-id", tid, "--min-gpu", "cpu",
          "--required-workers", "2")
    aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid, "--yes")
    snap = aitbc(aitbc_cmd, cli_env, "distributed-training", "monitor", "--training-id", tid, "--follow",
                 "--interval", "0.5", timeout=300)
    assert snap["phase"] == "complete", snap
    last = snap["round_metrics"][-1]
    assert last["accuracy"] is None and "accuracy" not in last["metrics"], last
    assert last["metrics"]["mse"] < 0.5 and last["metrics"]["r2"] > 0.5, last  # the target's variance is 1


def _record(home, tid) -> str:
    import sqlite3
    with sqlite3.connect(home / "aitbc.db") as db:
        return db.execute("SELECT data FROM trainings WHERE training_id=?", (tid,)).fetchone()[0]


def _checkpoint_cids(home, tid) -> list[str]:
    import sqlite3
    with sqlite3.connect(home / "aitbc.db") as db:
        rows = db.execute("SELECT data FROM checkpoints WHERE training_id=?", (tid,)).fetchall()
    cids = [json.loads(r[0])["cid"] for r in rows]
    assert len(cids) == 9
    return cids
