"""Chaos scenarios for fault-tolerant federated training, on real processes and real servers.

Each scenario starts a fresh devnet (``aitbc devnet up --ipfs daemon``: mosquitto, anvil with
the contracts, a js-ipfs daemon, provider daemons) in its own ``AITBC_HOME``, runs the CLI
flow (init with spares, upload-data, discover-workers, distribute, monitor --follow) while
injecting one fault, then checks the outcome against the chain and the audit log:

* the training completed, and its final accuracy is within ``accuracy_tolerance`` of ``clean``;
* the faulty worker was paid nothing (chain ``Released`` events and ``payments --json``);
  in the scenarios without a faulty worker every hired worker was paid in full;
* wei are conserved on chain: the escrow is closed and deposited == paid + refunded + held
  (held: what active slots were not paid, redeemable by receipts for the claim window), and
  the ``Released`` and ``Redeemed`` events add up to ``paid``;
* the scenario's audit event is in the hash-chained audit log, and the log verifies.

The devnet is always torn down (stopped processes are SIGCONT-ed first, then ``devnet
down``, then anything left that still references the scenario's home is killed by pid).

``run_scenario`` returns a :class:`ScenarioResult`; ``scripts/chaos/run_chaos.py`` is the
command line and ``tests/test_chaos.py`` the CI subset.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from aitbc_agent_sdk.profile import BusSettings

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:  # ``scripts.chaos`` importable when run as a file
    sys.path.insert(0, str(REPO))

from scripts.chaos.byzantine import BEHAVIOURS, IMPOSTORS  # noqa: E402
from scripts.chaos.verifiers import VERIFIERS  # noqa: E402

WEI_PER_ETH = 10**18
BYZANTINE_WALLET = "byzantine"
FAULTY_SCENARIOS = ("kill-provider", "straggler")
SCENARIOS: tuple[str, ...] = ("clean", "kill-provider", "straggler", "mosquitto-restart", "coordinator-kill",
                              *(f"byzantine-{b}" for b in BEHAVIOURS), "honest-noniid")
# Whose bond the evidence must take (the signed checkpoint proves the fault), and whose it must not.
SLASHED: tuple[str, ...] = ("byzantine-nan", "byzantine-lazy", "byzantine-copycat", "byzantine-device-liar")
NOT_SLASHED = ("byzantine-free-rider", "byzantine-lazy-honest", "byzantine-scaled", "byzantine-random",
               "byzantine-stale", "byzantine-forged", "byzantine-cid-mismatch")
NON_IID = {"honest-noniid": 0.1}  # scenario -> Dirichlet alpha of its label-skewed shards
# fake-gpu: a provider claiming a GPU it lacks, flagged by the hardware challenge at hiring and never hired.
SCENARIOS += tuple(IMPOSTORS)
# Honest workers whose results are not bit-exact, hired as workers and owed their full pay: scenario -> behaviour.
# honest-gpu-noise: a GPU's non-deterministic kernels, emulated on this CPU host (scripts/chaos/byzantine.py).
NOISY = {"honest-gpu-noise": "gpu-noise"}
SCENARIOS += tuple(NOISY)
# Verifiers that lie, hired as workers of a training whose spot checks are re-executed on the market
# (--verify-on market): each is slashed on the referee's word or a canary's. colluding-verifier approves its
# partner's, a lazy worker's, skipped work: the partner must still be caught by an honest verifier.
VERIFIER_ROWS = tuple(VERIFIERS)
SCENARIOS += VERIFIER_ROWS
SLASHED += VERIFIER_ROWS  # the liar, or (colluding) the partner it covered for
VERIFIER_SLASHED = ("lazy-verifier", "hostile-verifier")  # caught for sure; the colluder only by a canary
COLLUDER_WALLET, PARTNER_BEHAVIOUR = "colluder", "lazy"
CANARY_RATE = 0.5  # the chaos rows' rate: a lazy verifier asked ~15 times escapes every canary with p < 1e-4
QUICK: tuple[str, ...] = ("clean", "kill-provider", "byzantine-nan", "coordinator-kill")


class ChaosError(Exception):
    """A step of a scenario could not be carried out (not a failed check)."""


@dataclass(frozen=True)
class ChaosConfig:
    workers: int = 4
    spares: int = 1
    rounds: int = 3
    epochs: int = 1
    seed: int = 0
    heartbeat_timeout_s: float = 3.0
    accuracy_tolerance: float = 0.01
    price_wei: int = WEI_PER_ETH // 100  # the devnet's base price; provider i asks base * (1 + i/10)
    byzantine_price_wei: int = WEI_PER_ETH // 100 * 9 // 10  # below every honest ask: hired as a worker
    stake_wei: int = WEI_PER_ETH // 10
    fault_round: int = 2
    training_timeout_s: float = 420.0
    keep_failed: bool = True  # leave a failed scenario's home for inspection (processes are still stopped)
    workdir: Path | None = None  # where the scenario homes go (a temp dir by default)
    python: str = sys.executable


@dataclass
class ScenarioResult:
    scenario: str
    passed: bool = False
    complete: bool = False
    phase: str | None = None
    accuracy: float | None = None
    reference_accuracy: float | None = None
    delta: float | None = None
    faulty_worker: str | None = None
    faulty_paid_wei: int | None = None  # None: no faulty worker in this scenario
    slashed: bool | None = None  # whether any worker's bond was slashed
    all_paid: bool | None = None  # scenarios without a faulty worker: every hired worker paid in full
    conservation_ok: bool | None = None  # None: not checked (the scenario failed before)
    deposited_wei: int | None = None
    paid_wei: int | None = None
    refunded_wei: int | None = None
    held_wei: int | None = None
    expected_event: str = ""
    event_seen: bool = False
    audit_ok: bool | None = None
    detection_s: float | None = None  # silent_s of worker_failed, else time from the fault to its first event
    silent_s: float | None = None
    wall_s: float = 0.0
    training_id: str | None = None
    home: str | None = None
    events: dict[str, int] = field(default_factory=dict)
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    diagnostics: str = ""

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# -- processes ------------------------------------------------------------------------------------

def _read(path: str) -> bytes:
    try:
        with open(path, "rb") as handle:
            return handle.read()
    except OSError:
        return b""


def _ppid(pid: int) -> int | None:
    stat = _read(f"/proc/{pid}/stat").decode(errors="replace")
    try:
        return int(stat.rsplit(") ", 1)[1].split()[1])
    except (IndexError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    return _read(f"/proc/{pid}/cmdline").replace(b"\0", b" ").decode(errors="replace")


def _pids() -> list[int]:
    return [int(p) for p in os.listdir("/proc") if p.isdigit()]


def children(pid: int) -> list[int]:
    return [p for p in _pids() if _ppid(p) == pid]


def worker_process_of(daemon_pid: int) -> int | None:
    """The training subprocess (``provider.worker_process``) of a provider daemon, if one runs.

    Sandboxed, the daemon's child is bwrap and the Python process sits further down: stopping
    bwrap would not stop the training, so this looks for the interpreter itself. A sandboxed
    provider also keeps a spare process for the next job, started after the current one: the
    oldest interpreter is the one training.
    """
    pending, found = children(daemon_pid), []
    while pending:
        pid = pending.pop(0)
        line = _cmdline(pid)
        if "aitbc_agent_sdk.provider._worker_process" not in line or not _alive(pid):
            continue
        if Path(line.split(" ", 1)[0]).name in ("bwrap", "setpriv"):
            pending += children(pid)
        else:
            found.append(pid)
    return min(found, key=_start_time, default=None)


def _start_time(pid: int) -> int:
    try:
        return int(_read(f"/proc/{pid}/stat").decode(errors="replace").rsplit(") ", 1)[1].split()[19])
    except (IndexError, ValueError):
        return 0


def _alive(pid: int) -> bool:
    from aitbc_agent_sdk.devnet._service import pid_alive
    return pid_alive(pid)


def processes_using(home: Path) -> list[int]:
    """Our processes whose argv, cwd, environment or open files mention ``home``."""
    mark = str(home)
    me, uid = os.getpid(), os.getuid()
    found = []
    for pid in _pids():
        if pid == me:
            continue
        try:
            if os.stat(f"/proc/{pid}").st_uid != uid or not _alive(pid):
                continue
        except OSError:
            continue
        hit = mark in _cmdline(pid) or mark.encode() in _read(f"/proc/{pid}/environ")
        if not hit:
            with contextlib.suppress(OSError):
                hit = os.readlink(f"/proc/{pid}/cwd").startswith(mark)
        if not hit:
            with contextlib.suppress(OSError):
                for fd in os.listdir(f"/proc/{pid}/fd"):
                    with contextlib.suppress(OSError):
                        if os.readlink(f"/proc/{pid}/fd/{fd}").startswith(mark):
                            hit = True
                            break
        if hit:
            found.append(pid)
    return found


def _signal(pid: int, sig: signal.Signals) -> bool:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


async def _wait_dead(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        await asyncio.sleep(0.05)
    return not _alive(pid)


# -- the bus, as a bystander ----------------------------------------------------------------------

class BusWatch:
    """Progress and results of one training, straight from the broker, for timing the faults."""

    def __init__(self, bus: BusSettings, training_id: str) -> None:
        self.bus, self.training_id = bus, training_id
        self.items: list[Any] = []
        self.result_at: dict[str, float] = {}  # job id -> time.time() its result was published
        self._waiters: list[tuple[Callable[[Any], bool], asyncio.Future[Any]]] = []
        self._stack = contextlib.AsyncExitStack()
        self._tasks: list[asyncio.Task[None]] = []

    async def __aenter__(self) -> BusWatch:
        from eth_account import Account

        from aitbc_agent_sdk.messaging import SignedChannel, topics
        from aitbc_agent_sdk.messaging._settings import connect_bus
        from aitbc_agent_sdk.records import JobResult, Progress

        bus = await self._stack.enter_async_context(
            connect_bus(self.bus, f"chaos-watch-{time.time_ns()}", persistent=False))
        channel = SignedChannel(bus, Account.create())
        ready = [asyncio.Event(), asyncio.Event()]
        self._tasks = [asyncio.create_task(self._listen(channel, topics.all_progress(self.training_id), Progress,
                                                        ready[0])),
                       asyncio.create_task(self._listen(channel, topics.results(self.training_id), JobResult,
                                                        ready[1]))]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in ready)), 30)
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        with contextlib.suppress(Exception):
            await self._stack.aclose()

    async def _listen(self, channel: Any, topic: str, model: type, ready: asyncio.Event) -> None:
        async with channel.subscribe(topic, model) as stream:
            ready.set()
            async for verified in stream:
                self._arrived(verified.message)

    def _arrived(self, item: Any) -> None:
        self.items.append(item)
        if type(item).__name__ == "JobResult":
            self.result_at.setdefault(item.job_id, time.time())
        for entry in list(self._waiters):
            predicate, future = entry
            if not future.done() and predicate(item):
                future.set_result(item)
                self._waiters.remove(entry)

    async def wait(self, predicate: Callable[[Any], bool], timeout: float) -> Any:
        for item in self.items:
            if predicate(item):
                return item
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        entry = (predicate, future)
        self._waiters.append(entry)
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            if entry in self._waiters:
                self._waiters.remove(entry)

    def result_of(self, worker: str, round_: int) -> Any | None:
        from aitbc_agent_sdk.records import JobResult
        return next((i for i in self.items if isinstance(i, JobResult) and i.worker_id == worker
                     and i.round == round_), None)


def is_progress(worker: str | None = None, round_: int | None = None, status: str | None = None) -> Callable[[Any], bool]:
    from aitbc_agent_sdk.records import Progress

    def check(item: Any) -> bool:
        return (isinstance(item, Progress) and (worker is None or item.worker_id == worker)
                and (round_ is None or item.round == round_) and (status is None or item.status == status))
    return check


# -- one devnet, one training ---------------------------------------------------------------------

class ScenarioRun:
    """A fresh devnet in its own home, the training on it, and what the fault did."""

    def __init__(self, name: str, config: ChaosConfig, root: Path) -> None:
        self.name = name
        self.config = config
        root.mkdir(parents=True, exist_ok=True)
        self.home = Path(tempfile.mkdtemp(prefix=f"{name}-", dir=root)) / "aitbc-home"
        self.home.mkdir(parents=True)
        self.env = dict(os.environ)
        self.env["AITBC_HOME"] = str(self.home)
        self.env.pop("AITBC_WALLET_PASSWORD", None)  # the devnet makes and keeps its own
        self.tid: str | None = None
        self.hired: list[dict[str, Any]] = []
        self.target: str | None = None
        self.fault_at: float | None = None  # time.time() of the fault
        self.stopped: set[int] = set()  # SIGSTOP-ed pids, SIGCONT-ed on teardown
        self.coordinator_pids: set[int] = set()
        self.notes: list[str] = []
        self.watch: BusWatch | None = None
        self.flagged: str | None = None  # an impostor's address: flagged at hiring, hired as nothing
        self.noisy: str | None = None  # an honest worker whose results differ within the tolerance
        self.verifier: str | None = None  # a verifier that lies (the verifier rows), an honest worker otherwise

    # -- the CLI -----------------------------------------------------------------------------------
    async def cli(self, *args: str, timeout: float = 240.0, json_out: bool = True) -> Any:
        argv = [self.config.python, "-m", "aitbc_cli.app", *args, *(["--json"] if json_out else [])]
        proc = await asyncio.create_subprocess_exec(*argv, env=self.env, cwd=REPO, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.PIPE)
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout)
        except BaseException as exc:  # timed out, or the scenario was cancelled: the command must not outlive it
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
            await asyncio.shield(proc.wait())
            if isinstance(exc, TimeoutError):
                raise ChaosError(f"aitbc {' '.join(args)} did not finish within {timeout:.0f}s") from None
            raise
        if proc.returncode != 0:
            raise ChaosError(f"aitbc {' '.join(args)} exited {proc.returncode}:\n"
                             f"{out.decode(errors='replace')[-2000:]}\n{err.decode(errors='replace')[-2000:]}")
        if not json_out:
            return out.decode()
        lines = out.decode().strip().splitlines()
        if not lines:
            raise ChaosError(f"aitbc {' '.join(args)} printed nothing")
        return json.loads(lines[-1])

    # -- set-up ------------------------------------------------------------------------------------
    async def devnet_up(self, honest: int) -> dict[str, Any]:
        price_eth = str(Decimal(self.config.price_wei) / WEI_PER_ETH)
        return await self.cli("devnet", "up", "--providers", str(honest), "--ipfs", "daemon",
                              "--price-eth", price_eth, timeout=300)

    async def add_byzantine(self, behaviour: str, total_providers: int, *, wallet: str = BYZANTINE_WALLET,
                            extra: Sequence[str] = ()) -> str:
        """A Byzantine provider daemon with its own funded wallet, priced below every honest one."""
        from aitbc_agent_sdk.chain import TransactionSender, connect_rpc
        from aitbc_agent_sdk.chain._deployment import fund_accounts
        from aitbc_agent_sdk.errors import ConfigError
        from aitbc_agent_sdk.devnet._anvil import dev_accounts
        from aitbc_agent_sdk.devnet._network import DEVNET_PROVIDER_ARGS, wait_for_offers, wallet_store
        from aitbc_agent_sdk.devnet._service import spawn
        from aitbc_agent_sdk.profile import PASSWORD_FILE, load_profile, save_profile

        profile = load_profile(self.home)
        password = (self.home / "devnet" / PASSWORD_FILE).read_text().strip()
        wallets = wallet_store(self.home)
        try:
            address = (await wallets.get(wallet)).address
        except ConfigError:
            address = (await wallets.create(wallet, password)).address
        w3 = await connect_rpc(profile.chain.rpc_url)
        try:
            await fund_accounts(TransactionSender(w3, dev_accounts(1)[0]), [address], WEI_PER_ETH)
        finally:
            with contextlib.suppress(Exception):
                await w3.provider.disconnect()
        service = spawn(f"provider:{wallet}",
                        [self.config.python, str(REPO / "scripts" / "chaos" / "byzantine_provider.py"),
                         "--home", str(self.home), "--wallet", wallet,
                         "--price-wei", str(self.config.byzantine_price_wei),
                         "--stake-wei", str(self.config.stake_wei), "--behaviour", behaviour, *extra,
                         *DEVNET_PROVIDER_ARGS],
                        port=0, log=self.home / "devnet" / "logs" / f"{wallet}.log", cwd=REPO,
                        env=self.env, stdin_data=(password + "\n").encode())
        profile = profile.model_copy(update={"services": (*profile.services, service)})
        save_profile(self.home, profile)  # so that devnet down stops it too
        await wait_for_offers(profile, total_providers)
        return address

    async def start_training(self) -> None:
        import numpy as np

        from aitbc_agent_sdk.data._datasets import load_dataset

        c = self.config
        data = await asyncio.to_thread(load_dataset, "digits")
        dataset = self.home.parent / "digits.npz"
        await asyncio.to_thread(np.savez, dataset, x=data.features.numpy(), y=data.labels.numpy())
        skew = (("--partition", "dirichlet", "--alpha", str(NON_IID[self.name])) if self.name in NON_IID else ())
        if self.name in VERIFIER_ROWS:
            skew += ("--verify-on", "market", "--canary-rate", str(CANARY_RATE))
        init = await self.cli("distributed-training", "init", "--wallet", "dev", "--model-type", "mlp",
                              "--dataset-size", str(dataset.stat().st_size), "--target-workers", str(c.workers),
                              "--rounds", str(c.rounds), "--epochs", str(c.epochs), "--seed", str(c.seed),
                              "--spares", str(c.spares), "--heartbeat-timeout", str(c.heartbeat_timeout_s), *skew)
        self.tid = init["training_id"]
        await self.cli("distributed-training", "upload-data", "--training-id", self.tid, "--data-path", str(dataset))
        hired = await self.cli("distributed-training", "discover-workers", "--training-id", self.tid,
                               "--min-gpu", "cpu", "--required-workers", str(c.workers))
        self.hired = hired["workers"]
        roles = [w["role"] for w in self.hired]
        spares = 0 if self.name in NOISY else c.spares  # it fills the last worker's place: none is left over
        if roles.count("worker") != c.workers or roles.count("spare") != spares:
            raise ChaosError(f"hired {roles}, expected {c.workers} workers and {spares} spares")

    async def distribute(self) -> None:
        assert self.tid is not None
        out = await self.cli("distributed-training", "distribute", "--training-id", self.tid,
                             "--strategy", "data-parallel", "--yes")
        self.coordinator_pids.add(int(out["coordinator_pid"]))

    async def follow(self) -> dict[str, Any]:
        assert self.tid is not None
        return await self.cli("distributed-training", "monitor", "--training-id", self.tid, "--follow",
                              "--interval", "0.5", timeout=self.config.training_timeout_s)

    # -- looking things up -------------------------------------------------------------------------
    def workers(self) -> list[dict[str, Any]]:
        return [w for w in self.hired if w["role"] == "worker"]

    def provider_pid(self, address: str) -> int:
        status = json.loads((self.home / "providers" / address / "status.json").read_text())
        pid = int(status["pid"])
        if not _alive(pid):
            raise ChaosError(f"provider daemon {pid} of {address} is not running")
        return pid

    def coordinator_pid(self) -> int:
        assert self.tid is not None
        from aitbc_agent_sdk.profile import training_dir
        pid = int((training_dir(self.home, self.tid) / "coordinator.pid").read_text().strip())
        self.coordinator_pids.add(pid)
        return pid

    async def training_round(self) -> tuple[int, str]:
        """(rounds done, phase) from the coordinator's database, read as raw JSON (no model validation,
        so a record written by a newer CLI than this process imported still reads)."""
        import sqlite3
        assert self.tid is not None

        def read() -> tuple[int, str]:
            with contextlib.closing(sqlite3.connect(f"file:{self.home / 'aitbc.db'}?mode=ro", uri=True,
                                                    timeout=10)) as db:
                row = db.execute("SELECT data FROM trainings WHERE training_id=?", (self.tid,)).fetchone()
            if row is None:
                raise ChaosError(f"no training {self.tid} in {self.home / 'aitbc.db'}")
            record = json.loads(row[0])
            return int(record.get("round", 0)), str(record.get("phase"))
        return await asyncio.to_thread(read)

    async def wait_round_done(self, round_: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            done, phase = await self.training_round()
            if done >= round_ or phase in ("complete", "failed"):
                return
            await asyncio.sleep(0.2)
        raise ChaosError(f"round {round_} did not end within {timeout:.0f}s")

    def diagnostics(self) -> str:
        from aitbc_agent_sdk.devnet._service import tail
        from aitbc_agent_sdk.profile import training_dir
        parts = []
        if self.tid is not None:
            log = training_dir(self.home, self.tid) / "coordinator.log"
            parts.append(f"--- {log} (coordinator, last lines)\n{_grep_tail(log, 60)}")
        logs = self.home / "devnet" / "logs"
        if logs.is_dir():
            for path in sorted(logs.glob("*.log")):
                parts.append(f"--- {path} (last lines)\n{tail(path, 8)}")
        return "\n".join(parts)

    # -- tear-down ---------------------------------------------------------------------------------
    async def teardown(self) -> list[str]:
        """Stop everything this scenario started; returns what had to be killed after devnet down."""
        for pid in list(self.stopped):
            _signal(pid, signal.SIGCONT)
        self.stopped.clear()
        for pid in self.coordinator_pids:  # a finished coordinator has exited by itself
            if _alive(pid) and "aitbc_agent_sdk.flow._daemon" in _cmdline(pid):
                self.notes.append(f"coordinator {pid} still running at tear-down: killed")
                _signal(pid, signal.SIGKILL)
        try:
            await self.cli("devnet", "down", timeout=120)
        except ChaosError as exc:
            self.notes.append(f"devnet down failed ({exc}); killing by pid")
            with contextlib.suppress(Exception):
                from aitbc_agent_sdk.devnet._network import devnet_down
                await asyncio.to_thread(devnet_down, self.home)
        leftovers = []
        for attempt in range(3):
            pids = processes_using(self.home.parent)
            if not pids:
                break
            for pid in pids:
                leftovers.append(f"{pid} {_cmdline(pid)[:120]}")
                _signal(pid, signal.SIGCONT)
                _signal(pid, signal.SIGKILL)
            await asyncio.sleep(0.5)
        return leftovers


def _grep_tail(path: Path, lines: int) -> str:
    """The log's last lines, without the HTTP request noise."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    kept = [line[:400] for line in text if " httpx: " not in line]
    return "\n".join(kept[-lines:])


