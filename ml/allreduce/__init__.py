"""Compressed, fault-tolerant all-reduce (mean) of float32 tensors among an agreed group of peers.

    group = AllReduceGroup(transport, my_id, peers, mode="butterfly", codec="int8")
    await group.start()
    result = await group.allreduce(tensors, round_id)   # -> AllReduceResult
    result = await group.allgather_mean(encoded, codec, shapes, round_id)  # top-k/sign: caller encodes

`PowerSGDAllReduce(fp32_group, shapes, rank)` averages low-rank factors instead.
`transport` is anything with `open_stream(peer, protocol)` and `set_handler(protocol, handler)`
(see transport.py): `TcpTransport` (plain, unauthenticated TCP) for tests and the benchmark's
`--transport tcp`; in the product `ml.compute.host_transport.HostTransport(host)` over the node's
Host (noise + yamux, dedicated bulk connections).
"""
from .deadlines import DeadlinePolicy
from .group import PROTOCOL, AllReduceError, AllReduceGroup, AllReduceResult, ExcludedFromRound
from .powersgd import PowerSGDAllReduce
from .transport import Stream, TcpTransport, Transport, TransportError

__all__ = [
    "PROTOCOL",
    "AllReduceError",
    "AllReduceGroup",
    "AllReduceResult",
    "DeadlinePolicy",
    "ExcludedFromRound",
    "PowerSGDAllReduce",
    "Stream",
    "TcpTransport",
    "Transport",
    "TransportError",
]
