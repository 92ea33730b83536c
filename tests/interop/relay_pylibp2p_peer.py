"""A py-libp2p 0.8.1 (trio) peer for the circuit relay interop tests and bench/relay.py.

Run as a subprocess; prints ``ADDR <multiaddr>`` once listening, then mode-specific lines.
Modes:
  relay                         a py-libp2p circuit v2 relay (hop) with a large data cap (its
                                ``data=0`` means "no bytes", not "no limit"); serves until stdin closes
  target RELAY_MADDR            reserve on RELAY_MADDR, print ``RESERVED <circuit addr>``, serve
                                echo/sink through it until stdin closes
  dial CIRCUIT_MADDR ECHO_MIB   dial through the relay named in CIRCUIT_MADDR, echo ECHO_MIB MiB
                                (sha256 checked); print JSON
  send CIRCUIT_MADDR MIB        dial through the relay and send MIB MiB on the sink protocol; print JSON
                                with MBps
"""
from __future__ import annotations

import json
import sys
import time

import multiaddr
import trio
from libp2p import new_host
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from libp2p.peer.peerinfo import PeerInfo, info_from_p2p_addr
from libp2p.relay.circuit_v2.config import RelayConfig, RelayRole
from libp2p.relay.circuit_v2.protocol import PROTOCOL_ID as HOP_PROTOCOL
from libp2p.relay.circuit_v2.protocol import CircuitV2Protocol
from libp2p.relay.circuit_v2.resources import RelayLimits
from libp2p.relay.circuit_v2.transport import CircuitV2Transport
from libp2p.tools.anyio_service import background_trio_service
from pylibp2p_peer import CHUNK, ECHO, SINK, echo_handler, echo_round, emit, read_some, sink_handler

BIG_LIMITS = RelayLimits(duration=24 * 3600, data=1 << 40, max_circuit_conns=64, max_reservations=64)


def split_circuit(maddr: str) -> tuple[PeerInfo, ID]:
    relay_part, _, target = maddr.partition("/p2p-circuit/p2p/")
    return info_from_p2p_addr(multiaddr.Multiaddr(relay_part)), ID.from_base58(target)


async def run(mode: str, args: list[str]) -> None:
    host = new_host(key_pair=create_new_key_pair())
    host.set_stream_handler(ECHO, echo_handler)
    host.set_stream_handler(SINK, sink_handler)
    protocol = CircuitV2Protocol(host, limits=BIG_LIMITS, allow_hop=(mode == "relay"))
    roles = RelayRole.HOP | RelayRole.STOP if mode == "relay" else RelayRole.STOP | RelayRole.CLIENT
    config = RelayConfig(roles=roles, limits=BIG_LIMITS)
    async with host.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]):
        async with background_trio_service(protocol):
            await protocol.event_started.wait()
            transport = CircuitV2Transport(host, protocol, config)
            addr = next(str(a) for a in host.get_addrs() if "/tcp/" in str(a))
            if "/p2p/" not in addr:
                addr = f"{addr}/p2p/{host.get_id()}"
            print(f"ADDR {addr}", flush=True)
            if mode == "relay":
                await trio.to_thread.run_sync(sys.stdin.read)
            elif mode == "target":
                relay = info_from_p2p_addr(multiaddr.Multiaddr(args[0]))
                await host.connect(relay)
                stream = await host.new_stream(relay.peer_id, [HOP_PROTOCOL])
                async with trio.open_nursery() as nursery:
                    ok = await transport.reserve(stream, relay.peer_id, nursery)
                    print(f"RESERVED {ok} {args[0]}/p2p-circuit/p2p/{host.get_id()}", flush=True)
                    await trio.to_thread.run_sync(sys.stdin.read)
                    nursery.cancel_scope.cancel()
            else:
                relay, target = split_circuit(args[0])
                await host.connect(relay)
                await transport.dial(multiaddr.Multiaddr(args[0]))
                if mode == "dial":
                    stream = await host.new_stream(target, [ECHO])
                    emit({"connected": str(target), **await echo_round(stream, int(args[1]))})
                else:
                    mib = int(args[1])
                    stream = await host.new_stream(target, [SINK])
                    payload = bytes(CHUNK)
                    start = time.perf_counter()
                    for _ in range(mib):
                        await stream.write(payload)
                    await stream.close_write()
                    reply = b""
                    while True:
                        data = await read_some(stream)
                        if not data:
                            break
                        reply += data
                    emit({"MBps": mib * CHUNK / (time.perf_counter() - start) / 1e6, "reply": json.loads(reply)})


if __name__ == "__main__":
    trio.run(run, sys.argv[1], sys.argv[2:])