# -- faults ---------------------------------------------------------------------------------------

Fault = Callable[[ScenarioRun], Awaitable[None]]


async def fault_kill_provider(run: ScenarioRun) -> None:
    """kill -9 one hired worker's provider daemon once its round-2 job reports "running"."""
    assert run.watch is not None and run.target is not None
    target, fault_round = run.target, run.config.fault_round
    pid = run.provider_pid(target)
    seen = await run.watch.wait(is_progress(target, fault_round, "running"), run.config.training_timeout_s)
    _signal(pid, signal.SIGKILL)
    run.fault_at = time.time()
    run.notes.append(f"kill -9 provider daemon {pid} ({target[:10]}) at its round-{fault_round} progress "
                     f"'{seen.status}' epoch {seen.epoch}")
    await asyncio.sleep(1.0)
    if run.watch.result_of(target, fault_round) is not None:
        run.notes.append(f"its round-{fault_round} result was already out: the failure shows in round "
                         f"{fault_round + 1}")


async def fault_straggler(run: ScenarioRun) -> None:
    """SIGSTOP one worker's training subprocess mid-round; SIGCONT it once that round has ended."""
    assert run.watch is not None and run.target is not None
    target, fault_round = run.target, run.config.fault_round
    daemon = run.provider_pid(target)
    await run.watch.wait(is_progress(target, fault_round, "running"), run.config.training_timeout_s)
    worker = None
    deadline = time.monotonic() + 5.0
    while worker is None and time.monotonic() < deadline:  # a cancelled job's process is restarted lazily
        worker = worker_process_of(daemon)
        if worker is None:
            await asyncio.sleep(0.01)
    if worker is None:
        raise ChaosError(f"provider daemon {daemon} has no training subprocess to stop")
    _signal(worker, signal.SIGSTOP)
    run.stopped.add(worker)
    run.fault_at = time.time()
    run.notes.append(f"SIGSTOP training subprocess {worker} of {target[:10]} (daemon {daemon}) in round {fault_round}")
    await asyncio.sleep(0.5)
    stalled = fault_round + 1 if run.watch.result_of(target, fault_round) is not None else fault_round
    if stalled != fault_round:
        run.notes.append(f"its round-{fault_round} result was already out: it stalls in round {stalled}")
    try:
        await run.wait_round_done(stalled, run.config.training_timeout_s)
    finally:
        _signal(worker, signal.SIGCONT)
        run.stopped.discard(worker)
    run.notes.append(f"SIGCONT {worker} after round {stalled} ended "
                     f"({'it had been killed by its daemon' if not _alive(worker) else 'still running'})")


