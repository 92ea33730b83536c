"""Pub/sub hub: delivery, bounded queues that drop slow subscribers, thread-safe publishing."""
import asyncio
import json
import threading

import pytest
from node_harness import running_node

from node.metrics import Registry
from node.rpc.pubsub import Hub, SubscriptionClosed, UnknownTopic


def test_delivery_in_order_and_unknown_topic():
    async def scenario():
        hub = Hub()
        hub.add_topic("newHeads")
        sub = hub.subscribe("newHeads")
        assert [hub.publish("newHeads", i) for i in range(3)] == [1, 1, 1]
        assert [await sub.next() for _ in range(3)] == [0, 1, 2]
        with pytest.raises(UnknownTopic):
            hub.subscribe("nope")
        with pytest.raises(UnknownTopic):
            hub.publish("nope", 1)
        sub.close()
        with pytest.raises(SubscriptionClosed, match="unsubscribed"):
            await sub.next()
        assert hub.count() == 0

    asyncio.run(scenario())


def test_a_keyed_subscription_gets_only_its_keys_publications():
    async def scenario():
        hub = Hub()
        hub.add_topic("txs")
        mine, everything = hub.subscribe("txs", key="alice"), hub.subscribe("txs")
        assert not hub.has_subscribers("nope") and hub.has_subscribers("txs")
        assert [hub.publish("txs", n, key=k) for n, k in enumerate(["bob", "alice", None])] == [1, 2, 1]
        assert await mine.next() == 1 and mine.pending() == 0
        assert [await everything.next() for _ in range(3)] == [0, 1, 2]

    asyncio.run(scenario())


def test_slow_subscriber_is_dropped_not_buffered():
    async def scenario():
        registry = Registry()
        hub = Hub(queue_limit=3, metrics=registry)
        hub.add_topic("t")
        slow, fast = hub.subscribe("t"), hub.subscribe("t", limit=100)
        delivered = [hub.publish("t", i) for i in range(5)]
        assert delivered == [2, 2, 2, 1, 1]
        assert slow.pending() == 0 and "too slow" in slow.closed_reason
        with pytest.raises(SubscriptionClosed, match="too slow"):
            await slow.next()
        assert [await fast.next() for _ in range(5)] == [0, 1, 2, 3, 4]
        assert 'dekube_ws_subscribers_dropped_total{topic="t"} 1.0' in registry.render()
        assert hub.count() == 1

    asyncio.run(scenario())


def test_waiting_subscriber_wakes_on_publish_from_thread():
    async def scenario():
        hub = Hub()
        hub.add_topic("t")
        sub = hub.subscribe("t")
        threading.Thread(target=hub.publish_threadsafe, args=("t", "hello")).start()
        assert await asyncio.wait_for(sub.next(), 5) == "hello"
        hub.close()
        with pytest.raises(SubscriptionClosed, match="shutting down"):
            await sub.next()

    asyncio.run(scenario())


def test_websocket_gets_a_drop_notice_when_too_slow():
    async def scenario():
        async with running_node(ws_queue=2) as (node, http):
            node.hub.add_topic("newHeads")
            async with http.ws_connect("/ws") as ws:
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 1, "method": "dkb_subscribe",
                                              "params": ["newHeads"]}))
                sub_id = json.loads((await ws.receive(timeout=5)).data)["result"]
                for height in range(10):  # a burst: the pump cannot run between these calls
                    node.hub.publish("newHeads", {"height": height})
                notice = json.loads((await ws.receive(timeout=5)).data)
                assert notice["method"] == "dkb_subscriptionDropped"
                assert notice["params"]["subscription"] == sub_id and "too slow" in notice["params"]["reason"]
                await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": 2, "method": "dkb_peerId"}))
                assert json.loads((await ws.receive(timeout=5)).data)["result"] == node.peer_id  # connection lives

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_subscriptions_per_connection_are_limited():
    from node.rpc.server import MAX_SUBSCRIPTIONS_PER_CONNECTION

    async def scenario():
        async with running_node() as (node, http):
            node.hub.add_topic("newHeads")
            async with http.ws_connect("/ws") as ws:
                codes = []
                for i in range(MAX_SUBSCRIPTIONS_PER_CONNECTION + 1):
                    await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": i, "method": "dkb_subscribe",
                                                  "params": ["newHeads"]}))
                    answer = json.loads((await ws.receive(timeout=5)).data)
                    codes.append(answer.get("error", {}).get("code"))
                assert codes[:-1] == [None] * MAX_SUBSCRIPTIONS_PER_CONNECTION and codes[-1] == -32005
                assert node.hub.count() == MAX_SUBSCRIPTIONS_PER_CONNECTION

    asyncio.run(asyncio.wait_for(scenario(), 30))
