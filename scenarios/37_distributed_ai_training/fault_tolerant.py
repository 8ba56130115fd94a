"""Scenario 37, Example 3: fault-tolerant training, made real.

The seed's loop watches worker health, stragglers and checkpoints and acts on them. Here the
acting happens inside the SDK's round loop (heartbeats and pings, speculative duplicates on a
spare, verification before aggregation or payment, replacement in the escrow slot); this
script keeps the seed's shape and watches it, printing what it sees. Each change from the
seed is marked ``# changed:``. It runs on the embedded stack, with one extra provider that
cheats (``--byzantine``) or one that stalls mid-training (``--stall``).

    python scenarios/37_distributed_ai_training/fault_tolerant.py --byzantine nan
    python scenarios/37_distributed_ai_training/fault_tolerant.py --devnet --target-throughput 400

With ``--devnet`` it runs against the servers and provider daemons of ``aitbc devnet up`` (the
coordinator pays from the devnet's ``dev`` wallet) and injects nothing itself; with
``--target-throughput`` the pool is elastic, as the seed's ``dynamic_scaling`` asks.
"""

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # changed: the cheats live in scripts/chaos

from aitbc_agent_sdk import Agent, AgentConfig, JobConfig, TrainingSpec  # noqa: E402
from aitbc_agent_sdk.devnet import wallet_store  # noqa: E402
from aitbc_agent_sdk.profile import devnet_password  # noqa: E402
from aitbc_agent_sdk.audit import read_log  # noqa: E402
from aitbc_agent_sdk.coordinator import is_terminal  # noqa: E402
from aitbc_agent_sdk.coordinator import audit_path  # noqa: E402
from aitbc_agent_sdk.records import ElasticPolicy, FaultPolicy  # noqa: E402
from aitbc_agent_sdk.provider import ProviderAgent  # noqa: E402
from aitbc_agent_sdk._stack import join_embedded_market  # noqa: E402
from scripts.chaos.byzantine import BEHAVIOURS  # noqa: E402

CHEAPEST_WEI = 9 * 10**15  # below every embedded provider's ask, so the cheat gets hired


class StallingProvider(ProviderAgent):
    """Heartbeats on, but its round-2 job never finishes: a straggler."""

    async def train_job(self, job, job_dir, on_epoch):
        if job.round == 2:
            await asyncio.sleep(3600)
        return await super().train_job(job, job_dir, on_epoch)


