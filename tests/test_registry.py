"""ProviderRegistry through the SDK's RegistryClient, linked to its TrainingEscrow, on eth-tester and anvil."""

from __future__ import annotations

import pytest
from eth_account import Account
from eth_utils import keccak

from aitbc_agent_sdk.chain import (
    ContractArtifact,
    SlashEvidence,
    TransactionSender,
    deploy,
    result_digest,
    result_hash,
    sign_result,
)
from aitbc_agent_sdk.chain._registry import EvidenceDomain
from aitbc_agent_sdk.chain._deployment import deploy_contracts, verify_deployment
from aitbc_agent_sdk.errors import ChainError, ContractRevertError
from test_escrow import (  # noqa: F401  (chain, chain_url and env are fixtures)
    ETH,
    KEYS,
    TEST_ARTIFACTS,
    Env,
    _gas_cost,
    _new_sender,
    _open,
    advance_time,
    tkey,
    assert_conserved,
    chain,
    chain_url,
    deploy_attacker,
    env,
)

META = keccak(text="offer-v1")


async def _provider(env: Env, stake: int | None = ETH) -> TransactionSender:
    sender = await _new_sender(env.chain, 10 * ETH)
    if stake is not None:
        await env.registry.register(sender, stake, META)
    return sender


async def assert_bonds_conserved(env: Env, providers: list[str]) -> None:
    """Every bonded wei is still in the registry: its balance is the sum of the stakes and what was burned."""
    assert set(await env.registry.providers()) <= set(providers)
    stakes = [(await env.registry.provider(p)).stake for p in providers]
    assert await env.chain.balance(env.registry.address) == sum(stakes) + await env.registry.burned()