async def fault_mosquitto_restart(run: ScenarioRun) -> None:
    """Restart mosquitto (same port, config and persistence dir) once round 2 is running."""
    assert run.watch is not None
    from aitbc_agent_sdk.devnet._mosquitto import restart_mosquitto
    from aitbc_agent_sdk.devnet._service import stop, wait_for_port
    from aitbc_agent_sdk.profile import load_profile, save_profile

    await run.watch.wait(is_progress(round_=run.config.fault_round, status="running"), run.config.training_timeout_s)
    profile = load_profile(run.home)
    old = next((s for s in profile.services if s.name == "mosquitto"), None)
    if old is None:
        raise ChaosError("the devnet's broker is not mosquitto (install it: apt-get install mosquitto)")
    run.fault_at = time.time()
    started = time.monotonic()
    await asyncio.to_thread(stop, old)  # SIGTERM: mosquitto writes its persistence file on the way out
    new = restart_mosquitto(old)  # same accounts, ACL and TLS
    save_profile(run.home, profile.model_copy(
        update={"services": tuple(new if s.name == "mosquitto" else s for s in profile.services)}))
    await wait_for_port(new, 30.0)
    run.notes.append(f"mosquitto {old.pid} -> {new.pid} on port {old.port}: down for "
                     f"{time.monotonic() - started:.2f}s in round {run.config.fault_round}")