class FaultTolerantTraining:
    def __init__(self, config, args, account=None):
        self.agent = Agent(config, account=account)
        self.args = args  # changed: the fault to inject and the sizes come from the command line
        self.training_id = None
        self.flagged = set()

    async def start(self):
        await self.agent.start()
        try:
            return await self.run_fault_tolerant_training()
        finally:
            await self.agent.stop()  # changed: release the processes and the chain

    async def run_fault_tolerant_training(self):
        """Run fault-tolerant distributed training"""
        # changed: one training, with a spare (or an elastic pool), and a provider that misbehaves
        elastic = None
        if self.args.target_throughput:
            elastic = ElasticPolicy(target_samples_per_s=self.args.target_throughput, window_rounds=1,
                                    min_workers=self.args.min_workers, max_workers=self.args.max_workers)
        spec = TrainingSpec(model_type="mlp", target_workers=self.args.workers, rounds=self.args.rounds,
                            spare_workers=0 if elastic else 1, faults=FaultPolicy(heartbeat_timeout_s=3.0),
                            elastic=elastic, job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))
        extra = None
        if not self.args.devnet:  # on the devnet the misbehaving provider is one of its daemons
            factory = BEHAVIOURS[self.args.byzantine] if self.args.byzantine else StallingProvider
            extra = await join_embedded_market(self.agent.stack, self.agent.config.home, CHEAPEST_WEI,
                                               factory=factory)
            await extra.__aenter__()
        try:
            training = asyncio.create_task(self.agent.run_distributed_training(spec))
            while not training.done():
                await self.find_training()
                if self.training_id is not None:
                    # Monitor worker health
                    await self.monitor_worker_health()
                    # Handle stragglers
                    await self.handle_stragglers()
                    # Implement checkpoint recovery
                    await self.checkpoint_recovery()
                    # Dynamic worker scaling
                    await self.dynamic_scaling()
                await asyncio.wait([training], timeout=0.5)  # changed: every 0.5 s, not 60 s
            report = training.result()
            # changed: one last look once the training is over; a pool change in its last rounds
            # (a release after a fast round, say) lands after the loop's last pass
            self.training_id = report.training_id
            await self.dynamic_scaling()
        finally:
            if extra is not None:
                await extra.__aexit__(None, None, None)
        return report, extra.address if extra else None

    async def dynamic_scaling(self):
        """Dynamically scale worker count based on needs"""
        # changed: the round loop hires and releases between rounds (the seed's 0.7 / 1.3 rule);
        # here we report its decisions from the audit log as they happen
        log_path = audit_path(self.agent.config.home / "trainings", self.training_id)
        if not log_path.exists():
            return
        for event in read_log(log_path):
            if event.event == "worker_added":
                self.report(f"Added worker: {event.fields['worker']}")
            elif event.event == "worker_released":
                self.report(f"Removed worker: {event.fields['worker']}")

    async def find_training(self):  # changed: the run creates the training; look it up
        if self.training_id is None:
            found = [t for t in await self.agent.coordinator.db.trainings() if not is_terminal(t.phase)]
            self.training_id = found[-1].training_id if found else None

    async def monitor_worker_health(self):
        """Monitor health of all workers"""
        workers = await self.agent.get_all_workers(self.training_id)

        for worker in workers:
            if worker.role != "worker":  # changed: spares and replaced workers hold no job
                continue
            job = await self.agent.get_worker_job(self.training_id, worker.worker_id)
            # Check if worker is responsive
            if job is not None and not await self.agent.ping_worker(worker.worker_id, timeout=1.0):
                self.report(f"Worker {worker.worker_id} unresponsive")
                # changed: marking it failed and reassigning its job is the round loop's work

    async def handle_stragglers(self):
        """Handle slow workers (stragglers)"""
        workers = [w for w in await self.agent.get_all_workers(self.training_id) if w.role == "worker"]

        # Calculate average progress
        progress = []
        for worker in workers:
            job = await self.agent.get_worker_job(self.training_id, worker.worker_id)
            p = await self.agent.get_worker_progress(job.job_id) if job else None
            progress.append(p.progress if p else 0.0)
        if not progress:
            return

        avg_progress = sum(progress) / len(progress)

        # Identify stragglers (progress < avg - 20%)
        for worker, prog in zip(workers, progress):
            if prog < avg_progress - 20:
                self.report(f"Straggler detected: {worker.worker_id}")
                # changed: the round loop duplicates its job on the spare once it is confirmed

    async def checkpoint_recovery(self):
        """Implement checkpoint-based recovery"""
        # Get latest checkpoints from all workers
        checkpoints = await self.agent.get_all_checkpoints(self.training_id)

        # Verify checkpoint integrity
        for checkpoint in checkpoints:
            if not await self.agent.verify_checkpoint(checkpoint):
                self.report(f"Checkpoint corrupted: {checkpoint.checkpoint_id} from {checkpoint.worker_id}")
                # changed: the round loop already rejected it and had the shard retrained elsewhere

    def report(self, line):  # changed: each observation is printed once, not every pass
        if line not in self.flagged:
            self.flagged.add(line)
            print(line, flush=True)


async def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--byzantine", choices=sorted(BEHAVIOURS), help="the extra provider cheats this way")
    parser.add_argument("--stall", action="store_true", help="the extra provider stalls in round 2 (default)")
    parser.add_argument("--devnet", action="store_true", help="use the servers of 'aitbc devnet up' in --home")
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--target-throughput", type=float, default=None, help="samples/s: an elastic pool")
    parser.add_argument("--min-workers", type=int, default=1)
    parser.add_argument("--max-workers", type=int, default=8)
    parser.add_argument("--home", type=Path, default=None, help="state directory (default: a fresh temp dir)")
    args = parser.parse_args()
    home = args.home or Path(tempfile.mkdtemp(prefix="aitbc-ft-"))
    account = None
    if args.devnet:  # changed: a real devnet and its funded 'dev' wallet
        account = await wallet_store(home).unlock("dev", devnet_password(home))
        config = AgentConfig(name="fault-tolerant", home=home, network="devnet")
    else:  # changed: the embedded stack (in-process bus, local store, py-evm) instead of mainnet
        config = AgentConfig(name="fault-tolerant", home=home, providers=args.workers + 1)

    ft = FaultTolerantTraining(config, args, account)
    report, extra = await ft.start()
    events = [e for e in read_log(audit_path(home / "trainings", report.training_id))
              if e.event in ("worker_failed", "straggler_detected", "speculative_job", "result_rejected",
                             "slashed", "worker_replaced", "worker_added", "worker_released", "rebalanced")]
    for event in events:
        print(f"audit: {event.event} {json.dumps(event.fields, sort_keys=True)}")
    paid = {w.address: w.paid_wei for w in report.workers}
    print("SUMMARY " + json.dumps({"phase": report.status.value, "accuracy": report.final_accuracy,
                                   "training_id": report.training_id,
                                   "faulty": extra, "faulty_paid_wei": paid.get(extra, 0) if extra else None,
                                   "escrow": report.escrow.model_dump(mode="json"),
                                   "pool": [r.workers for r in report.rounds],
                                   "throughput": [r.throughput for r in report.rounds],
                                   "events": [e.event for e in events]}))


asyncio.run(main())
