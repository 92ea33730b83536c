"""Operator-facing log lines: a bootstrap peer that is not up yet is retried quietly (info, with
why) and warned about only after repeated failures; the validator's committed-block line is
rate-limited."""
import asyncio
import logging
import socket

from node import runtime
from node.config import load_config
from node.identity import Identity
from node.roles import basic_role
from node.runtime import Node


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_bootstrap_not_up_yet_is_info_then_warning(monkeypatch, caplog):
    monkeypatch.setattr(runtime, "BOOTSTRAP_REDIAL_S", 0.05)
    other = Identity.generate().peer_id
    me = Identity.generate()
    addr = f"/ip4/127.0.0.1/tcp/{closed_port()}/p2p/{other}"
    config = load_config(None, overrides={("rpc", "enabled"): "false", ("p2p", "listen"): "/ip4/127.0.0.1/tcp/0",
                                          ("p2p", "bootstrap"): f"{addr},/ip4/127.0.0.1/tcp/1/p2p/{me.peer_id}"})

    async def scenario():
        node = Node(config, me, [basic_role("relay")])
        task = asyncio.create_task(node.run())
        await asyncio.wait_for(node.ready.wait(), 10)
        for _ in range(100):
            if any(r.levelno == logging.WARNING and r.getMessage() == "bootstrap dial failed" for r in caplog.records):
                break
            await asyncio.sleep(0.05)
        node.request_stop()
        await asyncio.wait_for(task, 10)

    with caplog.at_level(logging.INFO, logger="node.runtime"):
        asyncio.run(scenario())
    lines = [(r.levelno, r.getMessage(), getattr(r, "addr", None)) for r in caplog.records if r.name == "node.runtime"]
    dials = [line for line in lines if "bootstrap" in line[1]]
    assert dials[0] == (logging.INFO, "bootstrap peer not reachable yet; retrying", addr)
    assert dials[1][0] == logging.INFO
    assert (logging.WARNING, "bootstrap dial failed", addr) in dials
    assert all(a == addr for _, _, a in dials)   # the node's own address in the list is skipped


def test_committed_block_line_is_rate_limited(caplog):
    from consensus.validator.metrics import LOG_EVERY_S, ConsensusMetrics
    from node.metrics import Registry

    metrics = ConsensusMetrics(Registry(process=False), lambda: 0, lambda: 0)
    with caplog.at_level(logging.INFO, logger="consensus.validator"):
        for height in range(1, 31):
            metrics.on_commit(height, 0, 1, ["a"], ["a"], now=1000.0 + height * LOG_EVERY_S / 10)
    lines = [r for r in caplog.records if r.getMessage() == "committed block"]
    assert len(lines) == 3 and lines[0].height == 1 and lines[1].blocks_since_last_line == 10
