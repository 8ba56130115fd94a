"""The market simulation: a real devnet (mosquitto with its accounts and ACL, anvil with the contracts),
thousands of simulated providers in a few processes, and the real coordinator code measured against them.

Phases, each timed:
  set-up      a broker account per provider (password file and ACL reloaded), then on chain each
              provider is given gas and registers with its bond from its own key
  connect     the fleets connect, publish their signed retained offers (last will: clear it)
  discovery   ``Coordinator.discover`` over every offer, ``--discoveries`` times: p50 and p99
  liveness    a coordinator follows ``--busy`` providers at work (they heartbeat) for ``--seconds``:
              its CPU, and the broker's, per 1,000 providers on the market
  trainings   ``--trainings`` trainings at once, each the SDK's whole ``run`` (discover, hire, fund the
              escrow, rounds, spot checks, settle) over the market: every one must complete with wei
              conserved on chain; coordinator CPU, results per second, gas and transactions per training.
              With ``--churn RATE``, that share of the market changes each minute meanwhile: in turn a
              provider crashes (mid-job when one has a job), one leaves cleanly, one joins from a reserve
  fleet kill  one fleet process is killed: the broker publishes each provider's will, and the time
              until no dead offer is left on the market is measured
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import multiprocessing as mp
import os
import statistics
import sys
from collections import Counter
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiomqtt
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from aitbc_agent_sdk import Agent, AgentConfig
from aitbc_agent_sdk.errors import AitbcError
from aitbc_agent_sdk.records import FaultPolicy, JobConfig, TrainingSpec
from aitbc_agent_sdk.chain import TransactionSender, connect_rpc
from aitbc_agent_sdk.chain._registry import RegistryClient
from aitbc_agent_sdk.coordinator.round._liveness import LivenessWatch
from aitbc_agent_sdk.devnet._network import (
    COORDINATOR_WALLET, DevnetOptions, add_broker_accounts, devnet_down, devnet_up, wallet_store,
)
from aitbc_agent_sdk.market import collect_offers
from aitbc_agent_sdk.messaging import SignedChannel
from aitbc_agent_sdk.messaging._settings import BusSettings, connect_bus, resolve_credentials
from aitbc_agent_sdk.messaging._topics import PREFIX
from aitbc_agent_sdk.profile import devnet_password

from .fleet import FleetSpec, fleet_main, raise_open_files
from .provider import HOSTILE
from .usage import ProcessClock

STAKE_WEI = 10**17  # the devnet's own provider bond
GAS_WEI = 10**18
REGISTER_AT_ONCE = 512  # in flight at once: a one-second block takes them together
RAW_MESSAGES = 200
COUNT_QUIET_S = 2.0
READ_TIMEOUT_S = 60.0  # reading every offer once: seconds per 10,000 on this machine
UNSEEN = ("malformed-offer", "forged-offer")  # hostile offers that never reach the book
RAW_PAYLOAD_BYTES = 1500  # about a signed JobAssignment
CHURN_KINDS = ("crash", "leave", "join")  # in turn
RESERVE_MINUTES = 10  # joiners registered at set-up: enough for this long at the churn rate


@dataclass(frozen=True)
class SimConfig:
    providers: int = 500
    fleets: int = 3
    busy: int = 100  # providers at work, heartbeating to the coordinator that follows them
    seconds: float = 10.0  # the liveness window
    discoveries: int = 5
    chain: bool = True  # register and bond every provider on chain
    fleet_kill: bool = True  # kill one fleet process and time the wills
    churn_per_min: float = 0.0  # the share of the market that crashes, leaves or joins each minute of training
    trainings: int = 0
    workers: int = 3  # per training
    rounds: int = 2
    stagger_s: float = 0.0  # trainings start spread over this long, as users arrive
    hostile: int = 0  # providers that misbehave (provider.HOSTILE, in turn), priced below everyone
    verify_on: str = "auto"  # who re-executes spot checks: FaultPolicy.verify_on
    home: Path | None = None


@dataclass
class SimReport:
    providers: int
    fleets: int
    phases_s: dict[str, float] = field(default_factory=dict)
    discovery_s: list[float] = field(default_factory=list)
    reading_s: list[float] = field(default_factory=list)  # collect_offers alone, in the same run
    discovered: list[int] = field(default_factory=list)
    liveness: dict[str, float] = field(default_factory=dict)
    broker: dict[str, float] = field(default_factory=dict)
    fleet_kill: dict[str, float] = field(default_factory=dict)
    churn: dict[str, Any] = field(default_factory=dict)
    registration: dict[str, float] = field(default_factory=dict)
    trainings: int = 0
    completed: list[dict[str, Any]] = field(default_factory=list)  # per training: id, seconds, wei, conserved
    training_phase: dict[str, float] = field(default_factory=dict)
    hostile: dict[str, Any] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        thousands = self.providers / 1000
        return {
            "providers": self.providers, "fleets": self.fleets,
            "discovery_p50_s": pct(self.discovery_s, 0.5), "discovery_p99_s": pct(self.discovery_s, 0.99),
            "discovered": self.discovered, "reading_offers_p50_s": pct(self.reading_s, 0.5),
            "discovery_over_reading_offers": round(statistics.median(self.discovery_s) / statistics.median(
                self.reading_s), 3) if self.reading_s and self.discovery_s else None,
            "coordinator_cpu_percent": self.liveness.get("coordinator_cpu_percent"),
            "liveness_cpu_percent_per_1000_providers":
                round(self.liveness["coordinator_cpu_percent"] / thousands, 3) if self.liveness else None,
            "broker_cpu_percent": self.broker.get("cpu_percent"), "broker_rss_mib": self.broker.get("rss_mib"),
            "trainings": self.trainings, "trainings_completed": len(self.completed),
            "wei_conserved": all(t["conserved"] for t in self.completed) and len(self.completed) == self.trainings,
            **self.training_phase,
            "liveness": self.liveness, "fleet_kill": self.fleet_kill,
            "churn": self.churn, "registration": self.registration, "hostile": self.hostile,
            "phases_s": {k: round(v, 2) for k, v in self.phases_s.items()}, "per_training": self.completed,
            "failures": self.failures,
        }


async def _register_all(rpc_url: str, escrow: str, accounts: list[LocalAccount], report: SimReport) -> None:
    """Gas from anvil's own balance call, then each provider's own `register` with its bond."""
    w3 = await connect_rpc(rpc_url)
    try:
        from aitbc_agent_sdk.chain import EscrowClient

        registry = RegistryClient(w3, await EscrowClient(w3, escrow).registry())
        for account in accounts:
            await w3.provider.make_request("anvil_setBalance", [account.address, hex(GAS_WEI)])
        gate = asyncio.Semaphore(REGISTER_AT_ONCE)
        gas: list[int] = []

        async def one(account: LocalAccount) -> None:
            async with gate:
                receipt = await registry.register(TransactionSender(w3, account), STAKE_WEI,
                                                  keccak(text=f"simulated offer of {account.address}"))
                gas.append(int(receipt["gasUsed"]))

        # A block a second for the registrations, as a public chain mines them: anvil's default of a block
        # per transaction slows as blocks pile up (60 a second after 2,000, 10 a second near 10,000).
        await w3.provider.make_request("evm_setAutomine", [False])
        await w3.provider.make_request("evm_setIntervalMining", [1])
        try:
            await asyncio.gather(*(one(a) for a in accounts))
        finally:
            await w3.provider.make_request("evm_setIntervalMining", [0])
            await w3.provider.make_request("evm_setAutomine", [True])
        report.registration = {"transactions": len(gas), "gas_per_registration": statistics.mean(gas) if gas else 0}
    finally:
        with contextlib.suppress(Exception):
            await w3.provider.disconnect()


def pct(values: list[float], q: float) -> float | None:
    """The ``q`` quantile of ``values`` (nearest rank), rounded; None for none."""
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 4)


def _prices(count: int) -> list[int]:
    # Asks spread over a decade, as a market's would be.
    return [10**16 + (i * 7919 % 1000) * 10**14 for i in range(count)]


async def _wait_reports(queue: mp.Queue, count: int, key: str, timeout: float, *,
                        failures: list[str] | None = None) -> list[dict[str, Any]]:
    """``count`` fleets' reports of ``key``. Past ``timeout``: TimeoutError, or with ``failures`` the
    reports that came, the missing ones recorded there (a fleet that hangs after the trainings must not
    hide what the run measured)."""
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    got: list[dict[str, Any]] = []
    while len(got) < count:
        left = deadline - loop.time()
        if left <= 0:
            missing = sorted(set(range(count)) - {item.get("fleet") for item in got})
            why = f"{len(got)} of {count} fleets reported {key} within {timeout:.0f}s (missing: {missing})"
            if failures is None:
                raise TimeoutError(why)
            failures.append(why)
            return got
        with contextlib.suppress(Exception):
            item = await asyncio.to_thread(queue.get, True, min(left, 1.0))
            if key in item:
                got.append(item)
    return got


async def _offer_count(reader: SignedChannel) -> int:
    # A count must be whole: a loaded machine can pause longer than discovery's quiet period mid-read.
    return len(await collect_offers(reader, timeout=READ_TIMEOUT_S, quiet=COUNT_QUIET_S))


async def simulate(config: SimConfig) -> SimReport:
    raise_open_files()
    report = SimReport(providers=config.providers, fleets=config.fleets)
    with contextlib.ExitStack() as cleanup:
        home = config.home or Path(cleanup.enter_context(tempfile.TemporaryDirectory(prefix="aitbc-sim-")))
        clock = time.monotonic()
        profile = await devnet_up(home, DevnetOptions(providers=0, tls=False))
        cleanup.callback(devnet_down, home)
        report.phases_s["devnet_up"] = time.monotonic() - clock
        broker_pid = next(s.pid for s in profile.services if s.name in ("mosquitto", "amqtt"))

        accounts: list[LocalAccount] = [Account.create() for _ in range(config.providers)]
        reserve: list[LocalAccount] = [Account.create() for _ in range(_reserve_size(config))]
        clock = time.monotonic()
        await asyncio.to_thread(add_broker_accounts, home, [a.address for a in accounts + reserve])
        report.phases_s["broker_accounts"] = time.monotonic() - clock
        if config.chain:
            clock = time.monotonic()
            await _register_all(profile.chain.rpc_url, profile.chain.escrow, accounts + reserve, report)
            report.phases_s["register_on_chain"] = time.monotonic() - clock
        await asyncio.sleep(0.5)  # mosquitto re-reads its password file on SIGHUP, between packets

        ctx = mp.get_context("spawn")
        queue: mp.Queue = ctx.Queue()
        stop, ask = ctx.Event(), ctx.Event()
        prices = _prices(config.providers)
        busy_set = set(range(config.busy))
        kinds = list(HOSTILE)
        hostile = {config.providers - 1 - j: kinds[j % len(kinds)] for j in range(config.hostile)}
        for j, i in enumerate(sorted(hostile)):
            prices[i] = 10**15 + j  # cheapest on the market: trainings hire the ones that can be hired
        unseen = {i for i, kind in hostile.items() if kind in UNSEEN}  # offers discovery must drop
        report.hostile = {"providers": {k: sum(1 for v in hostile.values() if v == k) for k in kinds},
                          "offers_dropped_expected": len(unseen)}
        processes, commands = [], [ctx.Queue() for _ in range(config.fleets)]
        reserve_prices = _prices(config.providers + len(reserve))[config.providers:]
        for f in range(config.fleets):
            idx = list(range(f, config.providers, config.fleets))
            joining = range(f, len(reserve), config.fleets)
            spec = FleetSpec(bus=profile.bus, store_root=profile.store.root or home / "store",
                             rpc_url=profile.chain.rpc_url, escrow=profile.chain.escrow, work_dir=home / "fleets",
                             keys=tuple(accounts[i].key.hex() for i in idx),
                             prices_wei=tuple(prices[i] for i in idx), busy=tuple(i in busy_set for i in idx),
                             hostile=tuple(hostile.get(i) for i in idx),
                             reserve=tuple(reserve[j].key.hex() for j in joining),
                             reserve_prices_wei=tuple(reserve_prices[j] for j in joining))
            process = ctx.Process(target=fleet_main, args=(spec, f, queue, stop, ask, commands[f]), daemon=True)
            process.start()
            processes.append(process)

        def stop_fleets() -> None:
            stop.set()
            for process in processes:
                process.join(timeout=30)
                if process.is_alive():
                    process.kill()

        cleanup.callback(stop_fleets)
        clock = time.monotonic()
        ups = await _wait_reports(queue, config.fleets, "up", timeout=max(120.0, config.providers / 20))
        report.failures += [u["error"] for u in ups if u.get("error")]
        report.phases_s["connect"] = time.monotonic() - clock
        _progress("set-up", report.phases_s, report.registration)

        password = devnet_password(home)
        assert password is not None
        account = await wallet_store(home).unlock(COORDINATOR_WALLET, password)
        # The baseline reads and the churn counts go over a connection of their own, as another process's
        # would: re-subscribing to offers/+ makes the broker send every retained offer again.
        observer = connect_bus(profile.bus, f"sim-observer-{os.getpid()}", persistent=False, timeout=120.0)
        async with Agent(AgentConfig(network="devnet", home=home, name="sim-coordinator"), account=account) as agent, \
                observer:
            reader = SignedChannel(observer, Account.create())
            await _measure_discovery(agent, reader, config, report, config.providers - len(unseen))
            _progress("discovery", {"seconds": report.discovery_s, "reading_s": report.reading_s,
                                    "found": report.discovered})
            await _measure_liveness(agent, config, report, broker_pid, [accounts[i].address for i in busy_set])
            for fleet_commands in commands:
                fleet_commands.put("rest")
            _progress("liveness", report.liveness, report.broker)
            dead = sum(1 for i in range(config.fleets - 1, config.providers, config.fleets) if i not in unseen)
            if config.trainings:
                churning = asyncio.create_task(_churn(commands, config.churn_per_min * config.providers))
                try:
                    await _measure_trainings(agent, config, report, broker_pid)
                    _progress("trainings", report.training_phase, {"completed": len(report.completed)})
                finally:
                    churning.cancel()
                    sent = await asyncio.gather(churning, return_exceptions=True)
                ask.set()
                stats = await _wait_reports(queue, config.fleets, "stats", timeout=120.0, failures=report.failures)
                await _measure_dispatch(profile.bus, agent.address, stats, report)
                _report_churn(config, stats, sent[0] if isinstance(sent[0], int) else 0, report)
                dead = stats_of(stats, config.fleets - 1).get("advertising", dead)
            if config.fleet_kill and config.fleets > 1:
                await _measure_fleet_kill(reader, report, processes[-1], dead)
            report.hostile["coordinator_dropped"] = dict(agent.coordinator.channel.verifier.dropped)
        stop_fleets()
    return report


async def _measure_discovery(agent: Agent, reader: SignedChannel, config: SimConfig, report: SimReport,
                             expected: int) -> None:
    for _ in range(config.discoveries):
        clock = time.monotonic()  # the baseline: only reading and verifying every offer, on another connection
        await collect_offers(reader, timeout=READ_TIMEOUT_S)
        report.reading_s.append(time.monotonic() - clock)
        clock = time.monotonic()
        found = await agent.coordinator.discover(include_busy=True)
        report.discovery_s.append(time.monotonic() - clock)
        report.discovered.append(len(found))
    if any(found != expected for found in report.discovered):
        report.failures.append(f"discovery found {report.discovered} offers; {expected} are valid")


async def _measure_liveness(agent: Agent, config: SimConfig, report: SimReport, broker_pid: int,
                            busy: list[str]) -> None:
    coordinator, broker = ProcessClock(os.getpid()), ProcessClock(broker_pid)
    async with LivenessWatch(agent.coordinator.channel) as watch:
        await watch.follow(busy)
        await asyncio.sleep(1.5)  # a first beat from each
        coordinator.start(), broker.start()
        await asyncio.sleep(config.seconds)
        cpu, broker_cpu = coordinator.percent(), broker.percent()
        heard = sum(1 for p in busy if time.monotonic() - watch.last_seen.get(p, 0.0) < 3.0)
    report.liveness = {"followed": len(busy), "heard_recently": heard, "coordinator_cpu_percent": round(cpu, 2),
                       "cpu_percent_per_followed_worker": round(cpu / max(len(busy), 1), 4)}
    report.broker = {"cpu_percent": round(broker_cpu, 2), "rss_mib": round(broker.rss_mib(), 1)}
    if heard < len(busy):
        report.failures.append(f"liveness: {len(busy) - heard} of {len(busy)} followed workers not heard")


def _progress(phase: str, *parts: dict[str, Any]) -> None:
    """One line to stderr as each phase ends: a long run that is stopped still says what it measured."""
    merged = {k: v for part in parts for k, v in part.items()}
    print(json.dumps({"phase": phase, **merged}, default=str), file=sys.stderr, flush=True)


def _reserve_size(config: SimConfig) -> int:
    if not config.churn_per_min or not config.trainings:
        return 0
    return math.ceil(config.churn_per_min * config.providers * RESERVE_MINUTES / len(CHURN_KINDS))


def stats_of(stats: list[dict[str, Any]], fleet: int) -> dict[str, Any]:
    """That fleet's stats; empty when it did not report them (recorded as a failure)."""
    return next((s for s in stats if s["fleet"] == fleet), {})