async def fault_coordinator_kill(run: ScenarioRun) -> None:
    """kill -9 the coordinator daemon once round 2 is running, let the round's results go unheard, resume."""
    assert run.watch is not None and run.tid is not None
    await run.watch.wait(is_progress(round_=run.config.fault_round, status="running"), run.config.training_timeout_s)
    pid = run.coordinator_pid()
    _signal(pid, signal.SIGKILL)
    run.fault_at = time.time()
    if not await _wait_dead(pid, 10.0):
        raise ChaosError(f"coordinator {pid} survived SIGKILL")
    done, phase = await run.training_round()
    run.notes.append(f"kill -9 coordinator {pid} in round {done + 1} ({phase})")
    await asyncio.sleep(2.0)  # the round's jobs finish while nobody listens
    resumed = await run.cli("distributed-training", "resume", "--training-id", run.tid)
    run.coordinator_pids.add(int(resumed["coordinator_pid"]))
    run.notes.append(f"resumed by coordinator {resumed['coordinator_pid']} "
                     f"{time.time() - run.fault_at:.1f}s after the kill")


FAULTS: dict[str, Fault] = {
    "kill-provider": fault_kill_provider,
    "straggler": fault_straggler,
    "mosquitto-restart": fault_mosquitto_restart,
    "coordinator-kill": fault_coordinator_kill,
}

