"""Reading the retained offers ends at the first change since subscribing, on a real mosquitto.

A market of thousands refreshes some offer every few milliseconds, so a read that waited for a quiet
period never ended before its timeout (126 s at 10,000 providers). Here one provider refreshes its
offer without pause while the read runs: the read must return with every retained offer, long before
the refreshes stop."""

from __future__ import annotations

import asyncio

from eth_account import Account

from aitbc_agent_sdk.market import collect_offers
from aitbc_agent_sdk.messaging import SignedChannel, topics
from aitbc_agent_sdk.records import Hardware, Offer
from test_mqtt_bus import bus

HARDWARE = Hardware(cpu_model="test cpu", cpu_cores=1, ram_bytes=1 << 30)
RETAINED = 20
REFRESHES = 400  # one every 25 ms: about 10 s of a market that is never quiet for the read's 0.2 s


async def test_the_read_of_retained_offers_ends_at_the_first_live_refresh(mosquitto):
    async with bus(mosquitto, "providers") as providers_bus, bus(mosquitto, "reader") as reader_bus:
        providers = [SignedChannel(providers_bus, Account.create()) for _ in range(RETAINED)]
        for channel in providers:
            await channel.publish(topics.offer(channel.address), Offer(provider=channel.address, price_wei=10**15,
                                                                       hardware=HARDWARE), retain=True)
        reader = SignedChannel(reader_bus, Account.create())
        busy = providers[0]
        published = 0

        async def refresh() -> None:  # one provider's offer, changed again and again (its free slots)
            nonlocal published
            for n in range(REFRESHES):
                await busy.publish(topics.offer(busy.address), Offer(
                    provider=busy.address, price_wei=10**15, hardware=HARDWARE, free_slots=n % 2), retain=True)
                published += 1
                await asyncio.sleep(0.025)

        refreshing = asyncio.create_task(refresh())
        try:
            while published < 5:  # the live stream is flowing before the read subscribes
                await asyncio.sleep(0.01)
            offers = await collect_offers(reader, timeout=120.0)
            during = published
        finally:
            refreshing.cancel()
            await asyncio.gather(refreshing, return_exceptions=True)
    mine = {c.address for c in providers}
    assert mine <= {o.provider for o in offers}  # every retained offer was read (others' tests' may be there too)
    # It returned at the first refresh after its subscription, not when the stream went quiet (never before
    # the refreshes end): a read that waits for quiet sees all REFRESHES published first.
    assert during < REFRESHES / 2, f"the read returned after {during} of {REFRESHES} live refreshes"
