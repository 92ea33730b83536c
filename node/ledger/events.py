"""Ledger event streams for the gateway: one topic's notifications as an async iterator.

A stream yields event payloads, and ``RESYNC`` whenever events may have been missed (at the start,
after a websocket reconnect, after a local subscription was dropped for being slow): the consumer
then reads the state it cares about once. ``local_stream`` reads the node's own Hub (a node that
runs a validator); ``websocket_stream`` subscribes at a validator's ``/ws``, failing over across
the pool's URLs and reconnecting (after ``RECONNECT_S``) for as long as it is iterated.
"""
from __future__ import annotations

import asyncio
import itertools
import json
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

import aiohttp

from node.rpc.pubsub import Hub, SubscriptionClosed

from .jsonrpc import ValidatorPool, ws_url

log = logging.getLogger(__name__)

RECONNECT_S = 1.0
SUBSCRIBE_TIMEOUT_S = 10.0
HEARTBEAT_S = 15.0


class _Resync:
    def __repr__(self) -> str:
        return "RESYNC"


RESYNC: Any = _Resync()   # "you may have missed events: read the state once"

_ids = itertools.count(1)


class TopicRefused(Exception):
    """The validator does not publish the topic (an older validator, or a typo)."""


async def local_stream(hub: Hub, topic: str, key: str | None = None) -> AsyncIterator[Any]:
    while True:
        sub = hub.subscribe(topic, key=key)
        yield RESYNC
        try:
            while True:
                yield await sub.next()
        except SubscriptionClosed as closed:
            if sub.closed_reason == "node shutting down":
                return
            log.info("local %s subscription ended (%s); subscribing again", topic, closed)
        finally:
            sub.close()


async def websocket_stream(pool: ValidatorPool, topic: str, params: list) -> AsyncGenerator[Any, None]:
    while True:
        for index in pool.rotation():
            url = ws_url(pool.urls[index])
            try:
                async with pool.ws_session().ws_connect(url, heartbeat=HEARTBEAT_S, **_ws_timeout()) as ws:
                    await _subscribe(ws, topic, params)
                    yield RESYNC
                    async for msg in ws:
                        if msg.type != aiohttp.WSMsgType.TEXT:
                            break
                        note = json.loads(msg.data)
                        if note.get("method") == "dkb_subscription":
                            yield note["params"]["result"]
                        elif note.get("method") == "dkb_subscriptionDropped":
                            log.info("%s subscription at %s dropped: %s", topic, url, note["params"].get("reason"))
                            break
            except TopicRefused:
                raise
            except (TimeoutError, aiohttp.ClientError, OSError, ValueError, KeyError, TypeError) as exc:
                log.debug("%s subscription at %s failed: %s", topic, url, exc)
        await asyncio.sleep(RECONNECT_S)


def _ws_timeout() -> dict:
    """The websocket close timeout, in whichever form this aiohttp takes it (3.9: a float)."""
    if hasattr(aiohttp, "ClientWSTimeout"):
        return {"timeout": aiohttp.ClientWSTimeout(ws_close=SUBSCRIBE_TIMEOUT_S)}
    return {"timeout": SUBSCRIBE_TIMEOUT_S}


async def _subscribe(ws: aiohttp.ClientWebSocketResponse, topic: str, params: list) -> str:
    request_id = next(_ids)
    await ws.send_str(json.dumps({"jsonrpc": "2.0", "id": request_id, "method": "dkb_subscribe",
                                  "params": [topic, *params]}))
    while True:
        msg = await asyncio.wait_for(ws.receive(), SUBSCRIBE_TIMEOUT_S)
        if msg.type != aiohttp.WSMsgType.TEXT:
            raise ConnectionError(f"websocket closed while subscribing to {topic}")
        answer = json.loads(msg.data)
        if answer.get("id") != request_id:
            continue
        if "error" in answer:
            raise TopicRefused(f"{topic}: {answer['error'].get('message', answer['error'])}")
        return answer["result"]
