"""Attacks on the escrow and the registry by a stranger with an ordinary funded account, on anvil.

Before the fix (issue #13, items 7-10): anyone could `open` a training naming any provider for
1 wei and slash half its bond with any result it had signed, again and again; lock its bond
with a deadline of 2**64-1; raise a sybil's `completed` count for 1 wei a training; squat a
pending training id; and the coordinator accepted signatures the registry rejects. Each test
first replays the attack as it was played then (the old ABI's calls), then tries the best the
attacker can do through today's API.

``AITBC_ATTACK_ARTIFACTS=DIR`` deploys DIR's TrainingEscrow.json instead of the shipped one:
pointed at the artifacts of the code before the fix, these tests fail at the replayed attack.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from eth_account import Account
from eth_account.messages import encode_defunct
from eth_account.signers.local import LocalAccount
from eth_utils import keccak

from aitbc_agent_sdk.chain import (
    ContractArtifact, EscrowClient, EvidenceDomain, RegistryClient, SlashEvidence, TransactionSender, deploy,
    load_artifact, result_hash, sign_consent, sign_result, training_key, training_salt,
)
from aitbc_agent_sdk.chain._deployment import fund_accounts
from aitbc_agent_sdk.chain._registry import HALF_ORDER, result_digest
from aitbc_agent_sdk.coordinator.checks._verification import result_signer
from aitbc_agent_sdk.errors import ChainError, ContractRevertError
from aitbc_agent_sdk.market import WeightedScore, rank_workers
from aitbc_agent_sdk.market._scoring import rate_worker, reputation_unit
from aitbc_agent_sdk.records import Hardware, Offer

ETH = 10**18
SECP256K1_N = 2 * HALF_ORDER + 1
HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)
META = keccak(text="offer")

# The functions as the contracts had them before the fix: what the attacker called then.
LEGACY_ABI: list[dict[str, Any]] = [
    {"type": "function", "name": "open", "stateMutability": "payable", "outputs": [], "inputs": [
        {"name": "trainingId", "type": "bytes32"}, {"name": "token", "type": "address"},
        {"name": "workers", "type": "address[]"}, {"name": "amounts", "type": "uint256[]"},
        {"name": "deadline", "type": "uint64"}]},
    {"type": "function", "name": "slash", "stateMutability": "nonpayable", "outputs": [], "inputs": [
        {"name": "trainingId", "type": "bytes32"}, {"name": "provider", "type": "address"},
        {"name": "cid", "type": "string"}, {"name": "signature", "type": "bytes"}]},
]


@dataclass
class Chain:
    w3: Any
    escrow: EscrowClient
    registry: RegistryClient
    funder: TransactionSender

    async def account(self, wei: int = 10 * ETH) -> tuple[LocalAccount, TransactionSender]:
        account: LocalAccount = Account.create()
        await fund_accounts(self.funder, [account.address], wei)
        return account, TransactionSender(self.w3, account)

    async def provider(self, stake: int = ETH) -> tuple[LocalAccount, TransactionSender]:
        account, sender = await self.account(stake + ETH)
        await self.registry.register(sender, stake, META)
        return account, sender

    async def consent(self, worker: LocalAccount, coordinator: str, training_id: str) -> bytes:
        return sign_consent(worker, await self.escrow.chain_id(), self.escrow.address,
                            training_key(coordinator, training_id))

    async def deadline(self, seconds: int = 3600) -> int:
        return int((await self.w3.eth.get_block("latest"))["timestamp"]) + seconds

    async def legacy(self, sender: TransactionSender, target: str, fn: str, *args: Any, value: int = 0) -> Any:
        data = self.w3.eth.contract(abi=LEGACY_ABI).encode_abi(fn, args=list(args))
        return await sender.send({"to": target, "data": data, "value": value},
                                 abi=[*self.escrow.abi, *self.registry.abi])


def _escrow_artifact() -> ContractArtifact:
    override = os.environ.get("AITBC_ATTACK_ARTIFACTS")
    if override:
        return ContractArtifact.from_file(Path(override) / "TrainingEscrow.json")
    return load_artifact("TrainingEscrow")


@pytest.fixture
async def chain(anvil_w3, anvil_dev_accounts) -> Chain:
    funder = TransactionSender(anvil_w3, anvil_dev_accounts[6])  # no other test module uses account 6
    address = await deploy(funder, _escrow_artifact())
    escrow = EscrowClient(anvil_w3, address)
    return Chain(anvil_w3, escrow, RegistryClient(anvil_w3, await escrow.registry()), funder)


def _old_digest(tid: bytes, cid: str) -> bytes:
    return keccak(bytes(tid) + keccak(text=cid))  # abi.encode(bytes32, bytes32) is the plain concatenation


async def test_a_stranger_cannot_name_a_provider_in_its_training_and_slash_it_for_1_wei(chain: Chain) -> None:
    victim, _ = await chain.provider(stake=ETH)
    attacker, attacker_tx = await chain.account()
    tid = keccak(text="attack-1")
    cid = "bafkreiattack"
    # The old attack: open for 1 wei naming the victim, then slash with a result it once signed.
    with pytest.raises(ChainError):
        await chain.legacy(attacker_tx, chain.escrow.address, "open", tid, "0x" + "00" * 20, [victim.address], [1],
                           await chain.deadline(), value=1)
    old_sig = victim.sign_message(encode_defunct(primitive=_old_digest(tid, cid))).signature
    with pytest.raises(ChainError):
        await chain.legacy(attacker_tx, chain.registry.address, "slash", tid, victim.address, cid, bytes(old_sig))

    # Today: no slot without the victim's own consent to this attacker's training.
    salt, name = training_salt("attack-1"), "attack-1"
    for consent, reason in ((b"", "NoConsent"),
                            (await chain.consent(attacker, attacker.address, name), "InvalidSignature"),
                            # the victim's real consent, given to an honest coordinator's training of that name
                            (await chain.consent(victim, Account.create().address, name), "InvalidSignature")):
        with pytest.raises(ContractRevertError) as info:
            await chain.escrow.open(attacker_tx, salt, [victim.address], [1], [consent])
        assert info.value.reason == reason
    key = training_key(attacker.address, name)
    assert not (await chain.escrow.training(key)).exists
    # Without a slot the victim is no worker of the attacker's training: nothing to slash.
    domain = await chain.registry.domain()
    with pytest.raises(ContractRevertError) as info:
        await chain.registry.slash(attacker_tx, SlashEvidence(key, victim.address, cid,
                                                              sign_result(victim, domain, key, 1, cid), 1))
    assert info.value.reason == "NotCoordinator"
    assert (await chain.registry.provider(victim.address)).stake == ETH


async def test_evidence_does_not_replay_across_rounds_chains_or_registries_and_a_slash_pays_nobody(
        chain: Chain) -> None:
    worker, _ = await chain.provider(stake=ETH)
    coordinator, coord_tx = await chain.account()
    name = "evidence"
    await chain.escrow.open(coord_tx, training_salt(name), [worker.address], [ETH // 10],
                            [await chain.consent(worker, coordinator.address, name)])
    key, cid = training_key(coordinator.address, name), "bafkreibadresult"
    domain = await chain.registry.domain()
    signed = sign_result(worker, domain, key, 1, cid)
    elsewhere = [
        SlashEvidence(key, worker.address, cid, signed, 2),  # round 1's evidence, claimed for round 2
        SlashEvidence(key, worker.address, cid, sign_result(worker, EvidenceDomain(domain.chain_id + 1,
                                                                                    domain.registry), key, 1, cid), 1),
        SlashEvidence(key, worker.address, cid, sign_result(worker, EvidenceDomain(domain.chain_id,
                                                                                    chain.escrow.address), key, 1, cid), 1),
    ]
    for evidence in elsewhere:
        with pytest.raises(ContractRevertError) as info:
            await chain.registry.slash(coord_tx, evidence)
        assert info.value.reason == "InvalidSignature"
    # The coordinator the worker consented to may slash once, and gains nothing by it.
    before = int(await chain.w3.eth.get_balance(coordinator.address))
    receipt = await chain.registry.slash(coord_tx, SlashEvidence(key, worker.address, cid, signed, 1))
    gas = int(receipt["gasUsed"]) * int(receipt["effectiveGasPrice"])
    assert int(await chain.w3.eth.get_balance(coordinator.address)) == before - gas
    with pytest.raises(ContractRevertError) as info:
        await chain.registry.slash(coord_tx, SlashEvidence(key, worker.address, cid, signed, 1))
    assert info.value.reason == "AlreadySlashed"
    assert (await chain.registry.provider(worker.address)).stake == ETH // 2


async def test_a_stranger_cannot_lock_a_bond_with_an_endless_deadline_or_fail_a_provider(chain: Chain) -> None:
    victim, victim_tx = await chain.provider(stake=ETH)
    attacker, attacker_tx = await chain.account()
    with pytest.raises(ChainError):  # the old attack: assign the victim until 2**64-1
        await chain.legacy(attacker_tx, chain.escrow.address, "open", keccak(text="lock"), "0x" + "00" * 20,
                           [victim.address], [1], 2**64 - 1, value=1)
    # Even with the victim's consent no deadline lies beyond MAX_DURATION.
    consent = await chain.consent(victim, attacker.address, "lock")
    with pytest.raises(ContractRevertError) as info:
        await chain.escrow.open(attacker_tx, training_salt("lock"), [victim.address], [1], [consent],
                                deadline=2**64 - 1)
    assert info.value.reason == "DeadlineTooFar"
    longest = int(await chain.escrow._call("MAX_DURATION"))
    assert longest == 30 * 24 * 3600
    state = await chain.registry.provider(victim.address)
    assert (state.assigned, state.failed) == (0, 0)  # nothing opened or refunded against it
    await chain.registry.begin_unbonding(victim_tx)  # and its bond stays its own to unbond


async def test_a_sybils_one_wei_trainings_do_not_raise_its_rank(chain: Chain) -> None:
    sybil, _ = await chain.provider(stake=ETH)
    honest, _ = await chain.provider(stake=ETH)
    attacker, attacker_tx = await chain.account()
    for i in range(3):  # pays its own sybil 1 wei per training
        name = f"sybil-{i}"
        await chain.escrow.open(attacker_tx, training_salt(name), [sybil.address], [1],
                                [await chain.consent(sybil, attacker.address, name)])
        key = training_key(attacker.address, name)
        await chain.escrow.release(attacker_tx, key, [sybil.address], [1], [result_hash("x")])
        await chain.escrow.refund(attacker_tx, key)
    sybil_state = await chain.registry.provider(sybil.address)
    assert (sybil_state.completed, sybil_state.earned) == (3, 3)
    price = 10**15
    offers = [Offer(provider=a.address, price_wei=price, hardware=HARDWARE) for a in (sybil, honest)]
    unit = reputation_unit([o.price_wei for o in offers])
    workers = []
    for offer in offers:
        s = await chain.registry.provider(offer.provider)
        workers.append(rate_worker(offer, completed=s.completed, failed=s.failed, slashes=s.slashes,
                                   stake_wei=s.stake, earned_wei=s.earned, unit_wei=unit))
    sybil_rated, honest_rated = workers
    # Three trainings of 1 wei are worth nothing next to a round's price: the sybil is as unknown as a newcomer.
    assert sybil_rated.reputation == pytest.approx(honest_rated.reputation, abs=1e-6)
    scores = WeightedScore().score(workers)
    assert scores[0] == pytest.approx(scores[1])
    ranked = rank_workers(workers, scores, 2)
    assert ranked[0].worker_id == min(honest.address, sybil.address)  # a tie goes by address, not by fake history


async def test_copying_a_pending_open_does_not_stop_the_honest_one(chain: Chain) -> None:
    worker, _ = await chain.provider(stake=ETH)
    coordinator, coord_tx = await chain.account()
    attacker, attacker_tx = await chain.account()
    sybil, _ = await chain.provider(stake=ETH)
    name = "front-run"
    with pytest.raises(ChainError):  # the old attack: open the honest id first
        await chain.legacy(attacker_tx, chain.escrow.address, "open", keccak(text=name), "0x" + "00" * 20,
                           [sybil.address], [1], await chain.deadline(), value=1)
    # Today the attacker copies the salt from the pending transaction: its training gets its own id.
    await chain.escrow.open(attacker_tx, training_salt(name), [sybil.address], [1],
                            [await chain.consent(sybil, attacker.address, name)])
    await chain.escrow.open(coord_tx, training_salt(name), [worker.address], [ETH // 10],
                            [await chain.consent(worker, coordinator.address, name)])
    honest = await chain.escrow.training(training_key(coordinator.address, name))
    copy = await chain.escrow.training(training_key(attacker.address, name))
    assert (honest.coordinator, honest.deposited) == (coordinator.address, ETH // 10)
    assert (copy.coordinator, copy.deposited) == (attacker.address, 1)


def _variants(signature: bytes) -> dict[str, bytes]:
    """The same signature in the forms the registry rejects: v in {0, 1}, and the high-s twin."""
    r, s, v = signature[:32], int.from_bytes(signature[32:64], "big"), signature[64]
    high_s = (SECP256K1_N - s).to_bytes(32, "big")
    return {"v-0/1": r + signature[32:64] + bytes([v - 27]), "high-s": r + high_s + bytes([55 - v])}


async def test_a_non_canonical_result_signature_is_rejected_on_receipt_as_on_chain(chain: Chain) -> None:
    worker, _ = await chain.provider(stake=ETH)
    coordinator, coord_tx = await chain.account()
    name = "canonical"
    await chain.escrow.open(coord_tx, training_salt(name), [worker.address], [ETH // 10],
                            [await chain.consent(worker, coordinator.address, name)])
    key, cid, domain = training_key(coordinator.address, name), "bafkreicanonical", await chain.registry.domain()
    signed = sign_result(worker, domain, key, 1, cid)
    assert result_signer(domain, key, 1, cid, "0x" + signed.hex()) == worker.address
    message = encode_defunct(primitive=result_digest(domain, key, 1, cid))
    for form, variant in _variants(signed).items():
        # eth-account's recover (what the coordinator used) takes both forms as the worker's signature ...
        assert Account.recover_message(message, signature=variant) == worker.address, form
        # ... but the registry would refuse the evidence, so the coordinator must not count it as signed.
        assert result_signer(domain, key, 1, cid, "0x" + variant.hex()) is None, form
        with pytest.raises(ContractRevertError) as info:
            await chain.registry.slash(coord_tx, SlashEvidence(key, worker.address, cid, variant, 1))
        assert info.value.reason == "InvalidSignature", form

