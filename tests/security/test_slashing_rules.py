"""Attack on honest workers (issue #13, item 11): before the fix a validation-loss or update-norm
rejection was marked slashable, so an honest worker whose non-IID data or uneven shard made it
look bad lost half its bond. Now only what the signed checkpoint proves by itself (wrong names or
shapes, non-finite values) is slashable; anything else costs the worker the round's pay and a
failed job on its record, never its bond.

Played through the real coordinator against anvil: two workers whose results fail the loss and
the norm checks (the chaos suite's Random and Scaled providers stand in for an honest worker
whose data looks that bad) are rejected and replaced, and neither bond moves.
"""

from __future__ import annotations

from contextlib import AsyncExitStack

from eth_account import Account

from aitbc_agent_sdk.chain import EscrowClient, RegistryClient, TransactionSender, training_key
from aitbc_agent_sdk.chain._deployment import deploy_contracts, fund_accounts
from aitbc_agent_sdk.audit import read_log
from aitbc_agent_sdk.coordinator import Coordinator, CoordinatorSettings, EscrowAccount, TrainingDatabase
from aitbc_agent_sdk.coordinator.round._run import RunRequest, run_training
from aitbc_agent_sdk.coordinator._service import audit_path
from aitbc_agent_sdk.market import WeightedScore
from aitbc_agent_sdk.messaging import InMemoryBus, SignedChannel
from aitbc_agent_sdk.records import FaultPolicy, Hardware, JobConfig, TrainingPhase, TrainingSpec
from aitbc_agent_sdk.provider._node import ProviderAgent, ProviderConfig
from aitbc_agent_sdk.provider._onchain import ProviderChain
from aitbc_agent_sdk._stack import register_provider
from aitbc_agent_sdk.storage import LocalContentStore
from scripts.chaos.byzantine import RandomProvider, ScaledProvider

ETH = 10**18
STAKE = ETH // 10
HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)


async def test_loss_and_norm_rejections_cost_pay_and_reputation_never_the_bond(tmp_path, anvil_w3,
                                                                             anvil_dev_accounts):
    funder = TransactionSender(anvil_w3, anvil_dev_accounts[7])  # no other test module uses account 7
    deployment = await deploy_contracts(funder)
    escrow = EscrowClient(anvil_w3, deployment.escrow)
    registry = RegistryClient(anvil_w3, await escrow.registry())
    chain = await ProviderChain.connect(anvil_w3, deployment.escrow)
    coordinator_key = Account.create()
    # Cheapest first, so the scorer hires the two whose results fail; the honest ones are worker and spares.
    kinds = [(RandomProvider, 10**15), (ScaledProvider, 10**15), (ProviderAgent, 2 * 10**15),
             (ProviderAgent, 2 * 10**15), (ProviderAgent, 2 * 10**15)]
    keys = [Account.create() for _ in kinds]
    await fund_accounts(funder, [coordinator_key.address, *(k.address for k in keys)], ETH)
    bus = InMemoryBus()
    store = LocalContentStore(tmp_path / "store")
    async with AsyncExitStack() as exits:
        exits.push_async_callback(bus.close)
        providers = []
        for (kind, price), key in zip(kinds, keys):
            provider = kind(key, bus, store, ProviderConfig(price_wei=price, work_dir=tmp_path / key.address),
                            hardware=HARDWARE, chain=chain)
            await register_provider(registry, TransactionSender(anvil_w3, key), provider, STAKE)
            providers.append(await exits.enter_async_context(provider))
        db = await exits.enter_async_context(TrainingDatabase(tmp_path / "db.sqlite"))
        sender = TransactionSender(anvil_w3, coordinator_key)
        coordinator = Coordinator(channel=SignedChannel(bus, coordinator_key), store=store, db=db,
                                  escrow=EscrowAccount(sender, escrow), scoring=WeightedScore(),
                                  settings=CoordinatorSettings(audit_dir=tmp_path / "trainings"), registry=registry)
        exits.push_async_callback(coordinator.close)
        spec = TrainingSpec(model_type="mlp", target_workers=3, rounds=1, spare_workers=2, seed=3,
                            faults=FaultPolicy(heartbeat_timeout_s=5.0, ping_timeout_s=2.0),
                            job=JobConfig(batch_size=32, learning_rate=1e-2, epochs=1))
        report = await run_training(coordinator, RunRequest(spec=spec, dataset="digits", round_timeout_s=300))

    assert report.status == TrainingPhase.COMPLETE
    cheats = {providers[0].address, providers[1].address}
    log = [(e.event, e.fields) for e in read_log(audit_path(tmp_path / "trainings", report.training_id))]
    rejected = {f["worker"]: f for event, f in log if event == "result_rejected"}
    assert set(rejected) == cheats, rejected
    assert all(not f["slashable"] for f in rejected.values())
    assert all("validation loss" in f["reason"] or "update norm" in f["reason"] for f in rejected.values())
    assert not [f for event, f in log if event in ("slashed", "slash_failed")]
    for cheat in cheats:
        state = await registry.provider(cheat)
        # The bond is untouched; the pay for the round is gone and the failure is on its record.
        assert (state.stake, state.slashes, state.failed, state.earned) == (STAKE, 0, 1, 0)
        assert not await registry.was_slashed(training_key(coordinator_key.address, report.training_id), cheat)
    assert await registry.burned() == 0
    by_address = {w.address: w for w in report.workers}
    assert all(by_address[c].role == "replaced" and by_address[c].paid_wei == 0 for c in cheats)