EXPECTED_EVENT = {
    "clean": "payment",
    "kill-provider": "worker_replaced",
    "straggler": "speculative_job",
    "mosquitto-restart": "payment",
    "coordinator-kill": "training_resumed",
    "honest-noniid": "payment",
    **{f"byzantine-{b}": "result_rejected" for b in BEHAVIOURS},
    **{name: "hardware_flagged" for name in IMPOSTORS},
    **{name: "spot_check" for name in NOISY},
    **{name: "verifier_wrong" for name in VERIFIER_SLASHED},
    "colluding-verifier": "result_rejected",  # the partner's skipped work, found by an honest verifier
}


# -- checks ---------------------------------------------------------------------------------------

async def chain_view(run: ScenarioRun) -> dict[str, Any]:
    """The escrow's totals and this training's events, read from anvil."""
    from aitbc_agent_sdk.chain import EscrowClient, connect_rpc
    from aitbc_agent_sdk.profile import load_profile

    assert run.tid is not None
    profile = load_profile(run.home)
    w3 = await connect_rpc(profile.chain.rpc_url)
    try:
        escrow = EscrowClient(w3, profile.chain.escrow)
        # The on-chain id is derived from the coordinator's address: find it by the training's name.
        (key, _), *_ = await escrow.trainings_named(run.tid)
        state = await escrow.training(key)
        held = await escrow.held(key)
        events = await escrow.events(key)
    finally:
        with contextlib.suppress(Exception):
            await w3.provider.disconnect()
    released: dict[str, int] = {}
    for e in events:
        if e.name == "Released":
            released[e.args["worker"]] = released.get(e.args["worker"], 0) + int(e.args["amount"])
    return {"state": state, "released": released, "held": held.amount,
            "redeemed": sum(int(e.args["amount"]) for e in events if e.name == "Redeemed"),
            "fees": sum(int(e.args["amount"]) for e in events if e.name == "VerifierPaid"),
            "verification_funded": sum(int(e.args["amount"]) for e in events if e.name == "VerificationFunded"),
            "replaced": [(e.args["oldWorker"], e.args["newWorker"]) for e in events if e.name == "WorkerReplaced"],
            "refunded": sum(int(e.args["amount"]) for e in events if e.name in ("Refunded", "Reclaimed"))}


def reconnected_clients(run: ScenarioRun) -> set[str]:
    """MQTT client ids whose logs (provider daemons, the coordinator) report a reconnect."""
    import re

    from aitbc_agent_sdk.profile import training_dir

    pattern = re.compile(r"MQTT bus (\S+) reconnected")
    logs = sorted((run.home / "devnet" / "logs").glob("*.log"))
    if run.tid is not None:
        logs.append(training_dir(run.home, run.tid) / "coordinator.log")
    found: set[str] = set()
    for path in logs:
        with contextlib.suppress(OSError):
            found |= set(pattern.findall(path.read_text(errors="replace")))
    return found


def _by(events: Sequence[dict[str, Any]], name: str, **fields: Any) -> list[dict[str, Any]]:
    return [e for e in events if e["event"] == name
            and all(e["fields"].get(k) == v for k, v in fields.items())]


