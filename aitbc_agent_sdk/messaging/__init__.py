"""Messaging: the Bus port, its adapters, signed envelopes and the topic layout.

Names are imported on first use (PEP 562): eth-account costs the CLI's --help half a second."""

from typing import TYPE_CHECKING

from .._lazy import lazy_exports
from . import _topics as topics

__getattr__, __dir__, _names = lazy_exports(__name__, {
    "_channel": ("SignedChannel",),
    "_envelope": ("Envelope", "EnvelopeSigner", "EnvelopeVerifier", "Verified"),
    "_memory": ("InMemoryBus",),
    "_port": ("Bus", "BusMessage", "LastWill", "topic_matches"),
    "_mqtt": ("MqttBus",),
    "_settings": ("connect_bus",),
}, globals())
__all__ = [*_names, "topics"]

if TYPE_CHECKING:  # static tools see ordinary imports
    from ._channel import SignedChannel
    from ._envelope import Envelope, EnvelopeSigner, EnvelopeVerifier, Verified
    from ._memory import InMemoryBus
    from ._port import Bus, BusMessage, LastWill, topic_matches
    from ._mqtt import MqttBus
    from ._settings import connect_bus
