import asyncio

import pytest

from aitbc_agent_sdk.errors import MessagingError
from aitbc_agent_sdk.messaging import InMemoryBus, topic_matches


@pytest.mark.parametrize("filt,topic,ok", [
    ("a/+/c", "a/b/c", True), ("a/+/c", "a/b/d", False), ("a/#", "a", True), ("a/#", "a/b/c", True),
    ("a/b", "a/b/c", False), ("+", "a", True), ("+/+", "a", False),
])
def test_wildcards(filt, topic, ok):
    assert topic_matches(filt, topic) is ok


async def next_message(messages):
    return await asyncio.wait_for(anext(messages), 1)


async def test_publish_reaches_matching_subscribers_only():
    bus = InMemoryBus()
    async with bus.subscribe("jobs/+") as jobs, bus.subscribe("other") as other:
        await bus.publish("jobs/alice", b"1")
        message = await next_message(jobs)
        assert (message.topic, message.payload, message.retained) == ("jobs/alice", b"1", False)
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(other), 0.05)


async def test_retained_messages_reach_late_subscribers_and_can_be_cleared():
    bus = InMemoryBus()
    await bus.publish("offers/a", b"offer", retain=True)
    async with bus.subscribe("offers/+") as offers:
        message = await next_message(offers)
        assert message.retained and message.payload == b"offer"
    await bus.publish("offers/a", b"", retain=True)
    async with bus.subscribe("offers/+") as offers:
        with pytest.raises(TimeoutError):
            await asyncio.wait_for(anext(offers), 0.05)


async def test_close_raises_in_the_iterator_instead_of_hanging():
    bus = InMemoryBus()
    async with bus.subscribe("#") as messages:
        await bus.close()
        with pytest.raises(MessagingError, match="closed"):
            await next_message(messages)
    with pytest.raises(MessagingError):
        await bus.publish("a", b"x")


async def test_wildcard_publish_is_refused():
    with pytest.raises(MessagingError, match="wildcard"):
        await InMemoryBus().publish("a/+", b"x")