def judge(run: ScenarioRun, result: ScenarioResult, final: dict[str, Any], audit: dict[str, Any],
          payments: dict[str, Any], chain: dict[str, Any], reference: float | None) -> None:
    """Fill ``result`` from what the CLI, the audit log and the chain say; append every failed check."""
    c = run.config
    fail = result.failures.append
    result.phase = final.get("phase")
    result.complete = result.phase == "complete"
    if not result.complete:
        fail(f"training ended {result.phase!r}, not complete")
    metrics = final.get("round_metrics") or []
    if [m["round"] for m in metrics] != list(range(1, c.rounds + 1)):
        fail(f"round metrics for rounds {[m['round'] for m in metrics]}, expected 1..{c.rounds}")
    if metrics:
        result.accuracy = float(metrics[-1]["accuracy"])
    result.reference_accuracy = reference
    if result.accuracy is not None and reference is not None:
        result.delta = result.accuracy - reference
        if result.scenario in NON_IID:  # other shards, another model: clean's accuracy is no reference
            run.notes.append(f"accuracy {result.accuracy:.4f} on label-skewed shards ({result.delta:+.4f} from "
                             f"clean's IID run: expected, not checked)")
        elif abs(result.delta) > c.accuracy_tolerance:
            fail(f"final accuracy {result.accuracy:.4f} is {result.delta:+.4f} from clean's {reference:.4f} "
                 f"(tolerance {c.accuracy_tolerance})")
    elif reference is None and result.scenario != "clean":
        fail("no clean reference accuracy to compare with")

    # -- money, from the chain
    state, released = chain["state"], chain["released"]
    result.deposited_wei, result.paid_wei, result.refunded_wei = state.deposited, state.paid, state.refunded
    result.held_wei = chain["held"]
    conserved = (state.exists and state.closed and state.deposited == state.paid + state.refunded + chain["held"]
                 and sum(released.values()) + chain["redeemed"] + chain["fees"] == state.paid
                 and chain["refunded"] == state.refunded)
    result.conservation_ok = conserved
    if not conserved:
        fail(f"escrow not conserved: exists={state.exists} closed={state.closed} deposited={state.deposited} "
             f"paid={state.paid} refunded={state.refunded} held={chain['held']} "
             f"sum(Released)={sum(released.values())} sum(Redeemed)={chain['redeemed']} "
             f"sum(VerifierPaid)={chain['fees']} "
             f"sum(Refunded, Reclaimed)={chain['refunded']}")
    events = audit["entries"]
    funded = _by(events, "escrow_funded")
    # Slots added later (a spare funded for a speculative copy, an elastic pool growing) add to the deposit.
    added = [int(e["fields"].get("slot_wei", 0)) for e in (*_by(events, "spare_funded"), *_by(events, "worker_added"))]
    # Verification fees are funded as they fall due, each round's paid at once (VerificationFunded, VerifierPaid).
    fees = sum(int(e["fields"].get("amount_wei", 0)) for e in _by(events, "verifiers_paid"))
    if not funded or (int(funded[0]["fields"].get("deposit_wei", 0)) + sum(added) + chain["verification_funded"]
                      != state.deposited):
        fail(f"audit escrow_funded {[f['fields'].get('deposit_wei') for f in funded]} + added slots {added} "
             f"+ verification funded {chain['verification_funded']} != deposited {state.deposited}")
    if fees != chain["fees"] or chain["fees"] != chain["verification_funded"]:
        fail(f"verification fees: audit {fees}, paid on chain {chain['fees']}, funded {chain['verification_funded']}")
    if fees:
        run.notes.append(f"verification fees paid through the escrow: {fees} wei")
    listed: dict[str, int] = {}
    for p in payments["payments"]:
        listed[p["worker_id"]] = listed.get(p["worker_id"], 0) + int(p["amount_wei"])
    if listed != released:
        fail(f"payments --json {listed} differ from the chain's Released events {released}")
    if payments.get("escrow") and int(payments["escrow"].get("paid_wei")) != state.paid:
        fail(f"payments --json escrow paid {payments['escrow'].get('paid_wei')} != chain {state.paid}")

    workers = run.workers()
    if run.target is not None:
        result.faulty_worker = run.target
        result.faulty_paid_wei = released.get(run.target, 0) + listed.get(run.target, 0)
        if result.faulty_paid_wei:
            fail(f"faulty worker {run.target} was paid {result.faulty_paid_wei} wei")
        if not any(old == run.target for old, _ in chain["replaced"]):
            fail(f"no WorkerReplaced event on chain for faulty worker {run.target}")
        spares = {w["worker_id"] for w in run.hired if w["role"] == "spare"}
        for old, new in chain["replaced"]:
            if old == run.target and new in spares and not released.get(new):
                fail(f"replacement {new} took over the slot but was paid nothing")
        honest = [w for w in workers if w["worker_id"] != run.target]
        unpaid = [w["worker_id"] for w in honest if not released.get(w["worker_id"])]
        replaced_honest = [old for old, _ in chain["replaced"] if old != run.target]
        if replaced_honest:
            run.notes.append(f"honest workers also replaced: {replaced_honest}")
        if [w for w in unpaid if w not in replaced_honest]:
            fail(f"honest workers unpaid although not replaced: {unpaid}")
    else:
        short = {w["worker_id"]: (released.get(w["worker_id"], 0), int(w["price_wei"]) * c.rounds)
                 for w in workers if released.get(w["worker_id"], 0) != int(w["price_wei"]) * c.rounds}
        result.all_paid = not short
        if short:
            fail(f"hired workers not paid in full (paid, due): {short}")
        if chain["replaced"]:
            fail(f"workers replaced although nothing was faulty: {chain['replaced']}")
        if _by(events, "worker_failed") or _by(events, "result_rejected"):
            fail(f"worker_failed/result_rejected in a scenario without a faulty worker: "
                 f"{[(e['event'], e['fields']) for e in events if e['event'] in ('worker_failed', 'result_rejected')]}")

    # -- bonds: slashed only for what the evidence proves
    slashed = _by(events, "slashed")
    result.slashed = bool(slashed)
    if result.scenario in SLASHED and run.target is not None and not _by(events, "slashed", worker=run.target):
        fail(f"faulty worker {run.target} was not slashed, although its signed checkpoint proves the fault")
    if result.scenario in NOT_SLASHED and slashed:
        fail(f"slashed {[e['fields'].get('worker') for e in slashed]}, although nothing signed proves a fault")
    wrongly = [e["fields"].get("worker") for e in slashed if e["fields"].get("worker") not in (run.target, run.verifier)]
    if wrongly:
        fail(f"slashed {wrongly}, neither the faulty worker nor a lying verifier")
    if run.verifier is not None:
        judge_verifier(run, result, events, released)

    # -- the audit log
    result.audit_ok = bool(audit["ok"])
    if not audit["ok"]:
        fail(f"audit log does not verify: line {audit.get('first_bad_line')}: {audit.get('reason')}")
    counts: dict[str, int] = {}
    for e in events:
        counts[e["event"]] = counts.get(e["event"], 0) + 1
    result.events = counts
    expected = EXPECTED_EVENT[result.scenario]
    result.expected_event = expected
    if run.target is not None:
        seen = _by(events, expected, worker=run.target) if expected != "speculative_job" else \
            _by(events, expected, straggler=run.target)
    elif run.flagged is not None:
        seen = _by(events, expected, worker=run.flagged)
        run.notes.extend(f"{expected}: {e['fields'].get('reason')}" for e in seen[:1])
        if run.flagged in {w["worker_id"] for w in run.hired}:
            fail(f"the impostor {run.flagged} was hired although its hardware claim was flagged")
    elif run.verifier is not None:
        seen = _by(events, expected, worker=run.verifier)
    elif run.noisy is not None:  # its every result checked within the tolerance (not bit for bit), and passed
        seen = _by(events, expected, worker=run.noisy)
        if len(seen) != c.rounds or not all(e["fields"].get("passed") for e in seen):
            fail(f"the noisy worker's spot checks: {[e['fields'].get('reason') for e in seen]} "
                 f"({len(seen)} of {c.rounds} rounds)")
        if any(e["fields"].get("exact", True) for e in seen):
            fail("the noisy worker, which offered a GPU, was compared bit for bit")
        run.notes.extend(f"noisy worker's check: tolerance {e['fields'].get('tolerance')} "
                         f"({e['fields'].get('tolerance_source')})" for e in seen[:1])
    elif expected == "payment":
        seen = _by(events, "payment")
        seen = seen if {e["fields"]["worker"] for e in seen} >= {w["worker_id"] for w in workers} else []
    else:
        seen = _by(events, expected)
    result.event_seen = bool(seen)
    if not seen:
        fail(f"audit log has no {expected!r} event" + (f" for {run.target or run.flagged}"
                                                       if run.target or run.flagged else ""))
    if run.target is not None and not _by(events, "worker_replaced", worker=run.target):
        fail(f"audit log has no worker_replaced for {run.target}")
    if _by(events, "training_failed"):
        fail(f"training_failed in the audit log: {[e['fields'] for e in _by(events, 'training_failed')]}")
    if result.scenario == "coordinator-kill":
        total = {w["worker_id"]: sum(int(e["fields"]["amount_wei"]) for e in _by(events, "payment", worker=w["worker_id"]))
                 for w in workers}
        twice = {w: t for w, t in total.items() if t != released.get(w, 0)}
        if twice:
            fail(f"audit payments differ from the chain after the resume (paid twice?): {twice}")

    if result.scenario == "mosquitto-restart":  # the restart must have hit everyone: each client reconnected
        expected_clients = {f"coord-{run.tid}"} | {f"provider-{w['worker_id']}" for w in run.hired}
        missing = sorted(expected_clients - reconnected_clients(run))
        if missing:
            fail(f"no MQTT reconnect logged by {missing}: did the broker restart reach them?")
        else:
            run.notes.append(f"all {len(expected_clients)} clients (coordinator, workers, spare) reconnected")

    # -- detection
    if run.target is not None:
        failed = _by(events, "worker_failed", worker=run.target)
        if failed:
            result.silent_s = float(failed[0]["fields"]["silent_s"])
        first = [e for e in events if e["event"] in ("worker_failed", "straggler_detected", "result_rejected",
                                                     "job_failed")
                 and e["fields"].get("worker") == run.target]
        rejected = _by(events, "result_rejected", worker=run.target)
        announced = run.watch.result_at if run.watch is not None else {}
        if result.silent_s is not None:
            result.detection_s = result.silent_s
        elif first and run.fault_at is not None:
            result.detection_s = round(first[0]["ts"] - run.fault_at, 3)
        elif rejected and rejected[0]["fields"].get("job_id") in announced:  # result published -> rejected
            result.detection_s = round(rejected[0]["ts"] - announced[rejected[0]["fields"]["job_id"]], 3)
        how = ", ".join(sorted({e["event"] for e in first})) or "nothing"
        run.notes.append(f"the faulty worker showed up as: {how}")
        for e in _by(events, "result_rejected", worker=run.target):
            run.notes.append(f"rejected in round {e['fields'].get('round')}: {e['fields'].get('reason')}"
                             f" (slashable={e['fields'].get('slashable')})")
        if _by(events, "slashed", worker=run.target):
            run.notes.append("its bond was slashed")
        for e in _by(events, "worker_replaced", worker=run.target):
            run.notes.append(f"replaced by {e['fields'].get('replacement', '?')[:10]}: {e['fields'].get('reason')}")
    elif result.scenario == "coordinator-kill":
        resumed = _by(events, "training_resumed")
        if resumed and run.fault_at is not None:
            result.detection_s = round(resumed[0]["ts"] - run.fault_at, 3)  # kill -> the new coordinator's first act
            run.notes.append(f"training_resumed: {resumed[0]['fields']}")


