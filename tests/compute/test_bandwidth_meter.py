"""node.bandwidth: the meter's figures, when a figure is worth a new record, probe admission and
framing, and a probe between two real Hosts."""
import asyncio
import time
import types

import pytest

from node import bandwidth
from node.bandwidth import (
    BandwidthMeter,
    ProbeAdmission,
    ProbeError,
    decode_request,
    encode_request,
    make_probe_handler,
    measure_latency,
    probe,
    worth_publishing,
)
from node.identity import Identity
from node.p2p.host import Host

MIB = 1 << 20


def test_meter_figures_from_transfers():
    meter = BandwidthMeter(clock=lambda: 42.0)
    assert meter.link_mbps() is None and meter.figures()["upload_mbps"] is None
    assert not meter.record_transfer("down", 1000, 0.001)          # too small to say anything
    assert meter.record_transfer("down", 10 * MIB, 1.0)             # 83.9 Mbit/s
    assert meter.rate("down") == pytest.approx(83.886, rel=1e-3)
    for seconds in (8.0, 4.0, 2.0, 1.0):                             # 10.5, 21, 42, 84 Mbit/s
        meter.record_transfer("up", 10 * MIB, seconds)
    assert meter.rate("up") == pytest.approx(83.886, rel=1e-3)      # 75th percentile of 4 samples
    assert meter.link_mbps() == 84
    meter.record_rate("up", 5.0)
    meter.record_rate("up", 0.0)                                     # ignored
    assert meter.figures()["samples"] == {"up": 5, "down": 1}
    meter.record_latency("a", 0.020)
    meter.record_latency("b", 0.010)
    meter.record_latency("c", 0.030)
    figures = meter.figures()
    assert figures["median_latency_ms"] == pytest.approx(20.0) and figures["updated_at"] == 42.0
    with pytest.raises(ValueError):
        meter.record_transfer("sideways", MIB, 1.0)


def test_meter_window_and_peer_table_are_bounded():
    meter = BandwidthMeter()
    for i in range(100):
        meter.record_rate("up", 1000.0 if i < 50 else 10.0)
        meter.record_latency(f"peer{i}", 0.001 * i)
    assert meter.rate("up") == 10.0                     # old samples left the window
    assert len(meter.figures()["latency_ms"]) == bandwidth.MAX_PEERS
    assert "peer99" in meter.figures()["latency_ms"] and "peer0" not in meter.figures()["latency_ms"]


def test_link_figure_is_the_slower_direction_at_least_one():
    meter = BandwidthMeter()
    meter.record_rate("up", 0.2)
    assert meter.link_mbps() == 1
    meter.record_rate("down", 100.0)
    meter.record_rate("up", 30.0)
    meter.record_rate("up", 30.0)
    assert meter.link_mbps() == 30


@pytest.mark.parametrize("published, measured, expected", [
    (None, None, False), (None, 50, True), (0, 50, True), (100, 120, False), (100, 70, False),
    (100, 151, True), (100, 66, True)])
def test_worth_publishing(published, measured, expected):
    assert worth_publishing(published, measured) is expected


def test_probe_requests_are_bounded():
    assert decode_request(encode_request(bandwidth.PROBE_BYTES)) == bandwidth.PROBE_BYTES
    for size in (bandwidth.MAX_PROBE_BYTES + 1, 10):
        with pytest.raises(ProbeError):
            encode_request(size)
    for data in (b"", b"\x00\x00\x00", b"\x00\x00\x00\x10\x00", b"\xff\xff\xff\xff"):
        with pytest.raises(ProbeError):
            decode_request(data)


def test_probe_admission_one_at_a_time_and_cooldown():
    now = [0.0]
    admission = ProbeAdmission(cooldown_s=30.0, clock=lambda: now[0])
    assert admission.admit("a")
    assert not admission.admit("b")        # busy
    admission.done()
    assert not admission.admit("a")        # too soon
    assert admission.admit("b")
    admission.done()
    now[0] = 31.0
    assert admission.admit("a")


def test_probe_and_latency_between_hosts():
    async def scenario():
        server, client = Host(Identity.generate()), Host(Identity.generate())
        served, asker = BandwidthMeter(), BandwidthMeter()
        server.set_handler(bandwidth.PROTOCOL, make_probe_handler(served, ProbeAdmission()))
        await server.start()
        await client.start()
        try:
            client.peerbook.add_addrs(server.peer_id, server.listen_addrs)
            rates = await probe(client, server.peer_id, asker, size=MIB)
            with pytest.raises(ProbeError, match="refused"):   # the same asker, within the cooldown
                await probe(client, server.peer_id, asker, size=MIB)
            rtt = await measure_latency(client, server.peer_id, asker)
            # a junk request: the server resets that stream and keeps serving
            stream = await client.open_stream(server.peer_id, bandwidth.PROTOCOL)
            await stream.write(b"\xff\xff\xff\xff")
            with pytest.raises(ConnectionResetError):
                await stream.read(10)
            assert await measure_latency(client, server.peer_id, asker) is not None
            return rates, rtt, served, asker
        finally:
            await client.stop()
            await server.stop()

    rates, rtt, served, asker = asyncio.run(scenario())
    assert rates["upload_mbps"] > 1 and rates["download_mbps"] > 1
    assert asker.rate("up") == pytest.approx(rates["upload_mbps"])
    assert asker.rate("down") == pytest.approx(rates["download_mbps"])
    assert served.rate("down") is not None      # the server measured the upload it received
    assert rtt is not None and 0 < rtt < 5 and asker.figures()["median_latency_ms"] > 0


