"""Inventory over the signed bus: each host's agent answers, the coordinator collects.

Topics (under the protocol prefix, see docs/protocol.md):

- ``aitbc/v1/cluster/{cluster}/inventory/{host_address}``: an :class:`InventoryRequest` to one host;
- ``aitbc/v1/cluster/{cluster}/inventory-reply/{requester}/{nonce}``: that host's :class:`HostInventory`.

Trust comes from the envelopes: a reply counts only if it is signed by the address the
cluster spec lists for that host (anyone else's reply on the topic is ignored), and a
responder answers only the coordinators its cluster spec allows (when it lists any).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import platform
import re
import uuid
from collections.abc import Callable, Iterable
from types import TracebackType
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field

from ..errors import MessagingError
from ..messaging._topics import PREFIX
from ._errors import ClusterConfigError
from ._inventory import ClusterInventory, HostInventory, read_local_inventory
from ._spec import NAME_PATTERN, ClusterSpec, HostSpec

if TYPE_CHECKING:  # eth-account: imported when a channel is made, not for the CLI's --help
    from ..messaging._channel import SignedChannel
    from ..messaging._envelope import Verified

log = logging.getLogger(__name__)

DEFAULT_TIMEOUT_S = 5.0


def inventory_topic(cluster: str, host_address: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/inventory/{host_address}"


def inventory_reply_topic(cluster: str, requester: str, nonce: str) -> str:
    return f"{PREFIX}/cluster/{cluster}/inventory-reply/{requester}/{nonce}"


class InventoryRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    cluster: str = Field(pattern=NAME_PATTERN)
    nonce: str = Field(pattern=r"^[A-Za-z0-9_-]{8,64}$")  # a topic level: no '/', '+' or '#'


InventoryReader = Callable[[], HostInventory]


class InventoryResponder:
    """``async with InventoryResponder(channel, "lab", name="gpu-1"):`` answers inventory requests.

    A host's agent daemon runs one per cluster it belongs to. Each request is answered with a
    fresh reading (NVML runs off the event loop). ``allowed_requesters`` limits who may ask;
    ``None`` answers any signed requester (the inventory holds no secrets).
    """

    def __init__(self, channel: SignedChannel, cluster: str, *, name: str,
                 allowed_requesters: Iterable[str] | None = None, reader: InventoryReader | None = None) -> None:
        self._channel = channel
        self._cluster = cluster
        self._name = name
        self._allowed = None if allowed_requesters is None else {a.lower() for a in allowed_requesters}
        self._reader = reader or (lambda: read_local_inventory(name, channel.address))
        self._task: asyncio.Task[None] | None = None
        self.answered = 0

    @classmethod
    def for_spec(cls, channel: SignedChannel, spec: ClusterSpec, **kwargs: object) -> InventoryResponder:
        """The responder of the host that ``channel`` signs for, as listed in ``spec``."""
        host = spec.host(channel.address)
        if host is None:
            raise ClusterConfigError(f"{channel.address} is not a host of cluster {spec.name!r}")
        allowed = spec.coordinators or None
        return cls(channel, spec.name, name=host.name, allowed_requesters=allowed, **kwargs)  # type: ignore[arg-type]

    async def __aenter__(self) -> InventoryResponder:
        ready = asyncio.Event()
        self._task = asyncio.create_task(self._serve(ready), name=f"inventory-responder-{self._name}")
        waiter = asyncio.create_task(ready.wait())
        # Return once subscribed, or raise if subscribing failed.
        await asyncio.wait({self._task, waiter}, return_when=asyncio.FIRST_COMPLETED)
        waiter.cancel()
        if self._task.done():
            self._task.result()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _serve(self, ready: asyncio.Event) -> None:
        async with self._channel.subscribe(inventory_topic(self._cluster, self._channel.address),
                                           InventoryRequest) as requests:
            ready.set()
            async for verified in requests:
                await self._answer(verified)

    async def _answer(self, verified: Verified[InventoryRequest]) -> None:
        request = verified.message
        if request.cluster != self._cluster:
            return
        if self._allowed is not None and verified.sender.lower() not in self._allowed:
            log.warning("inventory request from %s, who is not a coordinator of %s, ignored",
                        verified.sender, self._cluster)
            return
        inventory = await asyncio.to_thread(self._reader)
        inventory = inventory.model_copy(update={"name": self._name, "address": self._channel.address})
        with contextlib.suppress(MessagingError):  # the requester may be gone; nothing to do about it
            await self._channel.publish(inventory_reply_topic(self._cluster, verified.sender, request.nonce),
                                        inventory)
            self.answered += 1


async def ask_host(channel: SignedChannel, cluster: str, host: HostSpec, *, timeout: float) -> HostInventory:
    """One host's inventory, or an unreachable entry saying why (never an exception for silence)."""
    nonce = uuid.uuid4().hex
    try:
        # request() keeps only replies signed by host.address: impostors on the topic are skipped.
        reply = await channel.request(
            inventory_topic(cluster, host.address), InventoryRequest(cluster=cluster, nonce=nonce),
            inventory_reply_topic(cluster, channel.address, nonce), HostInventory,
            timeout=timeout, expected_sender=host.address)
    except MessagingError as exc:
        silent = isinstance(exc.__cause__, TimeoutError)
        return HostInventory.unreachable(host.name, host.address, f"no reply within {timeout:g}s" if silent else str(exc))
    # The spec, not the host, names the host.
    return reply.model_copy(update={"name": host.name, "address": host.address})


async def collect_inventory(channel: SignedChannel, cluster: ClusterSpec, *,
                            timeout: float = DEFAULT_TIMEOUT_S) -> ClusterInventory:
    """Ask every allow-listed host of ``cluster`` at once; silent hosts come back unreachable."""
    hosts = await asyncio.gather(*(ask_host(channel, cluster.name, h, timeout=timeout) for h in cluster.hosts))
    return ClusterInventory(cluster=cluster.name, hosts=tuple(hosts))


def local_host_name() -> str:
    """This machine's host name, reduced to the characters a cluster host name may hold."""
    name = re.sub(r"[^A-Za-z0-9_.-]", "-", platform.node()).lstrip(".-")[:64]
    return name or "local"


async def local_inventory(name: str | None = None, *, timeout: float = DEFAULT_TIMEOUT_S,
                          reader: InventoryReader | None = None) -> ClusterInventory:
    """This host alone, through the same request/answer path on an in-memory bus.

    Both ends use throw-away keys: the point is one code path, not trust between them.
    """
    from eth_account import Account

    from ..messaging._channel import SignedChannel
    from ..messaging._memory import InMemoryBus

    name = name or local_host_name()
    bus = InMemoryBus()
    host_channel = SignedChannel(bus, Account.create())
    requester = SignedChannel(bus, Account.create())
    spec = ClusterSpec(name=name, hosts=(HostSpec(name=name, address=host_channel.address),))
    try:
        async with InventoryResponder(host_channel, spec.name, name=name, reader=reader):
            return await collect_inventory(requester, spec, timeout=timeout)
    finally:
        await bus.close()
