"""Relay bytes per task counted at the worker (ADR 0223, issue 25 item 4): the bulk circuits the
all-reduce transport opens are counted per relay over a task's span, from the circuit's own byte
count (what the relay charges for that circuit), and turned into commit_result's ``relay_bytes``."""
import asyncio

from consensus.tx import MAX_RELAYED_BYTES, MAX_TASK_RELAYS
from ml.compute.host_transport import HostTransport
from ml.compute.relay_meter import RelayMeter, commit_report
from tests.relay.relay_harness import SINK_PROTOCOL, Sink, pattern, start_endpoint, start_relay, stop_all

MIB = 1 << 20


class FakePipe:
    def __init__(self, relay: str) -> None:
        self.relay_peer, self.bytes_total, self.is_closed = relay, 0, False


class FakeConn:
    def __init__(self, pipe=None, relayed=True) -> None:
        self.relayed = relayed
        self.secure = type("Secure", (), {"tcp": pipe if pipe is not None else object()})()


def test_a_span_counts_only_its_own_bytes_per_relay_closed_circuits_included():
    meter = RelayMeter()
    old, direct = FakePipe("R1"), FakeConn(relayed=False)
    meter.opened(FakeConn(old))
    meter.opened(direct)                       # a direct bulk connection is not counted
    old.bytes_total = 1_000                    # carried before the task: not the task's
    meter.start("t")
    old.bytes_total = 1_500
    new = FakePipe("R2")
    meter.opened(FakeConn(new))
    new.bytes_total = 700
    new.is_closed = True                       # closed mid-task (replaced by a direct one): still counted
    again = FakePipe("R1")
    meter.opened(FakeConn(again))
    again.bytes_total = 40
    assert meter.take("t") == {"R1": 540, "R2": 700}
    meter.start("u")                           # the next task: the closed circuit is gone, the rest starts over
    old.bytes_total += 5
    assert meter.take("u") == {"R1": 5}
    assert meter.take("never started") == {"R1": 1_545}   # no mark: the whole count of the kept circuits


def test_commit_report_keeps_registered_relays_the_largest_and_bounded():
    counted = {f"R{i:02d}": 100 + i for i in range(MAX_TASK_RELAYS + 3)}
    counted["big"] = MAX_RELAYED_BYTES + 5
    registered = set(counted) - {"R00"}
    report = commit_report(counted, registered)
    assert len(report) == MAX_TASK_RELAYS and "R00" not in report
    assert report["big"] == MAX_RELAYED_BYTES
    assert min(report.values()) == 100 + 4     # the smallest ones left out
    assert commit_report({"R": 5}, set()) == {}


def test_host_transport_counts_a_relayed_bulk_circuit_as_the_relay_does():
    """Real path: A's all-reduce transport reaches NAT'd B only through a relay; A's meter shows, for
    that relay, the bytes the relay forwarded on the circuit (both ways), at least the payload."""
    async def main():
        a, b = await start_endpoint(chain_id="test-chain"), await start_endpoint(chain_id="test-chain")
        relay = await start_relay({a.host.peer_id, b.host.peer_id}, chain_id="test-chain")
        transport = HostTransport(a.host)
        try:
            await b.reserve(relay.host.listen_addrs[0])
            sink = Sink()
            b.host.set_handler(SINK_PROTOCOL, sink)
            a.host.register_circuit_dialer(lambda maddr, bulk: a.dial([str(maddr)], bulk=bulk))
            a.host.peerbook.add_addrs(b.host.peer_id, b.relayed_addrs)
            transport.relay_meter.start("task")
            data = pattern(3 * MIB)
            stream = await transport.open_stream(b.host.peer_id, SINK_PROTOCOL)
            await stream.write(data)
            await stream.close()
            while await stream.read():
                pass
            [circuit] = relay.circuits
            for _ in range(200):
                if circuit.src_to_dst + circuit.dst_to_src == a.pipe_for(stream.connection).bytes_total:
                    break
                await asyncio.sleep(0.02)
            counted = transport.relay_meter.take("task")
            return counted, circuit.src_to_dst + circuit.dst_to_src, relay.host.peer_id, sink.received
        finally:
            await transport.close()
            await stop_all(relay, a, b)

    counted, relayed, relay_id, received = asyncio.run(asyncio.wait_for(main(), 60))
    assert received == 3 * MIB
    assert counted == {relay_id: relayed}
    assert relayed > 3 * MIB
