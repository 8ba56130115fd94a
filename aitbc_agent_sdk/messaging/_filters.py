"""Topic filters indexed for routing: an exact filter by lookup, only wildcard filters by a scan.

A coordinator holds one exact subscription per followed worker and a reply topic per request, so a
scan of every filter per message grew with the market (docs/scale.md, "Routing").
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Generic, TypeVar

from ._port import topic_matches

T = TypeVar("T")


def is_wildcard(topic_filter: str) -> bool:
    return "+" in topic_filter or "#" in topic_filter


class FilterIndex(Generic[T]):
    """Items (subscriptions) under their topic filters; ``match(topic)`` finds every item whose filter matches."""

    def __init__(self) -> None:
        self._exact: dict[str, list[T]] = {}
        self._wild: list[tuple[str, T]] = []

    def add(self, topic_filter: str, item: T) -> None:
        if is_wildcard(topic_filter):
            self._wild.append((topic_filter, item))
        else:
            self._exact.setdefault(topic_filter, []).append(item)

    def remove(self, topic_filter: str, item: T) -> None:
        """Remove that item (ValueError if it is not there, as ``list.remove``)."""
        if is_wildcard(topic_filter):
            self._wild.remove((topic_filter, item))
            return
        items = self._exact.get(topic_filter)
        if items is None:
            raise ValueError(f"{topic_filter!r} has no such item")
        items.remove(item)
        if not items:
            del self._exact[topic_filter]

    def match(self, topic: str) -> list[T]:
        return [*self._exact.get(topic, ()), *(item for f, item in self._wild if topic_matches(f, topic))]

    def __iter__(self) -> Iterator[T]:
        for items in self._exact.values():
            yield from items
        for _, item in self._wild:
            yield item

    def __len__(self) -> int:
        return sum(len(items) for items in self._exact.values()) + len(self._wild)


class RecentFilters:
    """The last ``limit`` filters of each kind (exact, wildcard), oldest forgotten first: a bus remembers the
    filters it left so that late arrivals are dropped, and one reply topic per request must not pile up."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._exact: OrderedDict[str, None] = OrderedDict()
        self._wild: OrderedDict[str, None] = OrderedDict()

    def add(self, topic_filter: str) -> None:
        kept = self._wild if is_wildcard(topic_filter) else self._exact
        kept[topic_filter] = None
        kept.move_to_end(topic_filter)
        while len(kept) > self.limit:
            kept.popitem(last=False)

    def discard(self, topic_filter: str) -> None:
        (self._wild if is_wildcard(topic_filter) else self._exact).pop(topic_filter, None)

    def matches(self, topic: str) -> bool:
        return topic in self._exact or any(topic_matches(f, topic) for f in self._wild)

    def __len__(self) -> int:
        return len(self._exact) + len(self._wild)
