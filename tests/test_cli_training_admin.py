"""Managing trainings from the CLI, as `sky status/logs/cancel` and `flwr ls/log/stop` users expect:
`distribute` previews its cost and asks, `list`, `logs --follow`, and `stop` of a detached
coordinator. Real servers: mosquitto, anvil and provider daemons, started by `init --yes` on a home with no
devnet, as on a fresh machine."""

import asyncio
import json
import sqlite3
import subprocess
import time

import pytest

from aitbc_agent_sdk.chain import EscrowClient, connect_rpc
from aitbc_agent_sdk.devnet._service import pid_alive
from aitbc_agent_sdk.profile import load_profile

pytestmark = pytest.mark.slow
ROUNDS = 200  # far more than run before the stop lands: the stop must interrupt a training


def cli(aitbc_cmd, env, *args, timeout=240) -> subprocess.CompletedProcess:
    return subprocess.run([*aitbc_cmd, *args], env=env, capture_output=True, text=True, timeout=timeout,
                          stdin=subprocess.DEVNULL)


def aitbc(aitbc_cmd, env, *args, timeout=240) -> dict:
    done = cli(aitbc_cmd, env, *args, "--json", timeout=timeout)
    assert done.returncode == 0, f"aitbc {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def rounds_done(home, tid) -> int:
    with sqlite3.connect(home / "aitbc.db") as db:
        return db.execute("SELECT COUNT(*) FROM rounds WHERE training_id=?", (tid,)).fetchone()[0]


def listed(aitbc_cmd, env, tid) -> dict:
    rows = [r for r in aitbc(aitbc_cmd, env, "distributed-training", "list")["trainings"] if r["training_id"] == tid]
    assert len(rows) == 1
    return rows[0]


@pytest.fixture
def devnet(aitbc_cmd, cli_env, aitbc_home):
    """Stops the devnet that the test's `init --yes` starts."""
    aitbc_home.mkdir(parents=True, exist_ok=True)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    cli_env.pop("AITBC_PASSWORD", None)
    try:
        yield
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)


def test_preview_list_logs_and_stop_of_a_detached_coordinator(aitbc_cmd, cli_env, aitbc_home, devnet):
    assert aitbc(aitbc_cmd, cli_env, "distributed-training", "list") == {"trainings": []}
    assert not (aitbc_home / "aitbc.db").exists()  # listing an empty home creates nothing
    # A fresh machine: no devnet, no terminal to ask whether to start one, no password set.
    bare = cli(aitbc_cmd, cli_env, "distributed-training", "init", "--wallet", "my-agent-wallet")
    assert bare.returncode == 2 and "--yes" in bare.stderr and "aitbc devnet up" in bare.stderr, bare.stderr
    assert "password" not in bare.stderr and not (aitbc_home / "profile.json").exists()
    # --yes starts the local devnet (the seed's wallet name funded as a coordinator), then creates the training.
    tid = aitbc(aitbc_cmd, cli_env, "distributed-training", "init", "--yes", "--wallet", "my-agent-wallet",
                "--workers", "3",
                "--rounds", str(ROUNDS), "--epochs", "1", "--round-timeout", "900", "--first-round-deadline", "150",
                "--resend-timeout", "12.5")["training_id"]
    with sqlite3.connect(aitbc_home / "aitbc.db") as db:  # the timeouts are stored with the training
        faults = json.loads(db.execute("SELECT data FROM trainings WHERE training_id=?", (tid,)).fetchone()[0])
    faults = faults["spec"]["faults"]
    assert (faults["round_timeout_s"], faults["first_round_deadline_s"], faults["resend_timeout_s"]) == (900, 150, 12.5)
    aitbc(aitbc_cmd, cli_env, "distributed-training", "upload-data", "--training-id", tid, "--data-path", "digits")
    hired = aitbc(aitbc_cmd, cli_env, "distributed-training", "discover-workers", "--training-id", tid,
                  "--workers", "3", "--gpu", "cpu")["workers"]

    # money: no terminal and no --yes refuses; --dry-run shows workers x price x rounds; neither funds
    refused = cli(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid)
    assert refused.returncode == 2 and "--yes" in refused.stderr, refused.stderr
    plan = aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid, "--dry-run")
    assert plan["dry_run"] and plan["total_wei"] == str(sum(int(w["price_wei"]) for w in hired) * ROUNDS)
    row = listed(aitbc_cmd, cli_env, tid)
    assert (row["phase"], row["workers"], row["driven"]) == ("initializing", 3, False)

    started = aitbc(aitbc_cmd, cli_env, "distributed-training", "distribute", "--training-id", tid, "--yes")
    follower = subprocess.Popen([*aitbc_cmd, "distributed-training", "logs", tid, "--follow", "--source", "audit"],
                                env=cli_env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while rounds_done(aitbc_home, tid) < 1:
            assert time.monotonic() < deadline, "round 1 never finished"
            time.sleep(0.05)
        row = listed(aitbc_cmd, cli_env, tid)
        assert row["driven"] and row["phase"] in {"distributing", "training", "aggregating"}
        assert row["rounds"] == ROUNDS and 1 <= row["round"] < ROUNDS

        stopped = aitbc(aitbc_cmd, cli_env, "distributed-training", "stop", tid, timeout=180)
        assert stopped["coordinator_pid"] == started["coordinator_pid"]
        assert not pid_alive(started["coordinator_pid"])
        out, err = follower.communicate(timeout=60)  # --follow ends by itself at the terminal phase
    finally:
        follower.kill()
    assert follower.returncode == 0, err
    events = [line.split()[3] for line in out.splitlines()]  # "date time #seq event fields..."
    assert events[0] == "escrow_funded" and events[-1] == "training_failed", out
    assert events.index("training_stopped") < events.index("refund") < len(events) - 1, out

    row = listed(aitbc_cmd, cli_env, tid)
    assert (row["phase"], row["driven"]) == ("failed", False) and row["round"] < ROUNDS

    async def escrow_state():
        profile = load_profile(aitbc_home)
        escrow = EscrowClient(await connect_rpc(profile.chain.rpc_url), profile.chain.escrow)
        (key, _), = await escrow.trainings_named(tid)
        return await escrow.training(key), await escrow.held(key)

    state, held = asyncio.run(escrow_state())
    assert state.closed and state.deposited == state.paid + state.refunded + held.amount
    assert state.refunded == int(stopped["refunded_wei"])  # what came back at once
    assert held.amount > 0  # the rounds never run: held for the workers' receipts, then reclaimed
    assert state.paid == int(stopped["paid_wei"]) > 0  # the accepted rounds are paid

    again = cli(aitbc_cmd, cli_env, "distributed-training", "resume", "--training-id", tid)
    assert again.returncode == 2 and "already ended" in again.stderr
    log = cli(aitbc_cmd, cli_env, "distributed-training", "logs", tid)  # the daemon's own log by default
    assert log.returncode == 0 and f"coordinator daemon {started['coordinator_pid']}" in log.stdout
