"""Attack: free work. Before the fix any key on the broker could hire a provider: ``_answer`` accepted
every proposal priced at the ask and the provider trained whatever job followed, with nothing
on chain behind it. Now the provider works only for a training that exists on chain, whose
coordinator is the proposal's sender and that funds its slot at its price for the contract's
rounds; it checks before the first job, refuses the job with a clear reason, and goes on serving.

The provider is the daemon's ProviderAgent on mosquitto, js-ipfs and anvil (tests/security/provider_rig.py).
"""

from __future__ import annotations

from aitbc_agent_sdk.chain._escrow import training_salt
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import ContractReply, new_id

from tests.security.provider_rig import PRICE, WAIT_S, Rig, provider_rig, servers  # noqa: F401 (servers: a fixture)


async def _agree(rig: Rig, training_id: str) -> tuple[str, ContractReply]:
    """A contract the provider accepts; nothing is opened on chain for it."""
    contract_id = new_id("contract")
    reply = await rig.attacker.request(
        topics.negotiate(rig.provider.address), rig.proposal(contract_id, training_id),
        topics.negotiate_reply(rig.attacker.address, contract_id), ContractReply,
        timeout=WAIT_S, expected_sender=rig.provider.address)
    assert reply.accepted, reply
    return contract_id, reply


async def _refused(rig: Rig, job_id: str) -> str:
    failed = await rig.feeds["progress"].first(
        lambda v: v.message.job_id == job_id and v.message.status == "failed")
    return failed.message.error


async def test_a_stranger_with_no_funded_slot_gets_no_work_and_the_provider_keeps_serving(servers):
    async with provider_rig(servers) as rig:
        # 1. No training on chain at all: a key on the broker and nothing else.
        unfunded, _ = await _agree(rig, "training_nothingonchain0")
        job = await rig.job(unfunded, training_id="training_nothingonchain0")
        await rig.send(topics.jobs(rig.provider.address), job)
        assert "does not exist on chain" in await _refused(rig, job.job_id)

        # 2. A training opened with the provider's consent, but its slot funded with 1 wei.
        cheap, reply = await _agree(rig, "training_onewei0000000000")
        await rig.escrow.open(rig.sender, training_salt("training_onewei0000000000"), [rig.provider.address], [1],
                              [bytes.fromhex(reply.consent[2:])])
        job_cheap = await rig.job(cheap, training_id="training_onewei0000000000")
        await rig.send(topics.jobs(rig.provider.address), job_cheap)
        assert f"less than {PRICE * 5} wei" in await _refused(rig, job_cheap.job_id)

        # No work was done for either: no result, and never "running".
        for refused in (job, job_cheap):
            assert not [v for v in rig.feeds["results"].items if v.message.job_id == refused.job_id]
            assert [v.message.status for v in rig.feeds["progress"].items
                    if v.message.job_id == refused.job_id] == ["failed"]
        assert rig.provider.completed_jobs == 0

        # 3. The provider still serves: a contract whose slot is funded at its price is worked.
        funded = await rig.hire()
        good = await rig.job(funded)
        await rig.send(topics.jobs(rig.provider.address), good)
        result = await rig.feeds["results"].first(lambda v: v.message.job_id == good.job_id)
        assert result.sender == rig.provider.address
        assert all(not task.done() for task in rig.provider._tasks)