def judge_verifier(run: ScenarioRun, result: ScenarioResult, events: Sequence[dict[str, Any]],
                   released: dict[str, int]) -> None:
    """A verifier row: the market re-executed the checks; the liar lost its bond exactly when the evidence
    (a dispute's one step, a canary) shows it lied; its own honest training is still paid."""
    fail = result.failures.append
    verifier = run.verifier
    checks = _by(events, "verification")
    outcomes = {o: len([e for e in checks if e["fields"].get("outcome") == o]) for o in ("agreed", "refereed")}
    canaries = _by(events, "canary", worker=verifier)
    failed_canaries = [e for e in canaries if not e["fields"].get("passed")]
    wrong = _by(events, "verifier_wrong", worker=verifier)
    slashed = bool(_by(events, "slashed", worker=verifier))
    disputes = _by(events, "dispute")
    run.notes.append(f"disputes: {len(disputes)}, settled at one step: "
                     f"{len([e for e in disputes if e['fields'].get('steps_trained_here') == 1])}; outcomes "
                     f"{sorted(e['fields'].get('outcome') for e in disputes)}")
    run.notes.append(f"verifications: {outcomes['agreed']} agreed, {outcomes['refereed']} refereed; the liar "
                     f"asked {len(_by(checks, 'verification', verifier=verifier))} times, {len(canaries)} canaries "
                     f"({len(failed_canaries)} failed), slashed={slashed}")
    if not outcomes["agreed"]:
        fail("no verifier on the market agreed with any segment: the checks never left the coordinator")
    if result.scenario in VERIFIER_SLASHED and not slashed:
        fail(f"the lying verifier {verifier} was not slashed")
    if result.scenario == "lazy-verifier" and not failed_canaries:
        fail("the lazy verifier was never caught by a canary")
    if result.scenario == "hostile-verifier" and not any("bisected" in e["fields"].get("reason", "") for e in wrong):
        fail(f"the hostile verifier was not shown wrong by a dispute's one step: {[e['fields'] for e in wrong]}")
    if result.scenario == "colluding-verifier" and slashed != bool(failed_canaries):
        fail(f"the colluder slashed={slashed} but failed {len(failed_canaries)} canaries: only a canary proves it")
    if not released.get(verifier):
        fail(f"the lying verifier {verifier} was paid nothing for its own (honest) training")
    if result.scenario in VERIFIER_SLASHED and _by(events, "worker_replaced"):
        fail(f"a worker was replaced although every worker trained honestly: "
             f"{[e['fields'] for e in _by(events, 'worker_replaced')]}")


