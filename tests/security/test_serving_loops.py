"""Attack: one malformed message. A ``contract_id`` with ``#`` made the provider's reply publish raise,
which ended its negotiation task for good (it kept advertising, but never answered again); ids with
``/`` routed its replies, progress and results onto topics outside the layout. Now such messages
are dropped and counted, and every serving loop goes on.
"""

from __future__ import annotations

import logging
from contextlib import AsyncExitStack

import pytest

from aitbc_agent_sdk.errors import AitbcError, UnsafeNameError
from aitbc_agent_sdk.messaging import topics
from aitbc_agent_sdk.records import ContractReply, new_id
from aitbc_agent_sdk.provider._node import ProviderAgent

from tests.security.provider_rig import provider_rig, servers  # noqa: F401 (servers: a fixture)

PREFIX = topics.PREFIX


def levels(topic: str) -> list[str]:
    return topic.split("/")


async def test_a_contract_id_with_a_wildcard_does_not_end_the_negotiation_loop(servers):
    async with provider_rig(servers) as rig:
        for bad in ("c#1", "c+1", "a/b", ""):
            await rig.send(topics.negotiate(rig.provider.address), rig.proposal(bad))
        # a following valid proposal is still answered
        contract = await rig.hire()
        replies = rig.feeds["replies"].items
        assert [v.message.contract_id for v in replies if v.sender == rig.provider.address] == [contract]
        assert all(len(levels(v.topic)) == 5 for v in replies)  # aitbc/v1/negotiate-reply/<coordinator>/<id>
        assert not rig.provider._tasks[0].done()  # the negotiation loop is alive


async def test_ids_with_a_slash_never_route_progress_or_results_onto_other_topics(servers):
    async with provider_rig(servers) as rig:
        contract = await rig.hire()
        jobs = topics.jobs(rig.provider.address)
        await rig.send(jobs, await rig.job(contract, job_id="job/../../results/training_victim"))
        await rig.send(jobs, await rig.job(contract, training_id="training_victim/extra"))
        valid = await rig.job(contract)
        await rig.send(jobs, valid)
        await rig.feeds["results"].first(lambda v: v.message.job_id == valid.job_id)
        await rig.feeds["progress"].first(lambda v: v.message.status == "complete")
        mine = [v for name in ("results", "progress") for v in rig.feeds[name].items
                if v.sender == rig.provider.address]
        assert {v.message.job_id for v in mine} == {valid.job_id}
        for v in mine:  # results/<training>, progress/<training>/<job>: nothing deeper
            expected = (topics.results(valid.training_id) if v.topic.startswith(f"{PREFIX}/results/")
                        else topics.progress(valid.training_id, valid.job_id))
            assert v.topic == expected


async def test_a_job_naming_another_training_than_its_contract_is_refused(servers):
    """The chain backs a contract's own training only: a job under that contract that names another
    training (whose topics and evidence it would then use) does no work."""
    async with provider_rig(servers) as rig:
        contract = await rig.hire()
        jobs = topics.jobs(rig.provider.address)
        stray = await rig.job(contract, training_id="training_00000000000other")
        await rig.send(jobs, stray)
        valid = await rig.job(contract)
        await rig.send(jobs, valid)  # handled after the stray one, on the same subscription
        await rig.feeds["results"].first(lambda v: v.message.job_id == valid.job_id)
        # It is refused, signed, with its reason (so a coordinator replaces the worker at once), and never run.
        refusal = await rig.feeds["progress"].first(lambda v: v.message.job_id == stray.job_id)
        assert refusal.message.status == "failed" and "names training" in refusal.message.error
        assert rig.provider.dropped["jobs: refused"] == 1
        assert stray.job_id not in {v.message.job_id for v in rig.feeds["results"].items}
        assert [v.message.status for v in rig.feeds["progress"].items if v.message.job_id == stray.job_id] == ["failed"]


class FlakyAnswers(ProviderAgent):
    """Fault injection (no real part fails this way on demand): handling one proposal raises."""

    async def _answer(self, verified):
        if verified.message.contract_id.startswith("boom"):
            raise AitbcError("injected failure while handling one proposal")
        if verified.message.contract_id.startswith("bug"):
            raise KeyError("an unexpected bug while handling one proposal")
        await super()._answer(verified)


async def test_a_failure_while_handling_one_message_is_logged_counted_and_the_loop_goes_on(servers, caplog):
    caplog.set_level(logging.WARNING)
    async with provider_rig(servers, agent_class=FlakyAnswers) as rig:
        await rig.send(topics.negotiate(rig.provider.address), rig.proposal(new_id("boom")))
        await rig.send(topics.negotiate(rig.provider.address), rig.proposal(new_id("bug")))
        await rig.hire()
        assert sum(rig.provider.dropped.values()) == 2
        assert any("dropped" in r.getMessage() for r in caplog.records)


@pytest.mark.parametrize("level", ["a/b", "a+", "#", "", "a\x00"])
def test_topics_refuse_a_level_that_would_reach_into_another_topic(level: str) -> None:
    for build in (lambda: topics.negotiate_reply("0xabc", level), lambda: topics.progress(level, "job_1"),
                  lambda: topics.progress("training_1", level), lambda: topics.results(level),
                  lambda: topics.pong("0xabc", level), lambda: topics.jobs(level)):
        with pytest.raises(UnsafeNameError):
            build()
    assert issubclass(UnsafeNameError, ValueError) and issubclass(UnsafeNameError, AitbcError)


async def test_a_stray_subscription_sees_only_layout_topics(servers):
    """Replies to a wildcard-bearing id are never published: the broker gets nothing to route."""
    async with provider_rig(servers) as rig, AsyncExitStack() as exits:
        everything = await rig.watch("all", f"{PREFIX}/negotiate-reply/{rig.attacker.address}/#", ContractReply,
                                     exits)
        await rig.send(topics.negotiate(rig.provider.address), rig.proposal("a/b/c"))
        contract = await rig.hire()
        assert [v.message.contract_id for v in everything.items] == [contract]
