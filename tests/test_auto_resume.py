"""An agent process started with auto_resume carries on a training whose coordinator was killed.

Real servers (mosquitto, anvil, provider daemons from `aitbc devnet up`); the coordinator
daemon is killed with SIGKILL between rounds, so it leaves no cleanup behind.
"""

import asyncio
import json
import os
import signal
import sqlite3
import subprocess
import time

import pytest

from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.chain import training_key
from aitbc_agent_sdk.audit import read_log, verify_log
from aitbc_agent_sdk.coordinator._lock import is_driven
from aitbc_agent_sdk.coordinator._service import audit_path
from aitbc_agent_sdk.devnet._network import wallet_store
from aitbc_agent_sdk.records import TrainingPhase
from aitbc_agent_sdk.profile import devnet_password

pytestmark = pytest.mark.slow
ROUNDS = 8  # the kill follows round 1 within milliseconds; each round takes seconds on a loaded CI machine


def aitbc(aitbc_cmd, env, *args, timeout=240) -> dict:
    done = subprocess.run([*aitbc_cmd, *args, "--json"], env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"aitbc {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounds_done(home, tid) -> int:
    with sqlite3.connect(home / "aitbc.db") as db:
        return db.execute("SELECT COUNT(*) FROM rounds WHERE training_id=?", (tid,)).fetchone()[0]


def test_an_agent_with_auto_resume_finishes_a_training_whose_coordinator_died(aitbc_cmd, cli_env, aitbc_home):
    aitbc_home.mkdir(parents=True, exist_ok=True)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    aitbc(aitbc_cmd, cli_env, "devnet", "up", "--providers", "3", timeout=300)
    try:
        tid = aitbc(aitbc_cmd, cli_env, "distributed-training", "init", "--wallet", "dev", "--target-workers", "3",
                    "--rounds", str(ROUNDS), "--epochs", "1", "--heartbeat-timeout", "3")["training_id"]
        aitbc(aitbc_cmd, cli_env, "distributed-training", "upload-data", "--training-id", tid, "--data-path", "digits")
        aitbc(aitbc_cmd, cli_env, "distributed-training", "discover-workers", "--training-id", tid,
              "--required-workers", "3")
        started = aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid, "--yes")
        deadline = time.monotonic() + 120
        while rounds_done(aitbc_home, tid) < 1:
            assert time.monotonic() < deadline, "round 1 never finished"
            time.sleep(0.01)
        os.kill(started["coordinator_pid"], signal.SIGKILL)
        # Round 1 was seen done a poll (10 ms) ago: the kill lands mid-training.
        assert rounds_done(aitbc_home, tid) < ROUNDS, "the training finished before the kill: not a test of resume"
        deadline = time.monotonic() + 10
        while is_driven(aitbc_home, tid):  # the kernel drops the dead daemon's lock
            assert time.monotonic() < deadline
            time.sleep(0.1)

        async def restart() -> None:
            account = await wallet_store(aitbc_home).unlock("dev", devnet_password(aitbc_home))
            config = AgentConfig(network="devnet", home=aitbc_home, auto_resume=True,
                                 client_id=f"coord-{tid}")
            async with Agent(config, account=account) as agent:
                assert list(agent.resumed) == [tid]
                assert is_driven(aitbc_home, tid)  # a second coordinator would be refused now
                settlement = await asyncio.wait_for(agent.resumed[tid], 180)
                record = await agent.coordinator.db.training(tid)
                assert record.phase == TrainingPhase.COMPLETE and record.round == ROUNDS
                key = training_key(agent.stack.account.address, tid)
                state, held = await agent.stack.escrow.training(key), await agent.stack.escrow.held(key)
                assert state.closed and state.deposited == state.paid + state.refunded + held.amount
                assert settlement.escrow.paid_wei == state.paid > 0
                # three workers, each paid once: nothing paid twice across the two coordinators
                released = [e for e in await agent.stack.escrow.events(training_key(agent.stack.account.address, tid)) if e.name == "Released"]
                assert len({e.args["worker"] for e in released}) == len(released) == 3

        asyncio.run(restart())
        log = audit_path(aitbc_home / "trainings", tid)
        assert verify_log(log).ok
        resumed = [e for e in read_log(log) if e.event == "training_resumed"]
        assert len(resumed) == 1 and resumed[0].fields["round"] >= 2
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)