async def test_register_update_and_views(env: Env) -> None:
    assert await env.registry.escrow() == env.escrow.address
    p = await _provider(env, stake=None)
    for stake, meta, reason in [(10**14, META, "StakeTooLow"), (ETH, b"\0" * 32, "ZeroMetadata")]:
        with pytest.raises(ContractRevertError) as info:
            await env.registry.register(p, stake, meta)
        assert info.value.reason == reason
    with pytest.raises(ContractRevertError) as info:
        await env.registry.update(p, META)
    assert info.value.reason == "NotRegistered"

    await env.registry.register(p, ETH, META)
    with pytest.raises(ContractRevertError) as info:
        await env.registry.register(p, ETH, META)
    assert info.value.reason == "AlreadyRegistered"
    state = await env.registry.provider(p.address)
    assert (state.stake, state.metadata_hash, state.registered, state.unbonding_at) == (ETH, META, True, 0)
    assert (state.assigned, state.completed, state.failed, state.slashes) == (0, 0, 0, 0)

    new_meta = keccak(text="offer-v2")
    await env.registry.update(p, new_meta, add_stake=ETH // 2)
    state = await env.registry.provider(p.address)
    assert (state.stake, state.metadata_hash) == (ETH + ETH // 2, new_meta)
    assert await env.registry.providers() == [p.address]
    await assert_bonds_conserved(env, [p.address])


async def test_withdraw_needs_unbonding_delay_and_no_open_training(env: Env) -> None:
    p = await _provider(env)
    other = await _provider(env)
    tid = await _open(env, "assigned", [ETH, ETH], workers=[p.address, other.address])
    assert (await env.registry.provider(p.address)).assigned == 1

    with pytest.raises(ContractRevertError) as info:
        await env.registry.withdraw(p)
    assert info.value.reason == "NotUnbonding"
    await env.registry.begin_unbonding(p)
    with pytest.raises(ContractRevertError) as info:
        await env.registry.begin_unbonding(p)
    assert info.value.reason == "AlreadyUnbonding"
    with pytest.raises(ContractRevertError) as info:
        await env.registry.withdraw(p)
    assert info.value.reason == "UnbondingPending"

    delay = int(await env.registry._call("UNBONDING_DELAY"))
    await advance_time(env.chain, delay + 1)
    with pytest.raises(ContractRevertError) as info:
        await env.registry.withdraw(p)
    assert info.value.reason == "ProviderAssigned"

    await env.escrow.release(env.coordinator, tid, [p.address], [ETH], [result_hash("ok")])
    await env.escrow.refund(env.coordinator, tid)
    before = await env.chain.balance(p.address)
    receipt = await env.registry.withdraw(p)
    assert await env.chain.balance(p.address) == before + ETH - _gas_cost(receipt)
    state = await env.registry.provider(p.address)
    # The bond is gone, the reputation stays with the address.
    assert (state.stake, state.registered, state.assigned, state.completed, state.failed) == (0, False, 0, 1, 0)
    assert (await env.registry.provider(other.address)).failed == 1
    with pytest.raises(ContractRevertError) as info:
        await env.registry.withdraw(p)
    assert info.value.reason == "NotRegistered"
    await assert_bonds_conserved(env, [p.address, other.address])
    await assert_conserved(env)


async def test_only_the_escrow_moves_assignments(env: Env) -> None:
    p = await _provider(env)
    tid = tkey(p, "fake")
    for fn, args in [("assign", [tid, [p.address]]), ("unassign", [tid, [p.address], [1], True]),
                     ("release", [tid, p.address])]:
        with pytest.raises(ContractRevertError) as info:
            await p.send(env.registry.build(fn, *args), abi=env.registry.abi)
        assert info.value.reason == "NotEscrow"


async def test_slash_needs_the_coordinator_and_the_providers_signature(env: Env) -> None:
    provider_account = Account.create()
    KEYS[provider_account.address] = provider_account
    await env.chain.fund(provider_account.address, 10 * ETH)
    p = TransactionSender(env.chain.w3, provider_account)
    await env.registry.register(p, 2 * ETH, META)
    outsider_account = Account.create()
    await env.chain.fund(outsider_account.address, 10 * ETH)
    outsider = TransactionSender(env.chain.w3, outsider_account)
    await env.registry.register(outsider, ETH, META)
    tid = await _open(env, "slash", [ETH], workers=[p.address])
    cid = "bafy-bad-result"
    domain = await env.registry.domain()
    good = SlashEvidence(tid, p.address, cid, sign_result(provider_account, domain, tid, 3, cid), 3)
    digest = await env.registry._call("resultDigest", tid, 3, cid)
    assert digest == result_digest(domain, tid, 3, cid)
    other_chain = EvidenceDomain(domain.chain_id + 1, domain.registry)
    other_registry = EvidenceDomain(domain.chain_id, env.escrow.address)

    stranger = await _new_sender(env.chain, ETH)
    with pytest.raises(ContractRevertError) as info:
        await env.registry.slash(stranger, good)
    assert info.value.reason == "NotCoordinator"
    bad_cases = [
        SlashEvidence(tid, p.address, "bafy-other", good.signature, 3),  # signed another result
        SlashEvidence(tid, p.address, cid, sign_result(Account.create(), domain, tid, 3, cid), 3),  # another key
        SlashEvidence(tid, p.address, cid, sign_result(provider_account, domain, tkey(p, "x"), 3, cid), 3),
        SlashEvidence(tid, p.address, cid, good.signature, 2),  # another round
        SlashEvidence(tid, p.address, cid, sign_result(provider_account, other_chain, tid, 3, cid), 3),
        SlashEvidence(tid, p.address, cid, sign_result(provider_account, other_registry, tid, 3, cid), 3),
        SlashEvidence(tid, p.address, cid, good.signature[:64], 3),  # truncated
        SlashEvidence(tid, p.address, cid, b"\0" * 65, 3),  # garbage
    ]
    for evidence in bad_cases:
        with pytest.raises(ContractRevertError) as info:
            await env.registry.slash(env.coordinator, evidence)
        assert info.value.reason == "InvalidSignature", evidence
    # A provider that signed for this training id but holds no slot in it.
    outsider_sig = SlashEvidence(tid, outsider.address, cid, sign_result(outsider_account, domain, tid, 3, cid), 3)
    with pytest.raises(ContractRevertError) as info:
        await env.registry.slash(env.coordinator, outsider_sig)
    assert info.value.reason == "NotAWorker"

    before = await env.chain.balance(env.coordinator.address)
    receipt = await env.registry.slash(env.coordinator, good)
    # Half the bond is burned: a slash is worth nothing to whoever calls it.
    assert await env.chain.balance(env.coordinator.address) == before - _gas_cost(receipt)
    assert await env.registry.burned() == ETH
    state = await env.registry.provider(p.address)
    assert (state.stake, state.slashes) == (ETH, 1)
    assert await env.registry.was_slashed(tid, p.address)
    with pytest.raises(ContractRevertError) as info:
        await env.registry.slash(env.coordinator, good)
    assert info.value.reason == "AlreadySlashed"
    await assert_bonds_conserved(env, [p.address, outsider.address])
    await assert_conserved(env)


async def test_reentrant_provider_withdraws_its_bond_once(env: Env) -> None:
    attacker = await deploy_attacker(env)
    await attacker.exec(env.registry.address, env.registry.build("register", META)["data"], value=ETH,
                        abi=env.registry.abi)
    await attacker.exec(env.registry.address, env.registry.build("beginUnbonding")["data"], abi=env.registry.abi)
    await advance_time(env.chain, int(await env.registry._call("UNBONDING_DELAY")) + 1)
    withdraw = env.registry.build("withdraw")["data"]
    await attacker.arm(env.registry.address, withdraw)
    await attacker.exec(env.registry.address, withdraw, abi=env.registry.abi)
    assert (await attacker.view("attempts"), await attacker.view("successes")) == (1, 0)
    assert await env.chain.balance(attacker.address) == ETH
    await assert_bonds_conserved(env, [attacker.address])


async def test_deployment_records_and_verifies_the_registry(env: Env) -> None:
    deployment = await deploy_contracts(env.coordinator)
    assert deployment.registry is not None
    assert deployment.addresses() == {"escrow": deployment.escrow}
    await verify_deployment(env.chain.w3, deployment)
    receiver = ContractArtifact.from_file(TEST_ARTIFACTS / "RevertingReceiver.json")
    other = await deploy(env.coordinator, receiver)
    with pytest.raises(ChainError, match="not this SDK's ProviderRegistry"):
        await verify_deployment(env.chain.w3, deployment.model_copy(update={"registry": other}))
