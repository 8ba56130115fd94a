"""The seed's Example 3 with dynamic scaling, on a real devnet (mosquitto, anvil, provider daemons).

One provider daemon is throttled for its first two jobs (eight-second stalls) and then recovers;
a fifth provider waits on the market. The pool must hire it while the throttled worker drags
the rounds down, shrink the throttled worker's share, and release a worker once rounds are fast.
"""

import asyncio
import json
import subprocess
import sys

import pytest

from aitbc_agent_sdk.chain import EscrowClient, connect_rpc, training_key
from aitbc_agent_sdk.profile import load_profile
from conftest import REPO
from scripts.chaos.extra_provider import add_provider_daemon

pytestmark = pytest.mark.slow
SCRIPT = REPO / "scenarios" / "37_distributed_ai_training" / "fault_tolerant.py"


def test_the_elastic_pool_hires_under_load_shrinks_the_straggler_and_releases_when_fast(aitbc_cmd, cli_env,
                                                                                           aitbc_home):
    aitbc_home.mkdir(parents=True, exist_ok=True)
    cli_env.pop("AITBC_WALLET_PASSWORD", None)
    up = subprocess.run([*aitbc_cmd, "devnet", "up", "--providers", "4", "--json"], env=cli_env,
                        capture_output=True, text=True, timeout=300)
    assert up.returncode == 0, up.stderr
    try:
        throttled = asyncio.run(add_provider_daemon(aitbc_home, "throttled", "throttled", price_wei=9 * 10**15))
        done = subprocess.run([sys.executable, str(SCRIPT), "--devnet", "--home", str(aitbc_home), "--workers", "3",
                               "--rounds", "5", "--target-throughput", "400", "--min-workers", "3",
                               "--max-workers", "4"], env=cli_env, capture_output=True, text=True, timeout=400)
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        summary = json.loads(done.stdout.split("SUMMARY ", 1)[1])
        assert summary["phase"] == "complete" and summary["accuracy"] > 0.9
        events = summary["events"]
        assert "worker_added" in events and "worker_released" in events
        assert events.index("worker_added") < events.index("worker_released")  # grew, then shrank
        assert summary["pool"][0] == 3 and max(summary["pool"]) == 4 and summary["pool"][-1] == 3
        assert "Added worker: " in done.stdout and "Removed worker: " in done.stdout  # the seed's own prints
        shares = [json.loads(line.split(" ", 2)[2])["shares"] for line in done.stdout.splitlines()
                  if line.startswith("audit: rebalanced")]
        mine = [s[throttled] for s in shares if throttled in s]
        assert mine and mine[0] < 1438 // 3  # the straggler's data share shrank

        async def conserved() -> None:
            profile = load_profile(aitbc_home)
            escrow = EscrowClient(await connect_rpc(profile.chain.rpc_url), profile.chain.escrow)
            state = await escrow.training(training_key(summary["training_id"]))
            assert state.closed and state.deposited == state.paid + state.refunded
            slots = [e for e in await escrow.events(training_key(summary["training_id"])) if e.name == "SlotOpened"]
            assert len(slots) == 4  # three at the start, one hired

        asyncio.run(conserved())
    finally:
        subprocess.run([*aitbc_cmd, "devnet", "down"], env=cli_env, capture_output=True, timeout=120)
