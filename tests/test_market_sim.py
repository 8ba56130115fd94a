"""The market at scale, small form (the 10,000-provider form is bench/bench_market.py).

Real parts: the devnet's mosquitto with a broker account and ACL entry per provider, anvil with the
contracts and every provider registered and bonded from its own key. The coordinator is the SDK's own
(discovery, liveness and whole trainings); the providers are simulated, several hundred to a process,
and while the trainings run some crash mid-job, some leave and others join.
"""

from __future__ import annotations

import asyncio
import subprocess
import time
import sys

import pytest
from eth_account import Account

from aitbc_agent_sdk.coordinator.round._liveness import LivenessWatch
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel, topics
from aitbc_agent_sdk.records import Heartbeat
from conftest import REPO
from scripts.market_sim.simulation import SimConfig, simulate

PROVIDERS = 240
TRAININGS = 4
CHURN = 0.05  # of the market a minute: 12 events a minute, one every 5 s
HOSTILE = 8  # priced below everyone: the trainings hire the ones that can be hired


def test_a_market_of_hundreds_trains_at_once_is_discovered_whole_and_forgets_the_dead(tmp_path) -> None:
    report = asyncio.run(simulate(SimConfig(providers=PROVIDERS, fleets=3, busy=30, seconds=3.0, discoveries=3,
                                            trainings=TRAININGS, workers=3, rounds=2, hostile=HOSTILE,
                                            verify_on="market", churn_per_min=CHURN, home=tmp_path / "home")))
    summary = report.summary()
    assert summary["failures"] == []
    # Strangers in the mix: two each of malformed offers, forged offers, floods of junk on the trainings' own
    # topics, and providers that vanish after consenting. Discovery drops the bad offers, no serving loop
    # ends, and the honest trainings finish within a few heartbeat timeouts of one another.
    assert summary["discovered"] == [PROVIDERS - HOSTILE // 2] * 3
    assert summary["hostile"]["coordinator_dropped"].get("malformed", 0) > 0
    seconds = [t["seconds"] for t in report.completed]
    assert max(seconds) < min(seconds) + 90  # a crash mid-job costs its training a heartbeat timeout and a spare
    # Four whole runs at once on one coordinator (discover, hire, fund, train, spot-check, settle), each
    # with its escrow's wei conserved on chain, and every job taken up by a real provider.
    assert summary["trainings_completed"] == TRAININGS and summary["wei_conserved"] is True
    assert all(t["status"] == "complete" and t["accuracy"] > 0.5 for t in report.completed)
    assert summary["jobs_taken"] >= TRAININGS * 3 * 2
    assert summary["transactions_per_training"] >= 3  # deposit, payout, refund at least
    assert summary["registration"]["transactions"] == PROVIDERS + summary["churn"]["reserve"]  # joiners too
    assert summary["liveness"]["heard_recently"] == summary["liveness"]["followed"] == 30
    # Churn during the trainings: at least one provider crashed holding a job (its coordinator had to
    # notice and hire a spare), one left cleanly and one joined, and still every training completed.
    churn = summary["churn"]
    assert churn["crash"] >= 1 and churn["leave"] >= 1 and churn["join"] >= 1, churn
    assert churn["crashed_mid_job"] >= 1 and churn["errors"] == [], churn
    # SIGKILL, no goodbye: the broker's wills cleared exactly the dead fleet's offers.
    kill = summary["fleet_kill"]
    assert kill["offers_after"] == kill["offers_before"] - kill["killed"]
    assert kill["killed"] >= PROVIDERS // 3 - HOSTILE
    assert kill["wills_cleared_s"] < 30


def test_the_coordinator_hears_only_the_workers_it_follows() -> None:
    async def scenario() -> tuple[set[str], frozenset[str], str]:
        bus = InMemoryBus()
        workers = [Account.create() for _ in range(3)]
        async with LivenessWatch(SignedChannel(bus, Account.create())) as watch:
            await watch.follow([workers[0].address, workers[1].address])
            await watch.follow([workers[1].address])  # the first is let go
            for account in workers:
                beat = Heartbeat(provider=account.address, sent_at=time.time(), busy_jobs=1)
                await SignedChannel(bus, account).publish(topics.heartbeat(account.address), beat)
            async with asyncio.timeout(10):
                while workers[1].address not in watch.last_seen:
                    await asyncio.sleep(0.01)
            heard, followed = set(watch.last_seen), watch.followed
        await bus.close()
        return heard, followed, workers[1].address

    heard, followed, kept = asyncio.run(scenario())
    assert heard == set(followed) == {kept}


def test_simulate_market_refuses_bad_arguments_with_exit_2() -> None:
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "simulate_market.py"), "--providers", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "--providers must be >= 1" in done.stderr
