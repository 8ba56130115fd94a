"""Messaging: the Bus port, its adapters, signed envelopes and the topic layout.

Names are imported on first use (PEP 562): eth-account costs the CLI's --help half a second."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import topics

__getattr__, __dir__, _names = lazy_exports(__name__, {
    "channel": ("SignedChannel",),
    "envelope": ("Envelope", "EnvelopeSigner", "EnvelopeVerifier", "Verified"),
    "memory": ("InMemoryBus",),
    "port": ("Bus", "BusMessage", "topic_matches"),
    "mqtt": ("MqttBus",),
    "settings": ("connect_bus",),
}, globals())
__all__ = [*_names, "topics"]

if TYPE_CHECKING:  # static tools see ordinary imports
    from .channel import SignedChannel
    from .envelope import Envelope, EnvelopeSigner, EnvelopeVerifier, Verified
    from .memory import InMemoryBus
    from .port import Bus, BusMessage, topic_matches
    from .mqtt import MqttBus
    from .settings import connect_bus
