"""Routing by topic filter at scale: an exact filter is found by lookup, and the filters a bus left are
remembered within a bound (before, every reply topic a coordinator ever used was kept and scanned for
each message that matched no subscription)."""

from __future__ import annotations

import pytest

from aitbc_agent_sdk.messaging import _mqtt
from aitbc_agent_sdk.messaging._filters import FilterIndex, RecentFilters
from aitbc_agent_sdk.messaging._port import topic_matches
from test_mqtt_bus import bus, next_message, uid


def test_the_index_finds_what_a_scan_of_every_filter_finds():
    filters = ["a/b/c", "a/b/c", "a/+/c", "a/#", "#", "a/b", "x/+/+", "a/b/c/d", "+/b/#"]
    index: FilterIndex[int] = FilterIndex()
    for i, f in enumerate(filters):
        index.add(f, i)
    for topic in ("a/b/c", "a/x/c", "a/b", "x/y/z", "a/b/c/d", "q", "a"):
        assert sorted(index.match(topic)) == [i for i, f in enumerate(filters) if topic_matches(f, topic)], topic
    index.remove("a/b/c", 0)
    index.remove("a/#", 3)
    assert sorted(index.match("a/b/c")) == [1, 2, 4, 8] and len(index) == len(filters) - 2
    assert sorted(index) == [1, 2, 4, 5, 6, 7, 8]
    with pytest.raises(ValueError):
        index.remove("a/b/c", 0)
    with pytest.raises(ValueError):
        index.remove("never/subscribed", 0)


def test_the_filters_a_bus_left_are_bounded_oldest_forgotten_first():
    left = RecentFilters(limit=3)
    for n in range(10):
        left.add(f"aitbc/v1/pong/me/nonce-{n}")
    left.add("aitbc/v1/offers/+")
    assert len(left) == 4  # three exact, one wildcard
    assert left.matches("aitbc/v1/pong/me/nonce-9") and not left.matches("aitbc/v1/pong/me/nonce-0")
    assert left.matches("aitbc/v1/offers/0xabc")
    left.add("aitbc/v1/pong/me/nonce-7")  # used again: the newest now
    left.add("aitbc/v1/pong/me/nonce-10")
    assert left.matches("aitbc/v1/pong/me/nonce-7") and not left.matches("aitbc/v1/pong/me/nonce-8")
    left.discard("aitbc/v1/offers/+")
    assert not left.matches("aitbc/v1/offers/0xabc")


async def test_a_bus_that_subscribed_to_many_reply_topics_remembers_a_bounded_few(mosquitto, monkeypatch):
    monkeypatch.setattr(_mqtt, "WITHDRAWN_FILTERS", 8)
    root = uid("t")
    async with bus(mosquitto, "coord") as coord, bus(mosquitto, "pub") as pub:
        for n in range(40):  # as a coordinator's requests do: one reply topic each, left after the reply
            async with coord.subscribe(f"{root}/reply/{n}") as replies:
                await pub.publish(f"{root}/reply/{n}", b"ok")
                assert (await next_message(replies)).payload == b"ok"
        assert len(coord._withdrawn) == 8  # noqa: SLF001
        async with coord.subscribe(f"{root}/reply/39") as again:  # a filter left can be taken again
            await pub.publish(f"{root}/reply/39", b"again")
            assert (await next_message(again)).payload == b"again"
        assert len(coord._subs) == 0  # noqa: SLF001
