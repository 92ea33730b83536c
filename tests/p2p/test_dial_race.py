"""Dial ranking (node/p2p/dial_race.py): staggered direct attempts, relayed ones held back while a
direct one may still work, the first success wins and the losers are cancelled or discarded; and
the Host dialing a NAT'd-looking peer (a blackholed address first) without a connect timeout."""
from __future__ import annotations

import asyncio
import socket
import time

import pytest

from node.identity import Identity
from node.p2p.dial_race import AllDialsFailed, DialAttempt, race
from node.p2p.host import Host


def run(coro, timeout=20):
    return asyncio.run(asyncio.wait_for(coro, timeout))


class Script:
    """Fake attempts: each address answers after a delay with a result or an error, and logs
    when it started, when it was cancelled and what was discarded."""

    def __init__(self):
        self.started: dict[str, float] = {}
        self.cancelled: list[str] = []
        self.discarded: list[str] = []
        self.t0 = None

    def attempt(self, label, delay, *, relayed=False, error=None, reach_after=None):
        async def go(reached):
            self.started[label] = asyncio.get_running_loop().time() - self.t0
            try:
                if reach_after is not None:
                    await asyncio.sleep(reach_after)
                    reached()
                    await asyncio.sleep(delay - reach_after)
                else:
                    await asyncio.sleep(delay)
            except asyncio.CancelledError:
                self.cancelled.append(label)
                raise
            if error is not None:
                raise error
            return label
        return DialAttempt(label, relayed, go)

    async def discard(self, result):
        self.discarded.append(result)

    async def race(self, attempts, **kw):
        self.t0 = asyncio.get_running_loop().time()
        return await race(attempts, self.discard, **kw)


def test_a_blackholed_direct_address_costs_one_stagger_not_a_timeout():
    s = Script()
    got = run(s.race([s.attempt("dead", 30), s.attempt("good", 0.05)], stagger_s=0.1, relay_delay_s=0.5))
    assert got == "good" and s.started["good"] == pytest.approx(0.1, abs=0.05)
    assert s.cancelled == ["dead"]


def test_a_failed_direct_address_hands_over_at_once():
    s = Script()
    got = run(s.race([s.attempt("refused", 0.01, error=ConnectionRefusedError("no")), s.attempt("good", 0.01)],
                     stagger_s=1.0))
    assert got == "good" and s.started["good"] < 0.2


def test_relayed_addresses_wait_for_the_relay_delay_when_no_direct_one_answers():
    s = Script()
    got = run(s.race([s.attempt("dead", 30), s.attempt("relay1", 0.05, relayed=True)], stagger_s=0.1,
                     relay_delay_s=0.3))
    assert got == "relay1" and s.started["relay1"] == pytest.approx(0.3, abs=0.08)
    assert s.cancelled == ["dead"]


def test_a_direct_attempt_that_reached_the_peer_holds_the_relays_back():
    s = Script()
    got = run(s.race([s.attempt("slow-handshake", 0.6, reach_after=0.05), s.attempt("relay1", 0.01, relayed=True)],
                     relay_delay_s=0.2))
    assert got == "slow-handshake" and "relay1" not in s.started


def test_relayed_addresses_go_one_at_a_time_after_direct_failures():
    s = Script()
    got = run(s.race([s.attempt("refused", 0.01, error=OSError("unreachable")),
                      s.attempt("relay1", 0.05, relayed=True, error=ConnectionError("relay down")),
                      s.attempt("relay2", 0.05, relayed=True)], relay_delay_s=5.0))
    assert got == "relay2"
    assert s.started["relay1"] < 0.1 and s.started["relay2"] >= s.started["relay1"] + 0.04


def test_all_failing_lists_every_error_in_address_order():
    s = Script()
    with pytest.raises(AllDialsFailed) as info:
        run(s.race([s.attempt("a", 0.05, error=OSError("x")), s.attempt("b", 0.01, error=TimeoutError()),
                    s.attempt("r", 0.01, relayed=True, error=ConnectionError("y"))], stagger_s=0.01))
    assert [e.split(":")[0] for e in info.value.errors] == ["a", "b", "r"]
    with pytest.raises(AllDialsFailed, match="no known address"):
        run(s.race([]))


def test_a_second_success_at_the_same_time_is_discarded():
    s = Script()
    got = run(s.race([s.attempt("a", 0.1), s.attempt("b", 0.0)], stagger_s=0.1))
    assert got in ("a", "b")
    assert s.discarded in ([], ["a" if got == "b" else "b"])
    assert set(s.cancelled + s.discarded + [got]) == {"a", "b"}


def test_an_unexpected_error_is_raised_not_swallowed():
    s = Script()
    with pytest.raises(ValueError):
        run(s.race([s.attempt("bug", 0.01, error=ValueError("bug")), s.attempt("dead", 30)], stagger_s=0.01))
    assert s.cancelled == ["dead"]


def test_host_reaches_a_peer_past_an_address_that_never_answers():
    """The first address is a listening socket whose backlog is full (SYNs are dropped, like a
    NAT'd peer's private address); the peer is dialed through its second address in well under
    the 3 s connect timeout."""
    async def main():
        blackhole = socket.socket()
        blackhole.bind(("127.0.0.1", 0))
        blackhole.listen(0)
        fillers = []
        for _ in range(8):  # fill the accept queue so further SYNs go unanswered
            filler = socket.socket()
            filler.setblocking(False)
            try:
                filler.connect(blackhole.getsockname())
            except BlockingIOError:
                pass
            fillers.append(filler)
        a = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
        b = Host(Identity.generate(), ["/ip4/127.0.0.1/tcp/0"])
        await a.start()
        await b.start()
        try:
            dead = f"/ip4/127.0.0.1/tcp/{blackhole.getsockname()[1]}"
            a.peerbook.add_addrs(b.peer_id, [dead, b.listen_addrs[0].split("/p2p/")[0]])
            started = time.monotonic()
            rtt = await a.ping(b.peer_id)
            return time.monotonic() - started, rtt
        finally:
            await a.stop()
            await b.stop()
            for sock in fillers + [blackhole]:
                sock.close()

    seconds, rtt = run(main())
    assert rtt > 0 and seconds < 2.5