async def _churn(commands: list[mp.Queue], per_min: float) -> int:
    """Churn events at ``per_min`` a minute until cancelled, in turn crash, leave and join, each sent to
    the fleets in turn; returns how many were sent."""
    sent = 0
    if per_min <= 0:
        return sent
    try:
        while True:
            await asyncio.sleep(60.0 / per_min)
            commands[sent % len(commands)].put(CHURN_KINDS[sent % len(CHURN_KINDS)])
            sent += 1
    except asyncio.CancelledError:
        return sent


def _report_churn(config: SimConfig, stats: list[dict[str, Any]], sent: int, report: SimReport) -> None:
    events = [e for fleet in stats for e in fleet["churn"]]
    done = [e for e in events if "provider" in e]
    report.churn = {"per_minute": round(config.churn_per_min * config.providers, 2), "sent": sent,
                    "reserve": _reserve_size(config),
                    **{kind: sum(1 for e in done if e["kind"] == kind) for kind in CHURN_KINDS},
                    "crashed_mid_job": sum(1 for e in done if e["kind"] == "crash" and e.get("mid_job")),
                    "skipped": [e["skipped"] for e in events if "skipped" in e],
                    "errors": [e["error"] for e in events if "error" in e]}
    report.failures += [f"churn: {e['kind']} failed: {e['error']}" for e in events if "error" in e]