def test_service_probes_connected_peers_once_asked(monkeypatch):
    monkeypatch.setattr(bandwidth, "FIRST_PROBE_S", 0.0)
    monkeypatch.setattr(bandwidth, "RETRY_PROBE_S", 0.05)

    class FakeNode:
        def __init__(self, host):
            self.host, self.sections = host, {}
            self.status = self
            self.dashboard = types.SimpleNamespace(sections={})

        def add_section(self, name, fn):
            self.sections[name] = fn

    async def scenario():
        a, b = Host(Identity.generate()), Host(Identity.generate())
        await a.start()
        await b.start()
        try:
            node_a = FakeNode(a)
            service_a = bandwidth.BandwidthService(node_a)
            bandwidth.BandwidthService(FakeNode(b))           # b serves the probe
            runner = asyncio.create_task(service_a.run())
            await asyncio.sleep(0.2)
            assert service_a.meter.rate("up") is None         # not asked to probe yet
            service_a.start_probing()
            await asyncio.sleep(0.2)                           # no peer connected: nothing measured
            assert service_a.meter.rate("up") is None
            a.peerbook.add_addrs(b.peer_id, b.listen_addrs)
            await a.ping(b.peer_id)                            # now connected
            deadline = asyncio.get_running_loop().time() + 10
            while service_a.meter.link_mbps() is None:
                assert asyncio.get_running_loop().time() < deadline, service_a.status()
                await asyncio.sleep(0.05)
            runner.cancel()
            return node_a.sections["bandwidth"]()
        finally:
            await a.stop()
            await b.stop()

    status = asyncio.run(scenario())
    assert status["probing"] and status["upload_mbps"] > 0 and status["download_mbps"] > 0
    assert status["median_latency_ms"] > 0


def test_measure_peers_keeps_each_peers_upload_and_waits_out_a_busy_peer(monkeypatch):
    """What a worker reports for its co-workers in commit_result (ADR 0219): each connected peer's upload as
    this node's probe saw it; a peer busy with another asker's probe is retried; an unconnected one and
    one that cannot be measured within the budget are left out, and the call returns within it."""
    class FakeNode:
        def __init__(self, host):
            self.host, self.status = host, types.SimpleNamespace(add_section=lambda name, fn: None)
            self.dashboard = types.SimpleNamespace(sections={})

    async def scenario():
        hosts = [Host(Identity.generate()) for _ in range(4)]
        for host in hosts:
            await host.start()
        try:
            me, busy, quiet, stranger = hosts
            services = [bandwidth.BandwidthService(FakeNode(host)) for host in hosts]
            for peer in (busy, quiet):
                me.peerbook.add_addrs(peer.peer_id, peer.listen_addrs)
                await me.ping(peer.peer_id)
            services[1].admission.busy = True                        # busy with someone else's probe...
            asyncio.get_running_loop().call_later(0.5, services[1].admission.done)   # ...for half a second
            started = asyncio.get_running_loop().time()
            measured = await services[0].measure_peers([busy.peer_id, quiet.peer_id, stranger.peer_id], budget_s=10)
            elapsed = asyncio.get_running_loop().time() - started
            again = await services[0].measure_peers([busy.peer_id])   # fresh: no second probe
            services[2].admission.busy = True                        # never free again
            services[0].peer_uploads.clear()
            started = asyncio.get_running_loop().time()
            starved = await services[0].measure_peers([quiet.peer_id], budget_s=1.0)
            return measured, elapsed, again, starved, asyncio.get_running_loop().time() - started, hosts
        finally:
            for host in hosts:
                await host.stop()

    measured, elapsed, again, starved, starved_s, hosts = asyncio.run(scenario())
    assert set(measured) == {hosts[1].peer_id, hosts[2].peer_id} and all(v > 1 for v in measured.values())
    assert 0.4 < elapsed < 10 and again == {hosts[1].peer_id: measured[hosts[1].peer_id]}
    assert starved == {} and starved_s < 5   # its 1 s budget, not the probe attempts one after another