# -- a scenario, start to end ---------------------------------------------------------------------

async def run_scenario(name: str, config: ChaosConfig = ChaosConfig(), *, reference: float | None = None,
                       root: Path | None = None) -> ScenarioResult:
    if name not in SCENARIOS:
        raise ValueError(f"unknown scenario {name!r}; choose from {', '.join(SCENARIOS)}")
    started = time.monotonic()
    result = ScenarioResult(scenario=name, expected_event=EXPECTED_EVENT[name])
    base = root or config.workdir or Path(tempfile.gettempdir())
    base.mkdir(parents=True, exist_ok=True)
    run = ScenarioRun(name, config, base)
    result.home = str(run.home)
    behaviour = name.removeprefix("byzantine-") if name.startswith("byzantine-") else None
    fault_task: asyncio.Task[None] | None = None
    try:
        from aitbc_agent_sdk.profile import load_profile

        total = config.workers + config.spares
        if name in IMPOSTORS:  # on top of a full honest pool: whoever is hired is honest
            await run.devnet_up(total)
            run.flagged = await run.add_byzantine(name, total + 1)
        elif name in NOISY:  # one place short of the workers: it is hired (flagged or not) and owed its pay
            await run.devnet_up(config.workers - 1)
            run.noisy = await run.add_byzantine(NOISY[name], config.workers)
        elif name == "colluding-verifier":  # a lazy worker and its accomplice, both priced to be hired as workers
            await run.devnet_up(total - 2)
            run.target = await run.add_byzantine(PARTNER_BEHAVIOUR, total - 1)
            run.verifier = await run.add_byzantine(name, total, wallet=COLLUDER_WALLET,
                                                   extra=("--partner", run.target))
        elif name in VERIFIER_ROWS:
            await run.devnet_up(total - 1)
            run.verifier = await run.add_byzantine(name, total)
        elif behaviour is None:
            await run.devnet_up(total)
        else:
            await run.devnet_up(total - 1)
            run.target = await run.add_byzantine(behaviour, total)
        await run.start_training()
        result.training_id = run.tid
        for byzantine in (run.target, run.verifier):  # a killed or stalled worker is chosen below
            role = {w["worker_id"]: w["role"] for w in run.hired}.get(byzantine)
            if byzantine is not None and role != "worker":
                raise ChaosError(f"the Byzantine provider {byzantine} was hired as {role!r}, not as a worker")
        if name in FAULTY_SCENARIOS:
            run.target = run.workers()[1]["worker_id"]  # the second cheapest: neither first nor last
        profile = load_profile(run.home)
        assert run.tid is not None
        async with BusWatch(profile.bus, run.tid) as watch:
            run.watch = watch
            if name in FAULTS:
                fault_task = asyncio.create_task(FAULTS[name](run))
            await run.distribute()
            final = await _follow(run, fault_task)
            if fault_task is not None:
                try:
                    await asyncio.wait_for(fault_task, 60)
                except TimeoutError:
                    result.failures.append("the fault was never injected (the training ended before it)")
        audit = await run.cli("distributed-training", "audit", "--training-id", run.tid)
        payments = await run.cli("distributed-training", "payments", "--training-id", run.tid)
        chain = await chain_view(run)
        judge(run, result, final, audit, payments, chain, reference)
    except Exception as exc:  # a step that could not run is a failed scenario, with its reason
        result.failures.append(f"{type(exc).__name__}: {exc}")
    finally:
        if fault_task is not None and not fault_task.done():
            fault_task.cancel()
            await asyncio.gather(fault_task, return_exceptions=True)
        if result.failures:
            result.diagnostics = run.diagnostics()
        leftovers = await run.teardown()
        if leftovers:
            result.failures.append(f"processes left after devnet down (killed): {leftovers}")
        result.notes.extend(run.notes)
        result.passed = not result.failures
        result.wall_s = round(time.monotonic() - started, 1)
        if result.passed or not config.keep_failed:
            shutil.rmtree(run.home.parent, ignore_errors=True)
            result.home = None
    return result


async def _follow(run: ScenarioRun, fault_task: asyncio.Task[None] | None) -> dict[str, Any]:
    """monitor --follow until the training ends; a fault that raises ends the scenario at once."""
    follow = asyncio.create_task(run.follow())
    if fault_task is None:
        return await follow
    done, _ = await asyncio.wait({follow, fault_task}, return_when=asyncio.FIRST_COMPLETED)
    if fault_task in done and fault_task.exception() is not None and not follow.done():
        follow.cancel()
        await asyncio.gather(follow, return_exceptions=True)
        raise fault_task.exception()  # type: ignore[misc]
    return await follow


async def run_scenarios(names: Sequence[str], config: ChaosConfig = ChaosConfig(), *,
                        on_result: Callable[[ScenarioResult], None] | None = None) -> list[ScenarioResult]:
    """Run ``names`` one after another; ``clean`` goes first (added if missing) for the reference accuracy."""
    order = list(dict.fromkeys(names))
    if "clean" in order:
        order.remove("clean")
    order.insert(0, "clean")
    results = []
    reference: float | None = None
    for name in order:
        result = await run_scenario(name, config, reference=reference)
        if name == "clean" and result.complete:
            reference = result.accuracy
        results.append(result)
        if on_result is not None:
            on_result(result)
    return results