async def _measure_fleet_kill(reader: SignedChannel, report: SimReport, victim: mp.Process, dead: int) -> None:
    """Kill one fleet (SIGKILL: no goodbye) and time until the market shows only the living."""
    before = await _offer_count(reader)
    clock = time.monotonic()
    victim.kill()
    victim.join()
    left = before
    while left > before - dead and time.monotonic() - clock < 60:
        await asyncio.sleep(0.5)
        left = await _offer_count(reader)
    report.fleet_kill = {"killed": dead, "offers_before": before, "offers_after": left,
                         "wills_cleared_s": round(time.monotonic() - clock, 2)}
    if left != before - dead:
        report.failures.append(f"fleet kill: {left} offers left after killing {dead} of {before};"
                               f" expected {before - dead}")


def _training_spec(index: int, config: SimConfig) -> TrainingSpec:
    # An MLP on a shard of digits: real training, negligible compute, so the market is what is measured
    # (and no experiment log: a hundred TensorBoard writers in the one coordinator are not the market).
    return TrainingSpec(model_type="mlp", target_workers=config.workers, rounds=config.rounds, seed=index,
                        job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1), log_to=(),
                        faults=FaultPolicy(verify_on=config.verify_on))


async def _measure_trainings(agent: Agent, config: SimConfig, report: SimReport, broker_pid: int) -> None:
    """``config.trainings`` whole runs at once on the one coordinator; each must end with wei conserved."""
    report.trainings = config.trainings
    w3 = agent.stack.sender.w3
    me = agent.address
    first_block = await w3.eth.block_number
    nonce_before = await w3.eth.get_transaction_count(me)
    coordinator, broker = ProcessClock(os.getpid()), ProcessClock(broker_pid)
    coordinator.start(), broker.start()
    clock = time.monotonic()

    async def one(index: int) -> None:
        await asyncio.sleep(config.stagger_s * index / max(config.trainings, 1))
        started = time.monotonic()
        try:
            done = await agent.run_distributed_training(_training_spec(index, config), dataset="digits")
            escrow = await agent.escrow_summary(done.training_id)
        except (AitbcError, TimeoutError) as exc:
            report.failures.append(f"training {index}: {type(exc).__name__}: {exc}")
            return
        conserved = escrow.deposited_wei == escrow.paid_wei + escrow.refunded_wei + escrow.held_wei
        spend = done.verification
        report.completed.append({"training_id": done.training_id, "seconds": round(time.monotonic() - started, 2),
                                 "checks": spend.checks if spend else 0,
                                 "check_seconds_here": spend.coordinator_seconds if spend else 0.0,
                                 "verifier_wei": spend.verifier_wei if spend else 0,
                                 "status": done.status.value, "deposited_wei": escrow.deposited_wei,
                                 "paid_wei": escrow.paid_wei, "refunded_wei": escrow.refunded_wei,
                                 "held_wei": escrow.held_wei, "conserved": conserved,
                                 "accuracy": done.final_accuracy})
        if not conserved:
            report.failures.append(f"training {done.training_id}: wei not conserved: {escrow}")

    await asyncio.gather(*(one(i) for i in range(config.trainings)))
    wall = time.monotonic() - clock
    cpu, broker_cpu = coordinator.percent(), broker.percent()
    transactions = await w3.eth.get_transaction_count(me) - nonce_before
    gas = 0
    for number in range(first_block + 1, await w3.eth.block_number + 1):
        block = await w3.eth.get_block(number, full_transactions=True)
        for tx in block["transactions"]:
            if tx["from"] == me:
                gas += int((await w3.eth.get_transaction_receipt(tx["hash"]))["gasUsed"])
    jobs = config.trainings * config.workers * config.rounds
    report.training_phase = {
        "trainings_wall_s": round(wall, 1),
        "training_p50_s": statistics.median([t["seconds"] for t in report.completed]) if report.completed else None,
        "results_per_s": round(jobs / wall, 2) if wall > 0 else None,
        "coordinator_cpu_percent_trainings": round(cpu, 1),
        "coordinator_cpu_s_per_training": round(cpu / 100 * wall / config.trainings, 2),
        "coordinator_cpu_s_per_worker_round": round(cpu / 100 * wall / jobs, 3),
        "broker_cpu_percent_trainings": round(broker_cpu, 1),
        "spot_checks_per_training": round(statistics.mean(t["checks"] for t in report.completed), 1)
        if report.completed else None,
        "check_seconds_on_coordinator_per_training": round(statistics.mean(
            t["check_seconds_here"] for t in report.completed), 2) if report.completed else None,
        "transactions_per_training": round(transactions / config.trainings, 2),
        "gas_per_training": round(gas / config.trainings),
    }


