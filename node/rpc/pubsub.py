"""Publish/subscribe hub for websocket subscriptions (``newHeads``, task events, ...).

Components declare a topic once (``hub.add_topic("newHeads")``) and publish JSON-able payloads
from the event loop (``hub.publish``) or from any thread (``hub.publish_threadsafe``). A publication
may carry a ``key`` (the ``txs`` topic: the sender's peer ID); a subscription with a key gets only
the publications with that key, one without a key gets them all. Each subscription holds a bounded
queue; a subscriber that falls ``limit`` messages behind is dropped (its queue discarded, ``next()``
raises SubscriptionClosed with the reason), never buffered forever.
"""
from __future__ import annotations

import asyncio
import os
from collections import deque
from typing import Any

from node.metrics import Registry


class UnknownTopic(KeyError):
    """No component publishes on this topic."""


class SubscriptionClosed(Exception):
    """The subscription ended: unsubscribed, hub closed, or dropped for being too slow."""


class Subscription:
    """One subscriber's bounded queue on one topic."""

    def __init__(self, hub: Hub, topic: str, limit: int, key: str | None = None):
        self.id = "0x" + os.urandom(16).hex()
        self.topic = topic
        self.key = key
        self.limit = limit
        self.closed_reason: str | None = None
        self._hub = hub
        self._items: deque[Any] = deque()
        self._wakeup = asyncio.Event()

    def offer(self, payload: Any) -> bool:
        """Queue ``payload``; drops the subscription if its queue is full. True if queued."""
        if self.closed_reason is not None:
            return False
        if len(self._items) >= self.limit:
            self._hub.dropped_counter.inc(topic=self.topic)
            self.close(f"subscriber too slow: {self.limit} messages were queued")
            return False
        self._items.append(payload)
        self._wakeup.set()
        return True

    async def next(self) -> Any:
        """The next payload; raises SubscriptionClosed once the subscription has ended."""
        while True:
            if self._items:
                return self._items.popleft()
            if self.closed_reason is not None:
                raise SubscriptionClosed(self.closed_reason)
            self._wakeup.clear()
            await self._wakeup.wait()

    def pending(self) -> int:
        return len(self._items)

    def close(self, reason: str = "unsubscribed") -> None:
        if self.closed_reason is not None:
            return
        self.closed_reason = reason
        self._items.clear()
        self._wakeup.set()
        self._hub._forget(self)


class Hub:
    """Topics and their subscribers; one per node."""

    def __init__(self, queue_limit: int = 256, metrics: Registry | None = None):
        self.queue_limit = queue_limit
        self._topics: dict[str, set[Subscription]] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        registry = metrics or Registry()
        self.dropped_counter = registry.counter(
            "dekube_ws_subscribers_dropped_total", "Subscriptions dropped because the subscriber fell behind.",
            ["topic"])
        registry.gauge("dekube_ws_subscriptions", "Open websocket subscriptions.").set_function(self.count)

    def add_topic(self, topic: str) -> None:
        self._topics.setdefault(topic, set())

    def topics(self) -> list[str]:
        return sorted(self._topics)

    def count(self) -> int:
        return sum(len(subs) for subs in self._topics.values())

    def has_subscribers(self, topic: str) -> bool:
        return bool(self._topics.get(topic))

    def subscribe(self, topic: str, limit: int | None = None, key: str | None = None) -> Subscription:
        """Must be called on the event loop that will publish. ``key``: only publications with it."""
        if topic not in self._topics:
            raise UnknownTopic(topic)
        self._loop = asyncio.get_running_loop()
        sub = Subscription(self, topic, limit or self.queue_limit, key)
        self._topics[topic].add(sub)
        return sub

    def publish(self, topic: str, payload: Any, key: str | None = None) -> int:
        """Deliver to every subscriber of ``topic`` whose key is None or ``key`` (event-loop thread
        only); returns how many got it."""
        if topic not in self._topics:
            raise UnknownTopic(topic)
        return sum(sub.offer(payload) for sub in list(self._topics[topic]) if sub.key is None or sub.key == key)

    def publish_threadsafe(self, topic: str, payload: Any) -> None:
        """Publish from another thread; a no-op until someone has subscribed on a loop."""
        if topic not in self._topics:
            raise UnknownTopic(topic)
        if self._loop is not None and not self._loop.is_closed():
            self._loop.call_soon_threadsafe(self.publish, topic, payload)

    def close(self) -> None:
        for subs in list(self._topics.values()):
            for sub in list(subs):
                sub.close("node shutting down")

    def _forget(self, sub: Subscription) -> None:
        self._topics.get(sub.topic, set()).discard(sub)