def test_a_commit_waits_at_most_a_second_for_co_worker_probes(monkeypatch):
    """The probes a worker starts while training (ADR 0219) never hold its commit back past their budget:
    probing still running after it (or after RATES_WAIT_S once it is spent) is cancelled, and the commit
    reports the co-workers measured so far; a failed probing task does not fail the commit either."""
    from ml.compute import training

    monkeypatch.setattr(training, "RATES_WAIT_S", 0.2)

    class Service:
        def __init__(self):
            self.peer_uploads = {}

        def uploads_of(self, peers):
            return {peer: self.peer_uploads[peer] for peer in peers if peer in self.peer_uploads}

    service = Service()
    worker = types.SimpleNamespace(membership=types.SimpleNamespace(bandwidth_service=lambda: service))

    async def scenario():
        async def probing(delay, fail=False):
            service.peer_uploads["p"] = 400.7        # the first co-worker measured at once...
            await asyncio.sleep(delay)               # ...the second one never in time
            if fail:
                raise RuntimeError("probe broke")
            service.peer_uploads["q"] = 0.5          # under 1 Mbit/s: not reported

        loop = asyncio.get_running_loop()
        got = []
        started = loop.time()
        for delay, fail in ((0, False), (30, False), (0, True)):
            task = asyncio.ensure_future(probing(delay, fail))
            got.append(await training.Training._co_worker_uploads(worker, task, ["p", "q", "r"], started - 100))
            await asyncio.sleep(0)
            got.append(task.cancelled())
        return got, loop.time() - started

    got, elapsed = asyncio.run(scenario())
    reported = {"peer_rates": {"p": 400}}
    assert got == [reported, False, reported, True, reported, False]
    assert elapsed < 10   # not the 30 s probe


def test_a_job_shorter_than_the_probing_waits_for_it_within_its_budget(monkeypatch):
    """A job that trains faster than its probes finish (a few seconds of work) still reports its co-workers:
    the commit waits for the probing until MEASURE_BUDGET_S from its start, not longer."""
    from ml.compute import training

    monkeypatch.setattr(training, "MEASURE_BUDGET_S", 0.6)
    service = types.SimpleNamespace(peer_uploads={})
    service.uploads_of = lambda peers: {p: service.peer_uploads[p] for p in peers if p in service.peer_uploads}
    worker = types.SimpleNamespace(membership=types.SimpleNamespace(bandwidth_service=lambda: service))

    async def scenario():
        async def probing(delay):
            await asyncio.sleep(delay)
            service.peer_uploads["p"] = 300.0

        loop = asyncio.get_running_loop()
        started = time.monotonic()
        in_budget = await training.Training._co_worker_uploads(worker, asyncio.ensure_future(probing(0.4)), ["p"],
                                                               started)
        service.peer_uploads.clear()
        started, begun = time.monotonic(), loop.time()
        late = await training.Training._co_worker_uploads(worker, asyncio.ensure_future(probing(5)), ["p"], started)
        return in_budget, late, loop.time() - begun

    in_budget, late, waited = asyncio.run(scenario())
    assert in_budget == {"peer_rates": {"p": 300}} and late == {}
    assert 0.5 < waited < 2      # the rest of the budget (RATES_WAIT_S once it is spent), not the probe's 5 s


def test_a_probe_in_flight_is_shared_not_asked_twice(monkeypatch):
    """The periodic probe and a worker's co-worker probes of the same peer meet: the second asker awaits the
    first probe instead of being refused by the peer (it admits one probe per asker per cooldown)."""
    class FakeNode:
        def __init__(self, host):
            self.host, self.status = host, types.SimpleNamespace(add_section=lambda name, fn: None)
            self.dashboard = types.SimpleNamespace(sections={})

    async def scenario():
        me, peer = Host(Identity.generate()), Host(Identity.generate())
        await me.start()
        await peer.start()
        try:
            mine, theirs = bandwidth.BandwidthService(FakeNode(me)), bandwidth.BandwidthService(FakeNode(peer))
            me.peerbook.add_addrs(peer.peer_id, peer.listen_addrs)
            await me.ping(peer.peer_id)
            periodic = asyncio.ensure_future(mine.probe_peers([peer.peer_id]))
            for _ in range(1000):                     # its ping answered, its probe under way
                if mine._probing_now:
                    break
                await asyncio.sleep(0.001)
            measured = await mine.measure_peers([peer.peer_id], budget_s=5)
            return await periodic, measured, theirs.admission._last, mine._probing_now, peer.peer_id
        finally:
            await me.stop()
            await peer.stop()

    periodic_ok, measured, admitted, in_flight, peer_id = asyncio.run(scenario())
    assert periodic_ok and set(measured) == {peer_id} and measured[peer_id] > 1
    assert len(admitted) == 1 and in_flight == {}     # one probe served, none left running