async def _measure_dispatch(bus: BusSettings, identity: str, stats: list[dict[str, Any]], report: SimReport) -> None:
    """Jobs' dispatch times (signed by the coordinator, taken up by the provider) against plain aiomqtt
    carrying a payload of a job's size, one at a time, on the same broker in the same run."""
    dispatch = sorted(d for fleet in stats for d in fleet["dispatch_s"])
    report.hostile["providers_dropped"] = dict(sum((Counter(fleet["dropped"]) for fleet in stats), Counter()))
    credentials = resolve_credentials(bus, identity)
    assert credentials is not None
    topic, payload, raw = f"{PREFIX}/jobs/raw-baseline-{os.getpid()}", os.urandom(RAW_PAYLOAD_BYTES), []
    login = {"username": credentials.username, "password": credentials.password}
    async with aiomqtt.Client(bus.host, bus.port, identifier=f"raw-sub-{os.getpid()}", **login) as sub, \
            aiomqtt.Client(bus.host, bus.port, identifier=f"raw-pub-{os.getpid()}", **login) as pub:
        await sub.subscribe(topic, qos=1)
        messages = aiter(sub.messages)
        for _ in range(RAW_MESSAGES):
            sent = time.monotonic()
            await pub.publish(topic, payload, qos=1)
            await asyncio.wait_for(anext(messages), 10.0)
            raw.append(time.monotonic() - sent)

    report.training_phase.update({
        "jobs_taken": len(dispatch), "dispatch_p50_s": pct(dispatch, 0.5), "dispatch_p99_s": pct(dispatch, 0.99),
        "raw_aiomqtt_p50_s": pct(raw, 0.5),
        "raw_over_dispatch_latency": round(pct(raw, 0.5) / pct(dispatch, 0.5), 3) if dispatch else None})
